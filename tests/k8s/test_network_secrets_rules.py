"""k8s_policy.network and k8s_policy.secrets: NetworkPolicy ingress per port, admission's egress, the trusted
proxies, and the Secret keys each workload reads, each rule fed a manifest that breaks it."""

from __future__ import annotations

from k8s_manifests import NETWORK, Objects, find, run
from k8s_policy.network import check_egress_ranges, check_network_policies, check_trusted_proxies
from k8s_policy.secrets import check_secret_keys


def test_the_base_is_clean(deployed: Objects) -> None:
    for rule in (check_network_policies, check_egress_ranges, check_secret_keys, check_trusted_proxies):
        assert run(rule, deployed, network=NETWORK, deployable=True) == [], rule.__name__


def test_grpc_admits_only_its_callers(objects: Objects) -> None:
    rule = find(objects, "NetworkPolicy", "dispatch")["spec"]["ingress"]
    rule.append(
        {
            "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "oai-front"}}}],
            "ports": [{"port": 7202}],
        }
    )
    errors = run(check_network_policies, objects)
    assert "Deployment/dispatch: port grpc (7202) admits oai-front, which does not call it" in errors


def test_open_rules_and_unselected_deployments(objects: Objects) -> None:
    find(objects, "NetworkPolicy", "submit")["spec"]["ingress"].append({"ports": [{"port": "http"}]})
    objects.remove(find(objects, "NetworkPolicy", "janitor"))
    errors = run(check_network_policies, objects)
    assert any("an ingress rule without `from` admits every source" in e for e in errors)
    assert "Deployment/janitor: no NetworkPolicy restricts its ingress" in errors


def test_a_missing_caller_is_caught(objects: Objects) -> None:
    policy = find(objects, "NetworkPolicy", "admission")["spec"]
    policy["ingress"][0]["from"] = policy["ingress"][0]["from"][:1]  # the ingress controller only
    errors = run(check_network_policies, objects)
    assert "Deployment/admission: port http (7101) does not admit oai-front, which calls it" in errors


def test_admission_egress_never_reaches_private_or_cluster_ranges(objects: Objects) -> None:
    egress = find(objects, "NetworkPolicy", "admission")["spec"]["egress"]
    internet = next(r for r in egress if any("ipBlock" in p for p in r.get("to", [])))
    internet["to"][0]["ipBlock"]["except"].remove("169.254.0.0/16")
    internet["ports"].append({"port": 22, "protocol": "TCP"})
    errors = run(check_egress_ranges, objects, network=NETWORK)
    assert any("reaches 169.254.0.0/16 (add it to `except`)" in e for e in errors)
    assert any("on ports [22, 80, 443]: only [80, 443]" in e for e in errors)
    errors = run(check_egress_ranges, objects, network={"clusterCIDRs": ["1.2.3.0/24"]})
    assert any("reaches 1.2.3.0/24" in e for e in errors)


def test_admission_egress_must_reach_what_it_calls(objects: Objects) -> None:
    egress = find(objects, "NetworkPolicy", "admission")["spec"]["egress"]
    egress[:] = [
        r
        for r in egress
        if r["to"][0].get("podSelector", {}).get("matchLabels") != {"app.kubernetes.io/name": "submit"}
    ]
    errors = run(check_egress_ranges, objects, network=NETWORK)
    assert "Deployment/admission: its egress does not reach submit:grpc, which it needs" in errors


def test_trusted_proxies(deployed: Objects) -> None:
    find(deployed, "ConfigMap", "horde-config")["data"]["HORDE_FORWARDED_ALLOW_IPS"] = "*"
    errors = run(check_trusted_proxies, deployed, network=NETWORK, deployable=True)
    assert (
        "Deployment/admission: HORDE_FORWARDED_ALLOW_IPS=*: any client could name its own address" in errors
    )
    find(deployed, "ConfigMap", "horde-config")["data"]["HORDE_FORWARDED_ALLOW_IPS"] = "192.168.0.0/24"
    errors = run(check_trusted_proxies, deployed, network=NETWORK, deployable=True)
    assert (
        "Deployment/dispatch: HORDE_FORWARDED_ALLOW_IPS: 192.168.0.0/24 is outside trustedProxyCIDRs"
        in errors
    )


def test_each_workload_reads_only_its_secret_keys(deployed: Objects) -> None:
    env = find(deployed, "Deployment", "submit")["spec"]["template"]["spec"]["containers"][0]["env"]
    env.append(
        {
            "name": "HORDE_OAI_PROXY_PASSKEY",
            "valueFrom": {"secretKeyRef": {"name": "horde-secrets", "key": "HORDE_OAI_PROXY_PASSKEY"}},
        }
    )
    front = find(deployed, "Deployment", "oai-front")["spec"]["template"]["spec"]["containers"][0]
    front["env"] = [e for e in front["env"] if e["name"] != "HORDE_OAI_PROXY_PASSKEY"]
    front["envFrom"].append({"secretRef": {"name": "horde-secrets"}})
    errors = run(check_secret_keys, deployed)
    assert "Deployment/submit: reads Secret key HORDE_OAI_PROXY_PASSKEY, which it does not use" in errors
    assert any("envFrom Secret horde-secrets gives it every key" in e for e in errors)
    assert "Deployment/oai-front: HORDE_OAI_PROXY_PASSKEY must come from a Secret (secretKeyRef)" in errors


def test_passkeys_stay_in_the_secret_and_agree(deployed: Objects) -> None:
    import base64

    find(deployed, "ConfigMap", "horde-config")["data"]["HORDE_PROXY_PASSKEYS"] = "[]"
    find(deployed, "Secret", "horde-secrets")["data"]["HORDE_OAI_PROXY_PASSKEY"] = base64.b64encode(
        b"other"
    ).decode()
    errors = run(check_secret_keys, deployed)
    assert "ConfigMap/horde-config: holds HORDE_PROXY_PASSKEYS, a secret: keep it in the Secret" in errors
    assert "Secret/horde-secrets: HORDE_OAI_PROXY_PASSKEY is not in HORDE_PROXY_PASSKEYS" in errors
