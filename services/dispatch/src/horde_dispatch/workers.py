"""Worker rows: creation and check-in at pop, the stored chat declaration, and the worker details routes.

See docs/native-api.md#chat-declaration (the declaration is stored at every pop, inside the 30 s
window too), #worker-details; docs/native-api.md#workers (creation, check-in, online, trusted, validated),
#uptime-kudos (the reward the check-in pays; the validated bridges are :mod:`horde_contract.bridges`).

Creation limits (upstream ``JobPopTemplate.get_worker`` and ``User.exceeding_ipaddr_restrictions``), checked
only when a pop names a worker that does not exist yet, in this order, each 403:

- ``TooManyWorkers``: an untrusted owner already has more than :data:`UNTRUSTED_WORKER_LIMIT` (3) workers;
- ``TooManyWorkersTrusted``: any owner with more than :data:`TRUSTED_WORKER_LIMIT` (20) workers and more than
  its ``worker_invited`` allowance;
- ``TooManySameIPs``: more than :data:`SAME_IP_WORKER_LIMIT` (3; for a trusted owner
  :data:`SAME_IP_TRUSTED_WORKER_LIMIT`, 20) workers already on the pop's address, and more than the owner's
  ``worker_invited``.

Workers on the address are counted whoever owns them, as the reference words the rule ("more than 3 workers
on the IP"). Upstream's ``exceeding_ipaddr_restrictions`` counts only the owner's own workers, which under its
thresholds can never exceed what the worker-count rules already refuse, so it never fires; counting every
owner's makes the rule do what it is for, stopping one address from onboarding workers under many accounts. A
loopback address is not counted: it is a worker on the broker's own host (``make run``, the tests), never an
internet client, as behind a proxy only a trusted proxy's X-Forwarded-For could claim it.

Counts include workers that are not online (as upstream's), and are taken under a per-owner and a per-address
lock, so parallel pops with new names cannot create past a limit together. The address is the pop's client
address (the ``X-Forwarded-For`` client only behind a trusted proxy: ``HORDE_FORWARDED_ALLOW_IPS``).
"""

from __future__ import annotations

import ipaddress
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any, overload

import asyncpg
from horde_contract import ONLINE_WORKER_SECONDS, RC, ChatDeclaration, TextModelReference
from horde_contract.bridges import UPTIME_REWARD_SECONDS, uptime_reward
from horde_contract.errors import HordeError
from horde_contract.refusals import worker_not_found_error, wrong_credentials_error
from horde_store import users
from horde_store.db import Conn, ConnOrPool

from .pop_body import PopBody

log = logging.getLogger(__name__)

#: A check-in within this many seconds of the last one (of a worker older than that) does not rewrite
#: the text check-in fields (TextWorker.check_in); the chat declaration is written anyway.
CHECK_IN_WINDOW_SECONDS = 30


#: Worker creation limits (upstream's constants and messages; docs/native-api.md#workers).
UNTRUSTED_WORKER_LIMIT = 3
TRUSTED_WORKER_LIMIT = 20
SAME_IP_WORKER_LIMIT = 3
SAME_IP_TRUSTED_WORKER_LIMIT = 20
TOO_MANY_WORKERS_MESSAGE = "To avoid abuse, untrusted users can only have up to 3 distinct workers."
TOO_MANY_WORKERS_TRUSTED_MESSAGE = (
    "To avoid abuse, you cannot onboard more than 20 workers as a trusted user. "
    "Please contact us on Discord to adjust."
)
TOO_MANY_SAME_IPS_MESSAGE = (
    "You are running too many workers from the same location. To prevent abuse, please contact us on "
    "Discord to allow you to join more workers from the same IP: https://discord.gg/aG68kk3Qpz"
)


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """The checked-in worker as the pop needs it. Lengths in tokens; ``speed`` tokens/s or None."""

    id: uuid.UUID
    user_id: int
    name: str
    created_now: bool
    threads: int
    max_length: int
    max_context_length: int
    speed: float | None
    maintenance: bool
    maintenance_msg: str | None
    paused: bool
    bridge_agent: str
    #: The uptime reward this check-in paid (kudos; 0 for none).
    uptime_reward: float = 0.0


# One statement: create the worker or check it in. The declaration columns are written on every pop; the
# other check-in fields only outside the 30 s window. Uptime accrues unless the worker was stale, paused
# or in maintenance. A name owned by another user matches no row (403 WrongCredentials).
# Uptime reward (docs/native-api.md#uptime-kudos, upstream WorkerTemplate.check_in): when the uptime since the
# last reward passes $21 seconds, the worker earns $20 kudos (kudos and uptime_kudos) and so does its owner, in
# the same statement (the ``paid`` CTE, which touches a user row only then): spendable for a trusted owner,
# all into escrow (evaluating_kudos) for an untrusted one. A check-in that does not accrue (the worker was
# stale, paused or in maintenance) restarts the count, so a returning worker stays up a whole interval first.
# ``last_uptime_reward = now()`` (the statement's transaction time) tells RETURNING that this statement paid.
_CHECK_IN = (
    """
WITH c AS (
INSERT INTO workers AS w (
    user_id, name, bridge_agent, threads, max_length, max_context_length, models, softprompts, nsfw,
    extra_slow_worker, ipaddr, accepts_chat_jobs, accepts_prompt_jobs, chat_features, chat_max_context_length,
    chat_max_length, chat_model_id, image_transports, chat_tools_max_temperature, last_check_in, created
)
VALUES ($1, $2, $3, $4, $5, $6, $7::text[], $8::text[], $9, $10, $11, $12, $13, $14::text[], $15, $16, $17,
        $18::text[], $19, now(), now())
ON CONFLICT (name) DO UPDATE SET
    accepts_chat_jobs = EXCLUDED.accepts_chat_jobs,
    accepts_prompt_jobs = EXCLUDED.accepts_prompt_jobs,
    chat_features = EXCLUDED.chat_features,
    chat_max_context_length = EXCLUDED.chat_max_context_length,
    chat_max_length = EXCLUDED.chat_max_length,
    chat_model_id = EXCLUDED.chat_model_id,
    image_transports = EXCLUDED.image_transports,
    chat_tools_max_temperature = EXCLUDED.chat_tools_max_temperature,
    bridge_agent = CASE WHEN {fresh} THEN EXCLUDED.bridge_agent ELSE w.bridge_agent END,
    threads = CASE WHEN {fresh} THEN EXCLUDED.threads ELSE w.threads END,
    max_length = CASE WHEN {fresh} THEN EXCLUDED.max_length ELSE w.max_length END,
    max_context_length = CASE WHEN {fresh} THEN EXCLUDED.max_context_length ELSE w.max_context_length END,
    models = CASE WHEN {fresh} THEN EXCLUDED.models ELSE w.models END,
    softprompts = CASE WHEN {fresh} THEN EXCLUDED.softprompts ELSE w.softprompts END,
    nsfw = CASE WHEN {fresh} THEN EXCLUDED.nsfw ELSE w.nsfw END,
    extra_slow_worker = CASE WHEN {fresh} THEN EXCLUDED.extra_slow_worker ELSE w.extra_slow_worker END,
    ipaddr = CASE WHEN {fresh} THEN EXCLUDED.ipaddr ELSE w.ipaddr END,
    uptime = w.uptime + CASE WHEN {fresh} AND {accruing} THEN {elapsed} ELSE 0 END,
    last_reward_uptime = CASE
        WHEN NOT {fresh} THEN w.last_reward_uptime
        WHEN NOT {accruing} THEN w.uptime
        WHEN {due} THEN w.uptime + {elapsed}
        ELSE w.last_reward_uptime END,
    kudos = w.kudos + CASE WHEN {pays} THEN $20::float8 ELSE 0 END,
    uptime_kudos = w.uptime_kudos + CASE WHEN {pays} THEN $20::float8 ELSE 0 END,
    last_uptime_reward = CASE WHEN {pays} THEN now() ELSE w.last_uptime_reward END,
    last_check_in = CASE WHEN {fresh} THEN now() ELSE w.last_check_in END
WHERE w.user_id = EXCLUDED.user_id
RETURNING w.id, w.user_id, w.name, (w.xmax = 0) AS created_now, w.threads, w.max_length, w.max_context_length,
          w.speed, w.maintenance, w.maintenance_msg, w.paused, w.bridge_agent,
          CASE WHEN w.last_uptime_reward = now() THEN $20::float8 ELSE 0 END AS uptime_reward
), paid AS (
    UPDATE users u
       SET kudos = u.kudos + CASE WHEN u.trusted OR u.id = 0 THEN c.uptime_reward ELSE 0 END,
           evaluating_kudos = u.evaluating_kudos + CASE WHEN u.trusted OR u.id = 0 THEN 0 ELSE c.uptime_reward END
      FROM c WHERE u.id = c.user_id AND c.uptime_reward > 0
    RETURNING u.id
)
SELECT * FROM c
""".replace(
        "{pays}",
        "({fresh} AND {accruing} AND {due})",
    )
    .replace(
        "{fresh}",
        f"(w.last_check_in <= now() - make_interval(secs => {CHECK_IN_WINDOW_SECONDS}) "
        f"OR w.created > now() - make_interval(secs => {CHECK_IN_WINDOW_SECONDS}))",
    )
    .replace(
        "{accruing}",
        "(NOT w.paused AND NOT w.maintenance "
        f"AND w.last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS}))",
    )
    .replace(
        "{due}",
        "(w.uptime + {elapsed} - w.last_reward_uptime > $21::bigint)",
    )
    .replace(
        "{elapsed}",
        "floor(extract(epoch FROM now() - w.last_check_in))::bigint",
    )
)


#: The check-in of a worker whose name exists: the same upsert, inserting nothing for a new name (which goes
#: through the creation limits instead). No row: a new name, or another owner's (:func:`check_in` tells them
#: apart). One round trip for the pop of every known worker instead of two.
_CHECK_IN_KNOWN = _CHECK_IN.replace(
    """VALUES ($1, $2, $3, $4, $5, $6, $7::text[], $8::text[], $9, $10, $11, $12, $13, $14::text[], $15, $16, $17,
        $18::text[], $19, now(), now())""",
    """SELECT $1::bigint, $2::text, $3::text, $4::int, $5::int, $6::int, $7::text[], $8::text[], $9::boolean,
       $10::boolean, $11::text, $12::boolean, $13::boolean, $14::text[], $15::int, $16::int, $17::text,
       $18::text[], $19::float8, now(), now()
WHERE EXISTS (SELECT 1 FROM workers WHERE name = $2::text)""",
)
assert _CHECK_IN_KNOWN != _CHECK_IN


_CREATION_COUNTS = """
SELECT u.trusted, u.worker_invited,
       (SELECT count(*) FROM workers w WHERE w.user_id = u.id) AS workers,
       CASE WHEN $2::text IS NULL THEN 0
            ELSE (SELECT count(*) FROM workers w WHERE w.ipaddr = $2::text) END AS same_ip
FROM users u WHERE u.id = $1
"""
_CREATION_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended($1::text, 0))"


def client_ip(ipaddr: str | None) -> str | None:
    """The pop's client address as stored (``workers.ipaddr``), or None when it is not an IP address (a test
    client's name, or what a client behind a trusted proxy put in X-Forwarded-For)."""
    if not ipaddr:
        return None
    try:
        return str(ipaddress.ip_address(ipaddr))
    except ValueError:
        return None


def counted_address(ipaddr: str | None) -> str | None:
    """The address the same-IP rule counts, or None for none (not an IP address, or loopback)."""
    address = client_ip(ipaddr)
    if address is None or ipaddress.ip_address(address).is_loopback:
        return None
    return address


def creation_refusal(trusted: bool, worker_invited: int, workers: int, same_ip: int) -> HordeError | None:
    """The 403 a new worker of an owner with ``workers`` workers gets when ``same_ip`` workers are already on
    the pop's address, or None when it may be created (upstream's order and thresholds)."""
    if not trusted and workers > UNTRUSTED_WORKER_LIMIT:
        return HordeError(403, RC.TooManyWorkers, TOO_MANY_WORKERS_MESSAGE)
    if workers > TRUSTED_WORKER_LIMIT and workers > worker_invited:
        return HordeError(403, RC.TooManyWorkersTrusted, TOO_MANY_WORKERS_TRUSTED_MESSAGE)
    same_ip_limit = SAME_IP_TRUSTED_WORKER_LIMIT if trusted else SAME_IP_WORKER_LIMIT
    if same_ip > same_ip_limit and same_ip > worker_invited:
        return HordeError(403, RC.TooManySameIPs, TOO_MANY_SAME_IPS_MESSAGE)
    return None


@dataclass(frozen=True, slots=True)
class UptimeRule:
    """What the uptime reward reads besides the pop: the text model reference (the first model's size) and
    the interval in seconds of uptime (HORDE_WORKER_UPTIME_REWARD_SECONDS; docs/native-api.md#uptime-kudos)."""

    reference: TextModelReference = field(default_factory=TextModelReference)
    seconds: int = UPTIME_REWARD_SECONDS

    def reward(self, pop: PopBody) -> float:
        """The kudos an interval earns the worker as this pop declares it (its stored values whenever the
        check-in accrues uptime, which happens only outside the 30 s window, where the pop rewrites them)."""
        return uptime_reward(pop.models, pop.text.max_context_length, pop.text.bridge_agent, self.reference)


async def check_in(
    conn: Conn, owner_id: int, pop: PopBody, ipaddr: str | None, uptime: UptimeRule | None = None
) -> WorkerRow:
    """Create the worker on its first pop or check it in, storing the chat declaration, accruing its uptime
    and paying the uptime reward when one is due (``uptime``: the reward's rule; None, upstream's interval and
    an empty model reference).

    A name nobody uses yet is a new worker: the creation limits above are checked first (403 TooManyWorkers,
    TooManyWorkersTrusted, TooManySameIPs), under a per-owner transaction lock. Raises 403 WrongCredentials
    when another user owns a worker of that name.
    """
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as acquired:
            return await check_in(acquired, owner_id, pop, ipaddr, uptime)
    ipaddr = client_ip(ipaddr)
    rule = uptime or UptimeRule()
    reward = (rule.reward(pop), rule.seconds)
    known = await _upsert(conn, owner_id, pop, ipaddr, reward, _CHECK_IN_KNOWN, refuse=False)
    if known is not None:
        if known.uptime_reward:
            log.info(
                "uptime reward",
                extra={"worker_id": str(known.id), "kudos": known.uptime_reward, "seconds": rule.seconds},
            )
        return known
    if await conn.fetchval("SELECT 1 FROM workers WHERE name = $1", pop.text.name) is not None:
        return await _upsert(conn, owner_id, pop, ipaddr, reward)
    address = counted_address(ipaddr)
    async with conn.transaction():
        # The owner's lock, then the address's: every creation takes them in this order.
        await conn.execute(_CREATION_LOCK, f"horde.worker_creation.owner:{owner_id}")
        if address is not None:
            await conn.execute(_CREATION_LOCK, f"horde.worker_creation.ip:{address}")
        counts = await conn.fetchrow(_CREATION_COUNTS, owner_id, address)
        if counts is not None:
            refusal = creation_refusal(
                bool(counts["trusted"]),
                int(counts["worker_invited"]),
                int(counts["workers"]),
                int(counts["same_ip"]),
            )
            if refusal is not None:
                raise refusal
        return await _upsert(conn, owner_id, pop, ipaddr, reward)


@overload
async def _upsert(
    conn: Conn, owner_id: int, pop: PopBody, ipaddr: str | None, reward: tuple[float, int]
) -> WorkerRow: ...
@overload
async def _upsert(
    conn: Conn,
    owner_id: int,
    pop: PopBody,
    ipaddr: str | None,
    reward: tuple[float, int],
    statement: str,
    *,
    refuse: bool,
) -> WorkerRow | None: ...
async def _upsert(
    conn: Conn,
    owner_id: int,
    pop: PopBody,
    ipaddr: str | None,
    reward: tuple[float, int],
    statement: str = _CHECK_IN,
    *,
    refuse: bool = True,
) -> WorkerRow | None:
    """The check-in statement: create the worker or check it in (the name's owner only). ``reward`` is the
    uptime reward's ``(kudos, interval seconds)``. No row is 403 WrongCredentials, or None when not
    ``refuse``."""
    text = pop.text
    d: ChatDeclaration = pop.declaration
    row = await conn.fetchrow(
        statement,
        owner_id,
        text.name,
        text.bridge_agent,
        text.threads,
        text.max_length,
        text.max_context_length,
        pop.models,
        text.softprompts,
        bool(text.nsfw),
        bool(text.extra_slow_worker),
        ipaddr,
        d.accepts_chat_jobs,
        d.accepts_prompt_jobs,
        list(d.chat_features) if d.accepts_chat_jobs else None,
        d.chat_max_context_length,
        d.chat_max_length,
        d.chat_model_id,
        list(d.image_transports) if d.accepts_chat_jobs else None,
        d.chat_tools_max_temperature,
        *reward,
    )
    if row is None:
        if not refuse:
            return None
        raise wrong_credentials_error()
    return WorkerRow(**dict(row))


# --- Worker details (GET /v2/workers, /v2/workers/{id}, /v2/workers/name/{name}) ---------------------------

_DETAILS_COLUMNS = f"""
    w.id, w.user_id, w.name, w.info, w.created, w.last_check_in, w.bridge_agent, w.threads, w.max_length,
    w.max_context_length, w.speed, w.kudos, w.uptime_kudos, w.contributions, w.fulfilments, w.uncompleted_jobs,
    w.uptime,
    w.paused, w.maintenance, w.maintenance_msg, w.nsfw, w.models, w.accepts_chat_jobs, w.accepts_prompt_jobs,
    w.chat_features, w.chat_max_context_length, w.chat_max_length, w.chat_model_id, w.image_transports,
    w.chat_tools_max_temperature, w.nonconformant_replies, u.trusted, u.flagged,
    (w.last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})) AS online,
    EXISTS (SELECT 1 FROM worker_suspicions s WHERE s.worker_id = w.id) AS suspicious
"""


@dataclass(frozen=True, slots=True)
class DetailsViewer:
    """Who reads worker details: the user of the ``apikey`` header (None without one, for an unknown key, a
    shared key, the anonymous key or a deleted user) and whether that user is a moderator."""

    user_id: int | None = None
    moderator: bool = False

    def privileged(self, owner_id: int) -> bool:
        """Whether this viewer sees a worker's ``paused`` and ``suspicious``: its owner or a moderator."""
        return self.moderator or (self.user_id is not None and self.user_id == owner_id)


#: The viewer without a (usable) key: sees no privileged field.
ANONYMOUS_VIEWER = DetailsViewer()


async def details_viewer(conn: ConnOrPool, apikey: str | None, salt: str) -> DetailsViewer:
    """Resolve the optional ``apikey`` of a details read (upstream's ``details_privilege``). A missing or
    unknown key is no error, as upstream: it reads what anyone reads. A shared key is a spending key, never a
    user's credential here (as on pop and PUT), so it resolves to no one either."""
    if not apikey:
        return ANONYMOUS_VIEWER
    user = await users.authenticate(conn, apikey, salt, shared_keys=False)
    if user is None or user.is_anonymous or user.deleted:
        return ANONYMOUS_VIEWER
    return DetailsViewer(user_id=int(user.id), moderator=bool(user.moderator))


def worker_details(row: asyncpg.Record | dict[str, Any], *, privileged: bool = False) -> dict[str, Any]:
    """The text worker details (upstream WorkerDetails for ``type: text``) plus the chat declaration.

    ``accepts_chat_jobs``/``accepts_prompt_jobs`` are the last pop's chat_jobs/prompt_jobs; ``chat`` mirrors
    its chat fields (features and image_transports: recognised names only, sorted) and is absent when the
    worker does not accept chat jobs; ``nonconformant_replies`` counts replies refused as nonconformant.
    ``paused`` and ``suspicious`` are only for a ``privileged`` viewer (the owner or a moderator, as upstream's
    details_privilege) and absent otherwise: a paused worker's fake jobs (docs/native-api.md#workers) only work
    while nobody else can tell it is paused.
    See docs/native-api.md#worker-details, #refusal-record.
    """
    speed = row["speed"]
    contributions = float(row["contributions"] or 0)
    details: dict[str, Any] = {
        "type": "text",
        "name": row["name"],
        "id": str(row["id"]),
        "online": bool(row["online"]),
        "requests_fulfilled": int(row["fulfilments"]),
        "kudos_rewards": round(float(row["kudos"] or 0), 2),
        # workers.kudos holds both; uptime_kudos is the uptime part (docs/native-api.md#uptime-kudos).
        "kudos_details": {
            "generated": round(float(row["kudos"] or 0) - float(row["uptime_kudos"] or 0), 2),
            "uptime": round(float(row["uptime_kudos"] or 0), 2),
        },
        "performance": f"{round(speed, 1)} tokens per second" if speed else "No requests fulfilled yet",
        "threads": int(row["threads"]),
        "uptime": int(row["uptime"]),
        "uncompleted_jobs": int(row["uncompleted_jobs"]),
        "maintenance_mode": bool(row["maintenance"]),
        "info": row["info"],
        "nsfw": bool(row["nsfw"]),
        "trusted": bool(row["trusted"]),
        "flagged": bool(row["flagged"]),
        "bridge_agent": row["bridge_agent"],
        "max_length": int(row["max_length"]),
        "max_context_length": int(row["max_context_length"]),
        "tokens_generated": int(contributions),
        "models": list(row["models"] or []),
        "accepts_chat_jobs": bool(row["accepts_chat_jobs"]),
        "accepts_prompt_jobs": bool(row["accepts_prompt_jobs"]),
        "nonconformant_replies": int(row["nonconformant_replies"]),
    }
    if privileged:
        details["paused"] = bool(row["paused"])
        details["suspicious"] = 1 if row["suspicious"] else 0
    if row["accepts_chat_jobs"]:
        declaration = ChatDeclaration(
            accepts_chat_jobs=True,
            accepts_prompt_jobs=bool(row["accepts_prompt_jobs"]),
            chat_features=tuple(sorted(row["chat_features"] or ())),
            chat_max_context_length=row["chat_max_context_length"],
            chat_max_length=row["chat_max_length"],
            chat_tools_max_temperature=row["chat_tools_max_temperature"],
            chat_model_id=row["chat_model_id"],
            image_transports=tuple(sorted(row["image_transports"] or ())),
        )
        details["chat"] = declaration.details()
    return details


async def list_workers(
    conn: ConnOrPool, name: str | None = None, viewer: DetailsViewer = ANONYMOUS_VIEWER
) -> list[dict[str, Any]]:
    """Details of every online worker (checked in within 300 s), optionally only those whose name equals
    ``name`` case-insensitively (upstream's ``name`` query; names themselves are compared exactly, so
    ``Alpha`` and ``alpha`` may both be listed), each as ``viewer`` may see it."""
    if name is not None and "\x00" in name:
        return []  # PostgreSQL text cannot hold NUL, and no worker name does
    rows = await conn.fetch(
        f"""
        SELECT {_DETAILS_COLUMNS}
        FROM workers w JOIN users u ON u.id = w.user_id
        WHERE w.last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})
          AND ($1::text IS NULL OR lower(w.name) = lower($1::text))
        ORDER BY w.name
        """,
        name,
    )
    return [worker_details(r, privileged=viewer.privileged(r["user_id"])) for r in rows]


async def get_worker_by_id(
    conn: ConnOrPool, worker_id: str, viewer: DetailsViewer = ANONYMOUS_VIEWER
) -> dict[str, Any]:
    """Details of one worker by id, as ``viewer`` may see it; 404 WorkerNotFound for an unknown or malformed
    id."""
    try:
        wid = uuid.UUID(worker_id)
    except ValueError:
        raise worker_not_found_error(worker_id) from None
    row = await conn.fetchrow(
        f"SELECT {_DETAILS_COLUMNS} FROM workers w JOIN users u ON u.id = w.user_id WHERE w.id = $1", wid
    )
    if row is None:
        raise worker_not_found_error(worker_id)
    return worker_details(row, privileged=viewer.privileged(row["user_id"]))


async def get_worker_by_name(
    conn: ConnOrPool, name: str, viewer: DetailsViewer = ANONYMOUS_VIEWER
) -> dict[str, Any]:
    """Details of one worker by name, as ``viewer`` may see it; 404 WorkerNotFound when none has that name."""
    if "\x00" in name:
        raise worker_not_found_error(name.replace("\x00", "\ufffd"))
    row = await conn.fetchrow(
        f"SELECT {_DETAILS_COLUMNS} FROM workers w JOIN users u ON u.id = w.user_id WHERE w.name = $1", name
    )
    if row is None:
        raise worker_not_found_error(name)
    return worker_details(row, privileged=viewer.privileged(row["user_id"]))
