"""The public routing table: which service answers which path behind the one horde URL.

One table, two proxies that cannot drift from it:

* the Kubernetes Ingress (deploy/k8s/base/ingress.yaml) is checked against it by ``make k8s-check``
  (``k8s_policy.routing``: the rendered Ingress paths must equal :data:`ROUTES`);
* the local reverse proxy of ``make run`` (Caddy on :7000) is generated from it
  (:mod:`horde_testing.local_proxy`).

Matching is the Ingress's (networking.k8s.io/v1): a ``Prefix`` path matches the request path element by
element (``/api`` matches ``/api`` and ``/api/v2``, not ``/apix``), an ``Exact`` path only itself, case
sensitive; of several matches the longest path wins, and an Exact path over a Prefix path of the same
length. A path no row matches is not routed (404). :func:`route_for` is that rule, the reference both proxies
are tested against.

This module is data and the standard library only: ``make k8s-check`` loads it by file path in its own
environment, where the workspace is not installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final, Literal

MatchType = Literal["Prefix", "Exact"]


@dataclass(frozen=True)
class Route:
    """One row: requests whose path matches ``path`` (by ``match``) go to Service ``service``'s http port."""

    path: str
    match: MatchType
    service: str


#: The Kubernetes Service names the table routes to (the local proxy maps each to a local port).
SERVICES: Final = ("admission", "dispatch", "submit", "oai-front")

#: The routes (order does not matter: the longest match wins).
ROUTES: Final[tuple[Route, ...]] = (
    # Workers pop from dispatch, and dispatch answers the worker look-ups.
    Route("/api/v2/generate/text/pop", "Prefix", "dispatch"),
    Route("/api/v2/workers", "Prefix", "dispatch"),
    # Workers submit results and post progress to submit.
    Route("/api/v2/generate/text/submit", "Prefix", "submit"),
    Route("/api/v2/generate/text/progress", "Prefix", "submit"),
    # The rest of the native API: async requests, status, models (and /status/models/{name}), users, stats.
    Route("/api", "Prefix", "admission"),
    # The OpenAI-compatible front, and its documentation.
    Route("/v1", "Prefix", "oai-front"),
    Route("/docs", "Prefix", "oai-front"),
    Route("/redoc", "Exact", "oai-front"),
    Route("/openapi.json", "Exact", "oai-front"),
)

#: What a table path may hold: plain path elements (no regular-expression or proxy-config metacharacters).
PATH_SYNTAX: Final = re.compile(r"^(/[A-Za-z0-9._~-]+)+$|^/$")


def matches(route: Route, path: str) -> bool:
    """Whether request ``path`` matches ``route`` (the Ingress's Prefix and Exact rules)."""
    if route.match == "Exact":
        return path == route.path
    prefix = route.path.rstrip("/")
    return prefix == "" or path == prefix or path.startswith(prefix + "/")


def route_for(path: str, routes: tuple[Route, ...] = ROUTES) -> Route | None:
    """The row that answers request ``path`` (the longest match; Exact before Prefix), None if none does."""
    best: Route | None = None
    for route in routes:
        if matches(route, path) and (best is None or _precedence(route) > _precedence(best)):
            best = route
    return best


def by_precedence(routes: tuple[Route, ...] = ROUTES) -> list[Route]:
    """The rows in the order a first-match proxy must try them so that the first match is :func:`route_for`'s:
    longer paths first, Exact before Prefix at equal length."""
    return sorted(routes, key=_precedence, reverse=True)


def problems(routes: tuple[Route, ...] = ROUTES) -> list[str]:
    """What is wrong with a table: bad paths or match types, unknown services, a path listed twice."""
    found = []
    seen: set[tuple[str, str]] = set()
    for r in routes:
        if not PATH_SYNTAX.match(r.path):
            found.append(f"{r.path!r}: not a plain path ({PATH_SYNTAX.pattern})")
        if r.match not in ("Prefix", "Exact"):
            found.append(f"{r.path}: match type {r.match!r} is neither Prefix nor Exact")
        if r.service not in SERVICES:
            found.append(f"{r.path}: unknown service {r.service!r}")
        if (r.path, r.match) in seen:
            found.append(f"{r.path} ({r.match}) is listed twice")
        seen.add((r.path, r.match))
    return found


def _precedence(route: Route) -> tuple[int, int]:
    return (len(route.path.rstrip("/")), 1 if route.match == "Exact" else 0)
