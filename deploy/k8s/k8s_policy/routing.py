"""Rule: every rendered Ingress routes exactly the paths of the one routing table, the table the local reverse
proxy of ``make run`` (Caddy on :7000) is generated from, so the two cannot drift: each host's paths, as
(path, pathType, Service), equal the table's rows, no path is listed twice, and there is no default backend
(the table routes nothing else: an unmatched path is 404 on both).

The table is ``libs/horde-testing/src/horde_testing/routes.py``: data and the standard library only, loaded
here by file path, since ``make k8s-check`` runs outside the workspace.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from .contract import REPO
from .model import Target, ident

#: The routing table's module.
TABLE_FILE = REPO / "libs" / "horde-testing" / "src" / "horde_testing" / "routes.py"

Row = tuple[str, str, str | None]  # path, pathType, Service (None: a backend without one)


def load_table(path: Path = TABLE_FILE) -> ModuleType:
    """The routing table module at ``path``, imported by file path (the workspace is not installed here)."""
    name = "horde_testing_routes_table"
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the routing table {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def table_rows() -> list[Row]:
    """The routing table's rows as (path, pathType, Service)."""
    return [(r.path, r.match, r.service) for r in load_table().ROUTES]


def _ingress_rows(rule: dict[str, Any]) -> list[Row]:
    return [
        (
            p.get("path", ""),
            p.get("pathType", ""),
            ((p.get("backend") or {}).get("service") or {}).get("name"),
        )
        for p in (rule.get("http") or {}).get("paths") or []
    ]


def _fmt(row: Row) -> str:
    return f"{row[0]} ({row[1]}) -> {row[2]}"


def check_routing_table(target: Target) -> None:
    """Each rendered Ingress host routes exactly the routing table's paths (see the module docstring)."""
    table = table_rows()
    where_table = TABLE_FILE.relative_to(REPO)
    for ing in (o for o in target.objects if o.get("kind") == "Ingress"):
        where = ident(ing)
        spec = ing.get("spec") or {}
        if spec.get("defaultBackend"):
            target.error(
                where, f"has a defaultBackend; {where_table} routes only its own paths (the rest is 404)"
            )
        for rule in spec.get("rules") or []:
            host = f"host {rule.get('host') or '*'}: "
            rows = _ingress_rows(rule)
            for row in sorted({r for r in rows if rows.count(r) > 1}, key=str):
                target.error(where, f"{host}{_fmt(row)} is listed more than once")
            for row in sorted(set(table) - set(rows), key=str):
                target.error(where, f"{host}{_fmt(row)} is in {where_table} but not in the Ingress")
            for row in sorted(set(rows) - set(table), key=str):
                target.error(where, f"{host}{_fmt(row)} is in the Ingress but not in {where_table}")
