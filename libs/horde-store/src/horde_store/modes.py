"""The operator controls every service shares: the horde-wide modes (maintenance, invite-only, raid), one row of
``horde_modes`` (migration 0003), and IP timeouts, keys with a TTL in Redis.

Upstream keeps the modes in its settings; here they are durable rows an operator switches with ``horde-admin
modes`` and every service reads. ``GET /v2/status/modes`` reports them; admission refuses new requests while
``maintenance`` is on (docs/native-api.md#operator-controls). Switching maintenance on also aborts every
queued request (:func:`set_maintenance`), as upstream's ``abort_for_maintenance``.

An IP timeout (``horde-admin ip-timeout``) refuses new requests from one client address (an IPv6 address's
whole /64) with 403 TimeoutIP until its key expires (:func:`set_ip_timeout`, :func:`ip_timeout_seconds`; the
key is :func:`horde_core.redis_keys.ip_timeout_key`, on the database ``HORDE_REDIS_URL`` names).
docs/operator-guide.md#operator-controls.
"""

from __future__ import annotations

import ipaddress
import uuid
from dataclasses import dataclass, field

import asyncpg
import redis.asyncio as redis
from horde_core.redis_keys import ip_timeout_key
from horde_core.signals import publish_chat_event

from horde_store.db import ConnOrPool


@dataclass(frozen=True)
class HordeModes:
    """The modes as stored: each false unless an operator switched it on."""

    maintenance: bool = False
    invite_only: bool = False
    raid: bool = False


async def read_modes(conn: ConnOrPool) -> HordeModes:
    """The current modes (one primary-key read; all off when the row is missing)."""
    row = await conn.fetchrow("SELECT maintenance, invite_only, raid FROM horde_modes WHERE id = 1")
    if row is None:
        return HordeModes()
    return HordeModes(
        maintenance=bool(row["maintenance"]), invite_only=bool(row["invite_only"]), raid=bool(row["raid"])
    )


# --- maintenance mode ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AbortedRequest:
    """A request the maintenance abort stopped: its id, route family, finished generations (the completion
    signal's ``generations``) and whether it was cancelled (False: a streamed request with a job in flight,
    which only stopped handing out jobs; see :func:`set_maintenance`)."""

    id: uuid.UUID
    is_chat: bool
    generations: int
    cancelled: bool = True


@dataclass(frozen=True)
class MaintenanceChange:
    """What :func:`set_maintenance` did: the mode as it now stands and the requests it aborted."""

    maintenance: bool
    aborted: list[AbortedRequest] = field(default_factory=list)
    #: Completion signals published (one per aborted chat request that Redis took).
    signalled: int = 0

    def to_json(self) -> dict[str, object]:
        """``{"maintenance", "aborted", "aborted_ids", "signalled"}`` (``horde-admin modes``'s output)."""
        return {
            "maintenance": self.maintenance,
            "aborted": len(self.aborted),
            "aborted_ids": [str(a.id) for a in self.aborted],
            "signalled": self.signalled,
        }


_SET_MAINTENANCE = """
INSERT INTO horde_modes (id, maintenance, changed) VALUES (1, $1, now())
ON CONFLICT (id) DO UPDATE SET maintenance = EXCLUDED.maintenance, changed = now()
"""

# The cancel route's claim (n = 0, cancelled) over every request that still has jobs to hand out, in one
# statement. Rows are locked in id order, so two switches never deadlock on each other (a settlement that
# does is retried, MAINTENANCE_ATTEMPTS). A request with nothing in flight (a paused worker's fake job, which
# never took a job, does not count) is done at once: its upfront hold is
# released here, as the cancel route releases it. A request with jobs in flight keeps its hold until they
# settle, and submit's settlement releases it then (a cancelled request with n = 0 and nothing in flight is
# done). Maintenance lets in-flight jobs settle (docs/native-api.md#progress), but a cancelled request that
# streams progress has its pending generations settled as cancelled (submit's and the janitor's rule for the
# cancel route); so a streamed request with a real job in flight only gets n = 0 and is left uncancelled, its
# stream lease untouched, and its job settles as any other. (A chat request has one job, so one in flight
# leaves n = 0 already: the case needs a restarted job beside a pending one.)
_ABORT_INCOMPLETE = """
WITH target AS (
    SELECT w.id,
           NOT (w.stream_progress AND EXISTS (
               SELECT 1 FROM processing_gens p
                WHERE p.wp_id = w.id AND NOT p.faulted AND NOT p.fake AND p.generation IS NULL
           )) AS cancel
      FROM waiting_prompts w
     WHERE w.n > 0 AND NOT w.cancelled AND NOT w.faulted
     ORDER BY w.id
       FOR UPDATE OF w
), aborted AS (
    UPDATE waiting_prompts w SET n = 0, cancelled = t.cancel
      FROM target t WHERE w.id = t.id
    RETURNING w.id, w.is_chat, w.cancelled
), released AS (
    DELETE FROM kudos_holds h USING aborted a
     WHERE h.wp_id = a.id AND NOT EXISTS (
         SELECT 1 FROM processing_gens p
          WHERE p.wp_id = a.id AND NOT p.faulted AND NOT p.fake AND p.generation IS NULL
     )
    RETURNING h.wp_id
)
SELECT a.id, a.is_chat, a.cancelled,
       (SELECT count(*) FROM processing_gens p
         WHERE p.wp_id = a.id AND NOT p.faulted AND NOT p.fake AND p.generation IS NOT NULL) AS generations
  FROM aborted a
-- ``released`` runs though the query does not read it: PostgreSQL runs every data-modifying WITH to completion.
"""

#: Attempts of the switch when PostgreSQL picks it as a deadlock victim (a settlement locking the same rows
#: in another order); each attempt is the whole transaction again.
MAINTENANCE_ATTEMPTS = 3


async def _switch(conn: asyncpg.Connection, on: bool) -> list[AbortedRequest]:
    async with conn.transaction():
        await conn.execute(_SET_MAINTENANCE, on)
        if not on:
            return []
        rows = await conn.fetch(_ABORT_INCOMPLETE)
    return [
        AbortedRequest(r["id"], bool(r["is_chat"]), int(r["generations"]), bool(r["cancelled"])) for r in rows
    ]


async def set_maintenance(
    conn: asyncpg.Connection, on: bool, signals: redis.Redis | None = None
) -> MaintenanceChange:
    """Switch horde-wide maintenance mode ``on`` or off (docs/native-api.md#operator-controls).

    Switching on aborts, in the same transaction as the switch, every request that still has jobs to hand
    out (``n > 0``, neither cancelled nor faulted), as the cancel route does: ``n = 0``, ``cancelled``, and
    the upfront hold released when nothing is in flight. Jobs in flight are not touched: they settle
    normally, are paid, and their settlement releases the hold. A request that streams progress and has a
    job in flight only gets ``n = 0`` (not cancelled, no signal): cancelling it would settle that job as
    cancelled, which maintenance does not do. An "on" while already on aborts again
    (requests admitted by a process that had not yet seen the switch, docs/operator-guide.md#operator-controls).

    After the commit, each cancelled chat request gets the ``cancelled`` completion signal on ``signals`` (a
    client on the chat signal database, :func:`horde_core.redis_keys.signal_client`), so a waiting client
    ends; best effort, never raised (a client that misses it reads the cancelled status on its next
    recheck). ``conn`` must not be inside a transaction (the signals go out after this call's commit).
    Retries a deadlock up to :data:`MAINTENANCE_ATTEMPTS` times, then raises it.
    """
    for attempt in range(1, MAINTENANCE_ATTEMPTS + 1):
        try:
            aborted = await _switch(conn, on)
            break
        except asyncpg.DeadlockDetectedError:
            if attempt == MAINTENANCE_ATTEMPTS:
                raise
    signalled = 0
    if signals is not None:
        for request in aborted:
            if (
                request.is_chat
                and request.cancelled
                and await publish_chat_event(signals, str(request.id), "cancelled", request.generations)
            ):
                signalled += 1
    return MaintenanceChange(maintenance=on, aborted=aborted, signalled=signalled)


# --- IP timeouts ----------------------------------------------------------------------------------------------

#: The longest IP timeout an operator can set (upstream's countermeasures cap theirs at days, too).
MAX_IP_TIMEOUT_SECONDS = 30 * 24 * 3600


#: The prefix an IPv6 timeout covers: a client picks any address of its /64 at will (SLAAC privacy
#: addresses), so timing out one address of it would be no timeout at all.
IPV6_TIMEOUT_PREFIX = 64


def normalize_address(address: str) -> str:
    """``address`` as ``ipaddress`` writes it (``0:0::1`` → ``::1``), so one address is one key: an
    IPv4-mapped IPv6 address is its IPv4 address (``::ffff:1.2.3.4``, ``::ffff:102:304`` → ``1.2.3.4``), and
    the forms a proxy header may carry are read as their address (``[2001:db8::1]``, ``[2001:db8::1]:443``,
    ``2001:db8::1%eth0``, ``1.2.3.4:5555``). Raises ValueError for a string that is not an IPv4 or IPv6
    address."""
    text = address.strip()
    if text.startswith("["):
        close = text.find("]")
        rest = text[close + 1 :] if close > 0 else "?"
        if rest and not (rest.startswith(":") and rest[1:].isdigit()):
            raise ValueError(f"{address!r} does not appear to be an IPv4 or IPv6 address")
        text = text[1:close]
    elif text.count(":") == 1:  # IPv4 with a port (an IPv6 address has two colons at least)
        host, _, port = text.partition(":")
        if port.isdigit():
            text = host
    text = text.split("%", 1)[0]  # an IPv6 zone names the host's interface, not the client
    parsed = ipaddress.ip_address(text)
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return parsed.ipv4_mapped.compressed
    return parsed.compressed


def timeout_target(address: str) -> str:
    """What a timeout of ``address`` covers: its IPv4 address, or the /64 of an IPv6 address
    (``2001:db8::/64``). Raises ValueError for an invalid address."""
    normalized = normalize_address(address)
    if ":" not in normalized:
        return normalized
    return ipaddress.ip_network(f"{normalized}/{IPV6_TIMEOUT_PREFIX}", strict=False).compressed


def address_keys(address: str) -> list[str]:
    """The timeout keys that cover a client address as a route sees it: an IPv4 address's (a mapped one's
    too); an IPv6 address's own and its /64's; a string that does not parse (a peer name such as a test
    client's) as it is."""
    try:
        normalized = normalize_address(address)
    except ValueError:
        return [ip_timeout_key(address)]
    target = timeout_target(normalized)
    if target == normalized:
        return [ip_timeout_key(normalized)]
    return [ip_timeout_key(normalized), ip_timeout_key(target)]


def address_key(address: str) -> str:
    """The key a timeout of ``address`` is stored under (:func:`timeout_target`); a string that does not
    parse as it is."""
    try:
        return ip_timeout_key(timeout_target(address))
    except ValueError:
        return ip_timeout_key(address)


async def set_ip_timeout(client: redis.Redis, address: str, seconds: int) -> str:
    """Time out ``address`` for ``seconds`` (1 … :data:`MAX_IP_TIMEOUT_SECONDS`), replacing any timeout it
    had; returns what the timeout covers (:func:`timeout_target`: the IPv4 address, or an IPv6 address's
    /64). Raises ValueError for an invalid address or duration."""
    target = timeout_target(address)
    if not 1 <= seconds <= MAX_IP_TIMEOUT_SECONDS:
        raise ValueError(f"a timeout lasts 1 to {MAX_IP_TIMEOUT_SECONDS} seconds, not {seconds}")
    await client.set(ip_timeout_key(target), "1", ex=seconds)
    return target


async def clear_ip_timeout(client: redis.Redis, address: str) -> bool:
    """Lift the timeout covering ``address`` (an IPv6 address's /64, and a key of that exact address an
    earlier release stored); True when it had one. Raises ValueError for an invalid address."""
    keys = {ip_timeout_key(timeout_target(address)), ip_timeout_key(normalize_address(address))}
    return bool(await client.delete(*keys))


async def ip_timeout_seconds(client: redis.Redis, address: str) -> int:
    """The seconds left of the longest timeout covering ``address`` (as a route sees it,
    :func:`address_keys`), 0 when it has none. Raises what the Redis client raises."""
    keys = address_keys(address)
    if len(keys) == 1:
        ttls = [int(await client.ttl(keys[0]))]
    else:
        async with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.ttl(key)
            ttls = [int(ttl) for ttl in await pipe.execute()]
    ttl = max(ttls)
    # -2: no key; -1: a key without expiry, which this module never writes (not a timeout).
    return ttl if ttl > 0 else 0
