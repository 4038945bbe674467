"""Worker rows: creation and check-in at pop, the stored chat declaration, and the worker details routes.

Spec: chat-requests.md *Chat declaration on pop* (the declaration is stored at every pop, inside the 30 s
window too), *Worker details*; ai-horde-text-path.md §6 (creation, check-in, online, trusted, validated).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
from horde_contract import ONLINE_WORKER_SECONDS, RC, ChatDeclaration
from horde_core.errors import HordeError

from .pop_body import PopBody
from .sql import Conn

#: Bridge names whose backends are validated (horde/bridge_reference.py), plus this project's reference
#: worker, whose replies the broker verifies like any other.
VALIDATED_BRIDGES = frozenset(
    {
        "AI Horde Worker",
        "AI Horde Worker~aphrodite~oai",
        "AI Horde Worker~aphrodite~kai",
        "KoboldCppEmbedWorker",
        "TabbyAPI",
        "Horde Chat Worker",
    }
)
#: A check-in within this many seconds of the last one (of a worker older than that) does not rewrite
#: the text check-in fields (TextWorker.check_in); the chat declaration is written anyway.
CHECK_IN_WINDOW_SECONDS = 30

WRONG_CREDENTIALS_MESSAGE = "Wrong credentials to submit as this worker."


def bridge_name(bridge_agent: str | None) -> str:
    """The part of ``bridge_agent`` before the first ``:`` (``unknown`` when empty)."""
    return (bridge_agent or "").split(":", 1)[0] or "unknown"


def is_validated_bridge(bridge_agent: str | None) -> bool:
    """Whether the worker's bridge is one of :data:`VALIDATED_BRIDGES`."""
    return bridge_name(bridge_agent) in VALIDATED_BRIDGES


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


# One statement: create the worker or check it in. The declaration columns are written on every pop; the
# other check-in fields only outside the 30 s window. Uptime accrues unless the worker was stale, paused
# or in maintenance. A name owned by another user matches no row (403 WrongCredentials).
_CHECK_IN = f"""
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
    bridge_agent = CASE WHEN {{fresh}} THEN EXCLUDED.bridge_agent ELSE w.bridge_agent END,
    threads = CASE WHEN {{fresh}} THEN EXCLUDED.threads ELSE w.threads END,
    max_length = CASE WHEN {{fresh}} THEN EXCLUDED.max_length ELSE w.max_length END,
    max_context_length = CASE WHEN {{fresh}} THEN EXCLUDED.max_context_length ELSE w.max_context_length END,
    models = CASE WHEN {{fresh}} THEN EXCLUDED.models ELSE w.models END,
    softprompts = CASE WHEN {{fresh}} THEN EXCLUDED.softprompts ELSE w.softprompts END,
    nsfw = CASE WHEN {{fresh}} THEN EXCLUDED.nsfw ELSE w.nsfw END,
    extra_slow_worker = CASE WHEN {{fresh}} THEN EXCLUDED.extra_slow_worker ELSE w.extra_slow_worker END,
    ipaddr = CASE WHEN {{fresh}} THEN EXCLUDED.ipaddr ELSE w.ipaddr END,
    uptime = w.uptime + CASE
        WHEN {{fresh}} AND NOT w.paused AND NOT w.maintenance
             AND w.last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})
        THEN floor(extract(epoch FROM now() - w.last_check_in))::bigint ELSE 0 END,
    last_check_in = CASE WHEN {{fresh}} THEN now() ELSE w.last_check_in END
WHERE w.user_id = EXCLUDED.user_id
RETURNING w.id, w.user_id, w.name, (w.xmax = 0) AS created_now, w.threads, w.max_length, w.max_context_length,
          w.speed, w.maintenance, w.maintenance_msg, w.paused, w.bridge_agent
""".replace(
    "{fresh}",
    f"(w.last_check_in <= now() - make_interval(secs => {CHECK_IN_WINDOW_SECONDS}) "
    f"OR w.created > now() - make_interval(secs => {CHECK_IN_WINDOW_SECONDS}))",
)


async def check_in(conn: Conn, owner_id: int, pop: PopBody, ipaddr: str | None) -> WorkerRow:
    """Create the worker on its first pop or check it in, storing the chat declaration; one statement.

    Raises 403 WrongCredentials when another user owns a worker of that name.
    """
    text = pop.text
    d: ChatDeclaration = pop.declaration
    row = await conn.fetchrow(
        _CHECK_IN,
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
    )
    if row is None:
        raise HordeError(403, RC.WrongCredentials, WRONG_CREDENTIALS_MESSAGE)
    return WorkerRow(**dict(row))


# --- Worker details (GET /v2/workers, /v2/workers/{id}, /v2/workers/name/{name}) ---------------------------

_DETAILS_COLUMNS = f"""
    w.id, w.name, w.info, w.created, w.last_check_in, w.bridge_agent, w.threads, w.max_length,
    w.max_context_length, w.speed, w.kudos, w.contributions, w.fulfilments, w.uncompleted_jobs, w.uptime,
    w.paused, w.maintenance, w.maintenance_msg, w.nsfw, w.models, w.accepts_chat_jobs, w.accepts_prompt_jobs,
    w.chat_features, w.chat_max_context_length, w.chat_max_length, w.chat_model_id, w.image_transports,
    w.chat_tools_max_temperature, w.nonconformant_replies, u.trusted, u.flagged,
    (w.last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})) AS online,
    EXISTS (SELECT 1 FROM worker_suspicions s WHERE s.worker_id = w.id) AS suspicious
"""


def worker_details(row: asyncpg.Record | dict[str, Any]) -> dict[str, Any]:
    """The text worker details (upstream WorkerDetails for ``type: text``) plus the chat declaration.

    ``accepts_chat_jobs``/``accepts_prompt_jobs`` are the last pop's chat_jobs/prompt_jobs; ``chat`` mirrors
    its chat fields (features and image_transports: recognised names only, sorted) and is absent when the
    worker does not accept chat jobs; ``nonconformant_replies`` counts replies refused as nonconformant.
    Spec: chat-requests.md *Worker details*, *Refusal record and worker counters*.
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
        "kudos_details": {"generated": round(float(row["kudos"] or 0), 2), "uptime": 0},
        "performance": f"{round(speed, 1)} tokens per second" if speed else "No requests fulfilled yet",
        "threads": int(row["threads"]),
        "uptime": int(row["uptime"]),
        "uncompleted_jobs": int(row["uncompleted_jobs"]),
        "maintenance_mode": bool(row["maintenance"]),
        "paused": bool(row["paused"]),
        "info": row["info"],
        "nsfw": bool(row["nsfw"]),
        "trusted": bool(row["trusted"]),
        "flagged": bool(row["flagged"]),
        "suspicious": 1 if row["suspicious"] else 0,
        "bridge_agent": row["bridge_agent"],
        "max_length": int(row["max_length"]),
        "max_context_length": int(row["max_context_length"]),
        "tokens_generated": int(contributions),
        "models": list(row["models"] or []),
        "accepts_chat_jobs": bool(row["accepts_chat_jobs"]),
        "accepts_prompt_jobs": bool(row["accepts_prompt_jobs"]),
        "nonconformant_replies": int(row["nonconformant_replies"]),
    }
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


def worker_not_found(label: str) -> HordeError:
    """404 WorkerNotFound (upstream's message)."""
    return HordeError(404, RC.WorkerNotFound, f"Worker with ID '{label}' not found.")


async def list_workers(conn: Conn, name: str | None = None) -> list[dict[str, Any]]:
    """Details of every online worker (checked in within 300 s), optionally only the one named ``name``."""
    rows = await conn.fetch(
        f"""
        SELECT {_DETAILS_COLUMNS}
        FROM workers w JOIN users u ON u.id = w.user_id
        WHERE w.last_check_in > now() - make_interval(secs => {ONLINE_WORKER_SECONDS})
          AND ($1::text IS NULL OR w.name = $1::text)
        ORDER BY w.name
        """,
        name,
    )
    return [worker_details(r) for r in rows]


async def get_worker_by_id(conn: Conn, worker_id: str) -> dict[str, Any]:
    """Details of one worker by id; 404 WorkerNotFound for an unknown or malformed id."""
    try:
        wid = uuid.UUID(worker_id)
    except ValueError:
        raise worker_not_found(worker_id) from None
    row = await conn.fetchrow(
        f"SELECT {_DETAILS_COLUMNS} FROM workers w JOIN users u ON u.id = w.user_id WHERE w.id = $1", wid
    )
    if row is None:
        raise worker_not_found(worker_id)
    return worker_details(row)


async def get_worker_by_name(conn: Conn, name: str) -> dict[str, Any]:
    """Details of one worker by name; 404 WorkerNotFound when none has that name."""
    row = await conn.fetchrow(
        f"SELECT {_DETAILS_COLUMNS} FROM workers w JOIN users u ON u.id = w.user_id WHERE w.name = $1", name
    )
    if row is None:
        raise worker_not_found(name)
    return worker_details(row)
