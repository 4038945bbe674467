"""k8s_policy.balancing: gRPC targets are dns:/// names of headless Services that serve the right pods on the
same port, and every gRPC caller receives its targets; each rule fed a manifest that breaks it."""

from __future__ import annotations

from k8s_manifests import Objects, find, run
from k8s_policy.balancing import check_grpc_targets


def _config(objects: Objects) -> dict[str, str]:
    data: dict[str, str] = find(objects, "ConfigMap", "horde-config")["data"]
    return data


def test_the_base_is_clean(objects: Objects, deployed: Objects) -> None:
    assert _config(objects)["HORDE_DISPATCH_GRPC_TARGET"] == "dns:///dispatch-grpc:7202"
    assert _config(objects)["HORDE_SUBMIT_GRPC_TARGET"] == "dns:///submit-grpc:7203"
    assert find(objects, "Service", "dispatch-grpc")["spec"]["clusterIP"] == "None"
    assert run(check_grpc_targets, objects) == []
    assert run(check_grpc_targets, deployed, deployable=True) == []


def test_a_plain_host_port_target_is_refused(objects: Objects) -> None:
    _config(objects)["HORDE_DISPATCH_GRPC_TARGET"] = "dispatch:7202"
    assert run(check_grpc_targets, objects) == [
        "ConfigMap/horde-config: HORDE_DISPATCH_GRPC_TARGET=dispatch:7202: must be dns:///<headless Service>:"
        "<port> (round_robin over every pod's address; host:port resolves to one address)"
    ]


def test_a_clusterip_service_is_refused(objects: Objects) -> None:
    _config(objects)["HORDE_SUBMIT_GRPC_TARGET"] = "dns:///submit:7203"
    assert run(check_grpc_targets, objects) == [
        "ConfigMap/horde-config: HORDE_SUBMIT_GRPC_TARGET=dns:///submit:7203: Service submit is not headless "
        "(clusterIP: None): its one virtual IP pins each gRPC client to one pod"
    ]


def test_port_selector_and_namespace_must_match(objects: Objects) -> None:
    _config(objects)["HORDE_DISPATCH_GRPC_TARGET"] = "dns:///dispatch-grpc.other.svc.cluster.local:7203"
    _config(objects)["HORDE_SUBMIT_GRPC_TARGET"] = "dns:///nothing:7203"
    errors = run(check_grpc_targets, objects)
    assert any("Service dispatch-grpc is in namespace horde, not other" in e for e in errors)
    assert any("Service dispatch-grpc has no port 7203" in e for e in errors)
    assert any("HORDE_SUBMIT_GRPC_TARGET=dns:///nothing:7203: no Service 'nothing'" in e for e in errors)

    _config(objects)["HORDE_DISPATCH_GRPC_TARGET"] = "dns:///dispatch-grpc.horde.svc:7202"
    _config(objects)["HORDE_SUBMIT_GRPC_TARGET"] = "dns:///submit-grpc:7203"
    assert run(check_grpc_targets, objects) == []
    find(objects, "Service", "submit-grpc")["spec"]["selector"] = {"app.kubernetes.io/name": "dispatch"}
    svc = find(objects, "Service", "dispatch-grpc")
    svc["spec"]["ports"][0]["targetPort"] = "http"
    assert run(check_grpc_targets, objects) == [
        "ConfigMap/horde-config: HORDE_DISPATCH_GRPC_TARGET=dns:///dispatch-grpc.horde.svc:7202: Service "
        "dispatch-grpc port 7202 targets container port 7102 of Deployment/dispatch; a headless Service is "
        "dialled at the pod's own port, so they must be equal",
        "ConfigMap/horde-config: HORDE_SUBMIT_GRPC_TARGET=dns:///submit-grpc:7203: Service submit-grpc does not "
        "select Deployment/submit",
    ]


def test_every_caller_receives_its_targets(deployed: Objects) -> None:
    del _config(deployed)["HORDE_SUBMIT_GRPC_TARGET"]
    assert run(check_grpc_targets, deployed, deployable=True) == [
        "Deployment/admission: calls submit over gRPC but HORDE_SUBMIT_GRPC_TARGET is unset (it would dial "
        "127.0.0.1)",
        "Deployment/janitor: calls submit over gRPC but HORDE_SUBMIT_GRPC_TARGET is unset (it would dial "
        "127.0.0.1)",
    ]
