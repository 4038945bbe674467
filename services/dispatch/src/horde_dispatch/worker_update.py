"""``PUT /v2/workers/{worker_id}``: an owner or a moderator changes a worker (docs/native-api.md#modify-worker).

The body is upstream's ``ModifyWorkerInput``: ``maintenance`` (with ``maintenance_msg``), ``paused``, ``info``,
``name`` and ``team``; null or absent keys change nothing and unknown keys are ignored. Who may set what, as
upstream: the owner or a moderator sets ``maintenance`` and ``info`` (anyone else 403 NotOwner) and ``name``
and ``team`` (anyone else 403 NotModerator, upstream's code for those two); only a moderator sets ``paused``
(403 NotModerator, the owner included). Unlike upstream, which commits each field as it goes, every refusal
is checked before anything is written, and the changes are one UPDATE.

Order of the refusals: the body (413 RequestTooLarge, 408 RequestBodyTimeout, 400 BadRequest), the worker
(404 WorkerNotFound), the key (401 InvalidAPIKey; 403 DeletedUser), the fields in upstream's order
(maintenance, info, paused, name, team: 403), then 400 NoWorkerModSelected when nothing was asked, 404
TeamNotFound and 400 WorkerNameAlreadyExists.

The stored columns are what the pop reads, so a change applies from the worker's next pop: maintenance is
403 WorkerMaintenance with the stored message, a paused worker gets decoy jobs.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Annotated, Any

import asyncpg
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from horde_contract import RC
from horde_contract.errors import HordeError
from horde_contract.refusals import deleted_user_error, invalid_api_key_error, worker_not_found_error
from horde_core import body as body_reader
from horde_store import users
from horde_store.db import Conn
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from .pop_body import worker_name_refusal

#: The body's bounds: six short fields fit in far less (1000-character texts escaped as \\uXXXX pairs take
#: 12 KB each); nothing nests.
MODIFY_BODY_LIMITS = body_reader.BodyLimits(max_bytes=64 * 1024, max_elements=64, max_depth=2)
#: ``workers.info`` and ``workers.maintenance_msg`` are varchar(1000); upstream bounds info alike.
MAX_INFO_LENGTH = 1000
MAX_MAINTENANCE_MESSAGE_LENGTH = 1000
#: Upstream's ModifyWorkerInput bounds a new name to 5..100 characters (100: the pop's bound, workers.name).
MIN_NAME_LENGTH = 5
MAX_NAME_LENGTH = 100
#: A team id is a UUID (36 characters).
MAX_TEAM_LENGTH = 36
#: The worker id echoed in a WorkerNotFound message is cut to this many characters.
MAX_ECHOED_ID = 64
#: Upstream answers a cleared team as the string "None".
NO_TEAM = "None"


class ModifyWorkerBody(BaseModel):
    """Upstream's ``ModifyWorkerInput``; every field optional (null is absent), unknown keys ignored."""

    model_config = ConfigDict(extra="ignore")

    maintenance: StrictBool | None = None
    maintenance_msg: Annotated[StrictStr, Field(max_length=MAX_MAINTENANCE_MESSAGE_LENGTH)] | None = None
    paused: StrictBool | None = None
    info: Annotated[StrictStr, Field(max_length=MAX_INFO_LENGTH)] | None = None
    name: Annotated[StrictStr, Field(min_length=MIN_NAME_LENGTH, max_length=MAX_NAME_LENGTH)] | None = None
    team: Annotated[StrictStr, Field(max_length=MAX_TEAM_LENGTH)] | None = None


async def read_modify_body(request: Request, read_timeout: float) -> ModifyWorkerBody:
    """The validated body. 413 RequestTooLarge past 64 KiB; 408 RequestBodyTimeout; 400 BadRequest for a
    malformed Content-Length, invalid JSON, a body that is not an object, past 64 elements or 2 levels, a field
    of the wrong type or length, or a name holding colab, tpu or google; 400 NulByteInPayload for a NUL.
    An empty body is ``{}`` (then 400 NoWorkerModSelected once the key is checked)."""
    try:
        raw = await body_reader.read_json_body(request, MODIFY_BODY_LIMITS, read_timeout, allow_empty=True)
    except body_reader.BodyTooLarge as exc:
        raise HordeError(413, RC.RequestTooLarge, str(exc)) from None
    except body_reader.BodyReadTimeout as exc:
        raise HordeError(408, RC.RequestBodyTimeout, str(exc)) from None
    except (body_reader.InvalidContentLength, body_reader.JsonStructureError) as exc:
        raise HordeError(400, RC.BadRequest, f"Input payload validation failed: body: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise HordeError(400, RC.BadRequest, "Input payload validation failed: body: has to be a JSON object")
    try:
        body = ModifyWorkerBody.model_validate(raw)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    if body.name is not None:
        refusal = worker_name_refusal(body.name)
        if refusal is not None:
            raise refusal
    return body


@dataclass(frozen=True, slots=True)
class TargetWorker:
    """The worker being changed: its id and owner."""

    id: uuid.UUID
    user_id: int


async def find_worker(conn: Conn, worker_id: str) -> TargetWorker:
    """The worker of the path; 404 WorkerNotFound for a malformed or unknown id."""
    try:
        wid = uuid.UUID(worker_id)
    except ValueError:
        raise worker_not_found_error(worker_id[:MAX_ECHOED_ID]) from None
    row = await conn.fetchrow("SELECT id, user_id FROM workers WHERE id = $1", wid)
    if row is None:
        raise worker_not_found_error(worker_id[:MAX_ECHOED_ID])
    return TargetWorker(row["id"], int(row["user_id"]))


async def authenticate_editor(conn: Conn, apikey: str | None, salt: str) -> users.AuthenticatedUser:
    """The user changing the worker: 401 InvalidAPIKey for a missing or unknown key (a shared key is not a
    user's key here, as on pop); 403 DeletedUser."""
    if not apikey:
        raise invalid_api_key_error()
    editor = await users.authenticate(conn, apikey, salt, shared_keys=False)
    if editor is None:
        raise invalid_api_key_error()
    if editor.deleted:
        raise deleted_user_error()
    return editor


NOT_OWNER_MESSAGE = "Only this worker's owner or a moderator may change its maintenance, info, name or team."
NOT_MODERATOR_PAUSE_MESSAGE = "Only a moderator may pause or unpause a worker."


def permission_refusal(body: ModifyWorkerBody, *, owner: bool, moderator: bool) -> HordeError | None:
    """The 403 for the first field (in upstream's order) the editor may not set, or None."""
    allowed = owner or moderator
    if (body.maintenance is not None or body.info is not None) and not allowed:
        return HordeError(403, RC.NotOwner, NOT_OWNER_MESSAGE)
    if body.paused is not None and not moderator:
        return HordeError(403, RC.NotModerator, NOT_MODERATOR_PAUSE_MESSAGE)
    if (body.name is not None or body.team is not None) and not allowed:
        return HordeError(403, RC.NotModerator, NOT_OWNER_MESSAGE)
    return None


def _assignments(body: ModifyWorkerBody) -> dict[str, Any]:
    """The columns to write. A maintenance change resets the message to the default (NULL) unless it turns
    maintenance on with a non-empty ``maintenance_msg``, as upstream's toggle."""
    columns: dict[str, Any] = {}
    if body.maintenance is not None:
        columns["maintenance"] = body.maintenance
        columns["maintenance_msg"] = (
            body.maintenance_msg if body.maintenance and body.maintenance_msg else None
        )
    if body.info is not None:
        columns["info"] = body.info
    if body.paused is not None:
        columns["paused"] = body.paused
    if body.name is not None:
        columns["name"] = body.name
    return columns


async def modify_worker(
    conn: Conn, worker_id: str, body: ModifyWorkerBody, apikey: str | None, salt: str
) -> dict[str, Any]:
    """Apply ``body`` to the worker and answer upstream's ``ModifyWorker``: each field that was set, with its
    new value (``team``: ``"None"`` for a cleared team). Refusals in the order of the module docstring."""
    worker = await find_worker(conn, worker_id)
    editor = await authenticate_editor(conn, apikey, salt)
    refusal = permission_refusal(body, owner=int(editor.id) == worker.user_id, moderator=editor.moderator)
    if refusal is not None:
        raise refusal
    columns = _assignments(body)
    if not columns and body.team is None:
        raise HordeError(
            400, RC.NoWorkerModSelected, "The body sets none of maintenance, paused, info, name or team."
        )
    if body.team:
        # Teams are not kept by this horde, so no team id names one; "" (no team) is what every worker has.
        raise HordeError(404, RC.TeamNotFound, f"Team with ID '{body.team}' not found.")
    answer: dict[str, Any] = {}
    if columns:
        sets = ", ".join(f"{name} = ${i}" for i, name in enumerate(columns, start=2))
        try:
            row = await conn.fetchrow(
                f"UPDATE workers SET {sets} WHERE id = $1 RETURNING maintenance, paused, info, name",
                worker.id,
                *columns.values(),
            )
        except asyncpg.UniqueViolationError:
            raise HordeError(
                400, RC.WorkerNameAlreadyExists, f"The worker name '{body.name}' is already taken."
            ) from None
        if row is None:  # deleted since it was found
            raise worker_not_found_error(worker_id[:MAX_ECHOED_ID])
        answer = {key: row[key] for key in ("maintenance", "info", "paused", "name") if key in columns}
    if body.team is not None:
        answer["team"] = NO_TEAM
    return answer
