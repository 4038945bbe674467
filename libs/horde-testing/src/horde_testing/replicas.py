"""How many processes of each service the local stack runs, and on which ports (``make run REPLICAS=N``).

One rule, read by the supervisor config generator (:mod:`horde_testing.local_stack`) and by the local proxy
(:mod:`horde_testing.local_proxy`), so the processes and the proxy's upstreams cannot disagree:

* counts: ``REPLICAS_<SERVICE>`` (``REPLICAS_ADMISSION``, ``REPLICAS_DISPATCH``, ``REPLICAS_SUBMIT``,
  ``REPLICAS_JANITOR``, ``REPLICAS_OAI``), else ``REPLICAS``, else 1; each 1 to :data:`MAX_REPLICAS`;
* ports: replica ``i`` (0-based) of a service listens on each of its base ports plus ``10·i``; a base port is
  the service's own setting (``HORDE_<X>_HTTP_PORT``, ``HORDE_<X>_GRPC_PORT``) from the environment, else
  its default in :class:`horde_core.settings.HordeSettings` (admission 7101, 7111, 7121, …; the front 7002,
  7012, …; dispatch's gRPC 7202, 7212, …). Replica 0 keeps today's ports.

Errors: :class:`ValueError` for a count that is not an integer in range or a port setting that is not one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from horde_core.settings import HordeSettings

#: The replicated services (Procfile names), each with the port settings its process reads.
SERVICE_PORTS: Final[dict[str, tuple[str, ...]]] = {
    "admission": ("HORDE_ADMISSION_HTTP_PORT",),
    "dispatch": ("HORDE_DISPATCH_HTTP_PORT", "HORDE_DISPATCH_GRPC_PORT"),
    "submit": ("HORDE_SUBMIT_HTTP_PORT", "HORDE_SUBMIT_GRPC_PORT"),
    "janitor": ("HORDE_JANITOR_HTTP_PORT",),
    "oai": ("HORDE_OAI_HTTP_PORT",),
}
#: The routing table's Service names (horde_testing.routes.SERVICES) as Procfile names.
ROUTE_SERVICE: Final[dict[str, str]] = {
    "admission": "admission",
    "dispatch": "dispatch",
    "submit": "submit",
    "oai-front": "oai",
}
#: The distance between two replicas' ports.
PORT_STEP: Final = 10
#: At most this many replicas of one service: with the default ports, the tenth dispatch replica's HTTP
#: port (7192) is still below the first gRPC port (7202).
MAX_REPLICAS: Final = 10


def default_port(setting: str) -> int:
    """The default of a ``HORDE_<X>_PORT`` setting (:class:`HordeSettings`'s field default)."""
    field = HordeSettings.model_fields[setting.removeprefix("HORDE_").lower()]
    return int(field.default)


def base_port(setting: str, env: Mapping[str, str]) -> int:
    """Replica 0's port for ``setting``: the environment's value, else the default."""
    raw = env.get(setting)
    if raw is None or raw.strip() == "":
        return default_port(setting)
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{setting}={raw!r} is not a port number") from None


def replica_count(service: str, env: Mapping[str, str]) -> int:
    """How many processes of ``service`` (a :data:`SERVICE_PORTS` name) to run."""
    if service not in SERVICE_PORTS:
        raise ValueError(f"unknown service {service!r}: one of {', '.join(SERVICE_PORTS)}")
    name = f"REPLICAS_{service.upper()}"
    raw = env.get(name) or env.get("REPLICAS") or "1"
    try:
        count = int(raw)
    except ValueError:
        raise ValueError(f"{name} / REPLICAS={raw!r} is not a number") from None
    if not 1 <= count <= MAX_REPLICAS:
        raise ValueError(f"{name} / REPLICAS={count}: a count from 1 to {MAX_REPLICAS}")
    return count


def replica_counts(env: Mapping[str, str]) -> dict[str, int]:
    """Every replicated service's count."""
    return {service: replica_count(service, env) for service in SERVICE_PORTS}


def replica_ports(service: str, index: int, env: Mapping[str, str]) -> dict[str, int]:
    """The port settings of replica ``index`` of ``service``: ``{"HORDE_<X>_HTTP_PORT": port, ...}``."""
    return {setting: base_port(setting, env) + PORT_STEP * index for setting in SERVICE_PORTS[service]}


def http_ports(service: str, env: Mapping[str, str]) -> list[int]:
    """The HTTP port of each replica of ``service``, replica 0 first."""
    count = replica_count(service, env)
    http = SERVICE_PORTS[service][0]
    return [replica_ports(service, i, env)[http] for i in range(count)]


def grpc_target(service: str, env: Mapping[str, str]) -> str:
    """gRPC target of every replica of ``service`` in grpcio's list form: ``ipv4:127.0.0.1:7202,127.0.0.1:7212``
    (a client channel balances over them: horde_core.grpc)."""
    grpc = SERVICE_PORTS[service][1]
    ports = [replica_ports(service, i, env)[grpc] for i in range(replica_count(service, env))]
    return "ipv4:" + ",".join(f"127.0.0.1:{port}" for port in ports)
