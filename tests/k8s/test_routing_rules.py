"""k8s_policy.routing: the rendered Ingress paths equal the one routing table (horde_testing.routes, which the
local proxy of make run is generated from); each drift fed to the rule is caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from horde_testing import routes
from k8s_manifests import Objects, find, run
from k8s_policy.contract import EXPECTED_ROUTES
from k8s_policy.routing import TABLE_FILE, check_routing_table, load_table, table_rows

TABLE = "libs/horde-testing/src/horde_testing/routes.py"


def _paths(objects: Objects) -> list[dict[str, Any]]:
    paths: list[dict[str, Any]] = find(objects, "Ingress", "horde")["spec"]["rules"][0]["http"]["paths"]
    return paths


def _path(objects: Objects, path: str) -> dict[str, Any]:
    return next(p for p in _paths(objects) if p["path"] == path)


def test_the_base_and_the_deployed_ingress_match_the_table(objects: Objects, deployed: Objects) -> None:
    assert run(check_routing_table, objects) == []
    assert run(check_routing_table, deployed, deployable=True) == []


def test_the_rule_reads_the_workspace_table() -> None:
    """The file the rule loads is the module the local proxy is generated from."""
    assert TABLE_FILE.resolve() == Path(routes.__file__).resolve()
    assert table_rows() == [(r.path, r.match, r.service) for r in routes.ROUTES]
    assert load_table() is load_table()


def test_the_table_routes_the_ingress_contract() -> None:
    """The table's own rules send each contract path (check_routes') to its Service."""
    for request, service in EXPECTED_ROUTES.items():
        route = routes.route_for(request)
        assert route is not None and route.service == service, request


def test_a_changed_backend_is_caught(objects: Objects) -> None:
    _path(objects, "/api/v2/workers")["backend"]["service"]["name"] = "admission"
    assert run(check_routing_table, objects) == [
        f"Ingress/horde: host horde.example.com: /api/v2/workers (Prefix) -> dispatch is in {TABLE} but not in the Ingress",
        f"Ingress/horde: host horde.example.com: /api/v2/workers (Prefix) -> admission is in the Ingress but not in {TABLE}",
    ]


def test_a_missing_path_is_caught(objects: Objects) -> None:
    _paths(objects).remove(_path(objects, "/api/v2/generate/text/progress"))
    assert run(check_routing_table, objects) == [
        f"Ingress/horde: host horde.example.com: /api/v2/generate/text/progress (Prefix) -> submit is in {TABLE} "
        "but not in the Ingress"
    ]


@pytest.mark.parametrize(
    ("path", "change", "drifted"),
    [
        ("/redoc", {"pathType": "Prefix"}, "/redoc (Prefix) -> oai-front"),
        ("/docs", {"pathType": "ImplementationSpecific"}, "/docs (ImplementationSpecific) -> oai-front"),
        ("/api", {"path": "/api/"}, "/api/ (Prefix) -> admission"),
        ("/v1", {"path": "/V1"}, "/V1 (Prefix) -> oai-front"),
    ],
)
def test_a_changed_path_or_type_is_caught(
    objects: Objects, path: str, change: dict[str, str], drifted: str
) -> None:
    _path(objects, path).update(change)
    errors = run(check_routing_table, objects)
    assert len(errors) == 2, errors
    assert errors[0].endswith(f"is in {TABLE} but not in the Ingress") and f": {path} (" in errors[0]
    assert (
        errors[1] == f"Ingress/horde: host horde.example.com: {drifted} is in the Ingress but not in {TABLE}"
    )


def test_an_extra_duplicate_or_default_route_is_caught(objects: Objects) -> None:
    ingress = find(objects, "Ingress", "horde")
    extra = {
        "path": "/metrics",
        "pathType": "Prefix",
        "backend": {"service": {"name": "janitor", "port": {"name": "http"}}},
    }
    _paths(objects).append(extra)
    _paths(objects).append(dict(_path(objects, "/v1")))
    ingress["spec"]["defaultBackend"] = {"service": {"name": "admission", "port": {"name": "http"}}}
    assert run(check_routing_table, objects) == [
        f"Ingress/horde: has a defaultBackend; {TABLE} routes only its own paths (the rest is 404)",
        "Ingress/horde: host horde.example.com: /v1 (Prefix) -> oai-front is listed more than once",
        f"Ingress/horde: host horde.example.com: /metrics (Prefix) -> janitor is in the Ingress but not in {TABLE}",
    ]


def test_every_host_is_checked(objects: Objects) -> None:
    ingress = find(objects, "Ingress", "horde")
    second = {"host": "other.example.com", "http": {"paths": _paths(objects)[:1]}}
    ingress["spec"]["rules"].append(second)
    errors = run(check_routing_table, objects)
    assert len(errors) == len(routes.ROUTES) - 1
    assert all(e.startswith("Ingress/horde: host other.example.com: ") for e in errors)
