"""k8s_policy.objects: names and labels, one namespace, pod security and resources, probes, selectors and the
endpoint settings, each rule fed a manifest that breaks it."""

from __future__ import annotations

from typing import Any

from k8s_manifests import Objects, find, run
from k8s_policy.objects import check_config, check_names, check_namespaces, check_pods, check_selectors


def _container(objects: Objects, name: str = "admission") -> dict[str, Any]:
    container: dict[str, Any] = find(objects, "Deployment", name)["spec"]["template"]["spec"]["containers"][0]
    return container


def test_the_base_is_clean(objects: Objects) -> None:
    for rule in (check_names, check_namespaces, check_pods, check_selectors, check_config):
        assert run(rule, objects) == [], rule.__name__


def test_names_labels_and_port_names(objects: Objects) -> None:
    find(objects, "Service", "dispatch")["metadata"]["name"] = "Dispatch_1"
    find(objects, "Deployment", "submit")["metadata"]["labels"]["app.kubernetes.io/name"] = "-bad-"
    _container(objects)["ports"][0]["name"] = "a-very-long-port-name"
    objects.append(dict(find(objects, "ConfigMap", "horde-config")))
    errors = run(check_names, objects)
    assert "Service/Dispatch_1: name 'Dispatch_1' is not a DNS-1035 label" in errors
    assert any("label app.kubernetes.io/name='-bad-': invalid value" in e for e in errors)
    assert any("port name 'a-very-long-port-name' is not an IANA service name" in e for e in errors)
    assert "ConfigMap/horde-config: rendered twice" in errors


def test_one_namespace_and_overlays_set_it(objects: Objects) -> None:
    find(objects, "Service", "submit")["metadata"]["namespace"] = "other"
    assert any("several namespaces" in e for e in run(check_namespaces, objects))
    for obj in objects:
        obj["metadata"].pop("namespace")
    assert run(check_namespaces, objects, deployable=True) == [
        "namespace: an overlay must set `namespace:` (Service names are fixed: see base)"
    ]


def test_pod_security(objects: Objects) -> None:
    c = _container(objects)
    c["securityContext"]["readOnlyRootFilesystem"] = False
    c["securityContext"]["allowPrivilegeEscalation"] = True
    c["securityContext"]["runAsUser"] = 0
    c["securityContext"]["capabilities"] = {"drop": []}
    find(objects, "Deployment", "admission")["spec"]["template"]["spec"]["hostNetwork"] = True
    errors = run(check_pods, objects)
    for message in (
        "readOnlyRootFilesystem must be true",
        "allowPrivilegeEscalation must be false",
        "runs as uid 0",
        "capabilities must drop ALL",
        "host namespaces are not allowed",
    ):
        assert any(message in e for e in errors), message


def test_resources_probes_and_tags(objects: Objects) -> None:
    c = _container(objects)
    c["resources"] = {"requests": {"cpu": "2", "memory": "lots"}, "limits": {"cpu": "1"}}
    c["readinessProbe"]["httpGet"]["port"] = "nope"
    del c["livenessProbe"]
    errors = run(check_pods, objects, deployable=True)
    for message in (
        "resources.limits.memory missing",
        "resources.requests.memory 'lots' is not a quantity",
        "cpu request 2 exceeds its limit 1",
        "readinessProbe port 'nope' is not a container port",
        "livenessProbe missing",
        "image 'horde-admission' needs an explicit tag other than latest (or a digest)",
    ):
        assert any(message in e for e in errors), message


def test_selectors(objects: Objects) -> None:
    find(objects, "Service", "janitor")["spec"]["selector"] = {"app.kubernetes.io/name": "nobody"}
    find(objects, "Service", "submit")["spec"]["ports"][0]["targetPort"] = "missing"
    find(objects, "PodDisruptionBudget", "dispatch")["spec"]["minAvailable"] = 1
    errors = run(check_selectors, objects)
    assert any(e.startswith("Service/janitor: selector") and "selects no pods" in e for e in errors)
    assert any("targetPort 'missing' is not a container port of Deployment/submit" in e for e in errors)
    assert any("use maxUnavailable" in e for e in errors)


def test_endpoints_and_port_settings(objects: Objects) -> None:
    data = find(objects, "ConfigMap", "horde-config")["data"]
    data["HORDE_DISPATCH_GRPC_TARGET"] = "dispatch:9999"
    data["HORDE_SUBMIT_HTTP_PORT"] = "7999"
    errors = run(check_config, objects, deployable=True)
    assert (
        "ConfigMap/horde-config: HORDE_DISPATCH_GRPC_TARGET=dispatch:9999: Service dispatch has no port 9999"
        in errors
    )
    assert any("HORDE_SUBMIT_HTTP_PORT=7999 but Deployment submit has no http port 7999" in e for e in errors)
