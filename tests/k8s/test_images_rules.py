"""k8s_policy.images: the root Dockerfile every image is built from, the image table (deploy/k8s/images.toml)
and their agreement with the manifests, each rule fed a file or manifest that breaks it."""

from __future__ import annotations

import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest
from k8s_manifests import Objects, find
from k8s_policy.contract import REPO
from k8s_policy.images import (
    DOCKERFILE,
    IMAGE_TABLE,
    check_dockerfile,
    check_image_table,
    check_manifest_images,
    member_scripts,
    parse_dockerfile,
)
from k8s_policy.model import Target

TABLE = tomllib.loads(IMAGE_TABLE.read_text())["images"]


def _broken(tmp_path: Path, old: str, new: str) -> list[str]:
    text = DOCKERFILE.read_text()
    assert old in text
    path = tmp_path / "Dockerfile"
    path.write_text(text.replace(old, new))
    problems: list[str] = check_dockerfile(parse_dockerfile(path))
    return problems


def _target(objects: Objects) -> list[Target]:
    target = Target("test", REPO, deployable=False)
    target.objects = objects
    return [target]


def test_the_repository_is_clean(objects: Objects) -> None:
    df = parse_dockerfile(DOCKERFILE)
    assert check_dockerfile(df) == []
    assert check_image_table(TABLE) == []
    assert check_manifest_images(_target(objects), TABLE, df.user) == []
    assert member_scripts("horde-admission") is not None
    assert "horde-admin" in (member_scripts("horde-admission") or set())


def test_sources_before_the_dependency_layer(tmp_path: Path) -> None:
    errors = _broken(tmp_path, "COPY uv.lock pyproject.toml ./", "COPY . .")
    assert any("sources are copied before the dependency layer" in e for e in errors)


def test_a_member_missing_from_the_dependency_layer(tmp_path: Path) -> None:
    errors = _broken(tmp_path, "COPY worker/pyproject.toml worker/\n", "")
    assert any(
        "the dependency layer lacks worker/pyproject.toml (workspace member horde-worker)" in e
        for e in errors
    )


def test_the_first_sync_must_skip_the_workspace(tmp_path: Path) -> None:
    errors = _broken(tmp_path, " --no-install-workspace", "")
    assert any("the first `uv sync` must skip the workspace" in e for e in errors)


def test_command_ports_and_user(tmp_path: Path) -> None:
    text = DOCKERFILE.read_text()
    path = tmp_path / "Dockerfile"
    path.write_text(
        text.replace('CMD ["horde-entrypoint"]', 'CMD ["horde-admission"]')
        .replace("EXPOSE ${PORTS}", "EXPOSE 7101")
        .replace("USER 10001:10001", "USER root")
        .replace('--package "${PACKAGE}" \\\n    && ln', "--package horde-admission \\\n    && ln")
    )
    errors = check_dockerfile(parse_dockerfile(path))
    assert any("is not a link to the PACKAGE's script" in e for e in errors)
    assert any("EXPOSE must expose the PORTS build arg" in e for e in errors)
    assert any("the final stage must set a non-root USER" in e for e in errors)
    assert any('every `uv sync` must install `--package "${PACKAGE}"`' in e for e in errors)


def test_the_image_table() -> None:
    errors = check_image_table(
        {
            "horde-x": {"package": "horde-nothing", "ports": [1]},
            "horde-core": {"package": "horde-core", "ports": []},
        }
    )
    assert "images.toml horde-x: 'horde-nothing' is not a workspace member" in errors
    assert "images.toml horde-core: horde-core has no console script horde-core to run" in errors
    assert any("horde-core: `ports` must list" in e for e in errors)


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (
            lambda c: c.update(image="horde-unknown"),
            "runs image 'horde-unknown', which images.toml does not build",
        ),
        (
            lambda c: c["ports"].append({"name": "extra", "containerPort": 9}),
            "images.toml horde-dispatch: ports lack 9",
        ),
        (
            lambda c: c["securityContext"].update(runAsUser=2000),
            "Dockerfile: USER 10001:10001 but Deployment/dispatch",
        ),
        (
            lambda c: c.update(command=["horde-oai"]),
            "command 'horde-oai' is not a script in image horde-dispatch",
        ),
    ],
)
def test_manifest_images(objects: Objects, change, expected: str) -> None:  # type: ignore[no-untyped-def]
    container = find(objects, "Deployment", "dispatch")["spec"]["template"]["spec"]["containers"][0]
    container.setdefault("securityContext", {})
    change(container)
    errors = check_manifest_images(_target(objects), TABLE, parse_dockerfile(DOCKERFILE).user)
    assert any(expected in e for e in errors), errors


# The schemas come with kubernetes-validate, which only make k8s-check's environment has (mk/k8s.mk K8S_UV_RUN):
# validate there, in a subprocess, from uv's cache when it holds that environment, else fetching it once.
K8S_UV_RUN = [
    os.environ.get("UV", "uv"),
    "run",
    "--quiet",
    "--no-project",
    "--python",
    "3.11",
    "--with-requirements",
    "deploy/k8s/tools/requirements.txt",
]
VALIDATE = """
import json, sys
from pathlib import Path
from k8s_policy.model import Target
from k8s_policy.schemas import Schemas, validate_schemas
target = Target("test", Path("."), deployable=False)
target.objects = json.load(sys.stdin)
validate_schemas(target, [Schemas(sys.argv[1])])
json.dump(target.errors, sys.stdout)
"""


def _validate_in_k8s_env(objects: Objects, version: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}  # the test env's venv is not its base
    env["PYTHONPATH"] = str(REPO / "deploy" / "k8s")

    def uv_run(*args: str, offline: bool, stdin: str = "") -> subprocess.CompletedProcess[str]:
        command = [*K8S_UV_RUN, *(["--offline"] if offline else []), "python", *args]
        return subprocess.run(
            command, cwd=REPO, env=env, input=stdin, capture_output=True, text=True, timeout=240
        )

    if uv_run("-c", "", offline=True).returncode != 0:
        prepared = uv_run("-c", "", offline=False)
        assert prepared.returncode == 0, prepared.stderr
    done = uv_run("-c", VALIDATE, version, offline=True, stdin=json.dumps(objects))
    assert done.returncode == 0, done.stderr
    errors: list[str] = json.loads(done.stdout)
    return errors


def test_the_schemas_catch_unknown_fields(objects: Objects) -> None:
    assert _validate_in_k8s_env(objects, "1.30") == []
    find(objects, "Service", "janitor")["spec"]["bogus"] = 1
    errors = _validate_in_k8s_env(objects, "1.30")
    assert any(e.startswith("Service/janitor [k8s 1.30]") and "bogus" in e for e in errors), errors
