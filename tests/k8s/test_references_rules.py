"""k8s_policy.references: references resolve, the Ingress routes each contract path to its Service, every
component is rendered, each rule fed a manifest that breaks it."""

from __future__ import annotations

from pathlib import Path

from k8s_manifests import Objects, find, run
from k8s_policy.model import Target
from k8s_policy.references import check_components, check_references, check_routes


def test_the_base_is_clean(deployed: Objects) -> None:
    assert run(check_references, deployed, deployable=True) == []
    assert run(check_routes, deployed, deployable=True) == []


def test_unresolved_references(deployed: Objects) -> None:
    deployed.remove(find(deployed, "Secret", "horde-secrets"))
    find(deployed, "HorizontalPodAutoscaler", "janitor")["spec"]["scaleTargetRef"]["name"] = "gone"
    find(deployed, "Deployment", "submit")["spec"]["template"]["spec"]["serviceAccountName"] = "nobody"
    errors = run(check_references, deployed, deployable=True)
    assert any("references Secret 'horde-secrets', which is neither rendered nor listed" in e for e in errors)
    assert "HorizontalPodAutoscaler/janitor: scales Deployment/gone, which is not rendered" in errors
    assert any("references ServiceAccount 'nobody'" in e for e in errors)


def test_external_secret_keys_and_hpa_ranges(deployed: Objects) -> None:
    deployed.remove(find(deployed, "Secret", "horde-secrets"))
    external = [{"kind": "Secret", "name": "horde-secrets", "requiredKeys": ["HORDE_DATABASE_URL"]}]
    find(deployed, "HorizontalPodAutoscaler", "admission")["spec"]["minReplicas"] = 9
    errors = run(check_references, deployed, deployable=True, external=external)
    assert any(e.startswith("external-resources.yaml: horde-secrets must list") for e in errors)
    assert any("HorizontalPodAutoscaler/admission: minReplicas 9 > maxReplicas" in e for e in errors)


def test_routes(deployed: Objects) -> None:
    paths = find(deployed, "Ingress", "horde")["spec"]["rules"][0]["http"]["paths"]
    paths[:] = [p for p in paths if p["path"] != "/api/v2/generate/text/pop"]
    errors = run(check_routes, deployed, deployable=True)
    assert "Ingress: /api/v2/generate/text/pop goes to admission, expected dispatch" in errors
    deployed.remove(find(deployed, "Ingress", "horde"))
    assert run(check_routes, deployed, deployable=True) == ["Ingress: none rendered"]


def test_an_unused_component_is_caught(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\n")
    problems = check_components([Target("overlays/x", tmp_path, deployable=True)])
    assert problems == [
        "component autoscaling-queue is used by no overlay, so nothing renders it",
        "component worker is used by no overlay, so nothing renders it",
    ]
