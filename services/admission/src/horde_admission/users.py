"""``GET /v2/find_user`` and ``GET /v2/users/{user_id}``: a user's details in upstream's ``UserDetails`` shape
(docs/native-api.md#find-user, #user-details).

Who sees what (upstream's privileges): every caller sees the public fields; the user itself (privilege 1: its
own key on either route) adds ``worker_ids``, ``sharedkey_ids``, ``active_generations``, ``vpn`` and ``special``;
a moderator (privilege 2, on ``/v2/users/{id}``) adds ``evaluating_kudos`` and ``suspicious`` as well. A shared
key on ``find_user`` finds its owner with the public fields only, the username marked ``(Shared Key[: name])``.
No answer holds an API key, a key hash or an address.

What the numbers count, as far as the tables hold them: ``kudos_details.accumulated`` is the kudos the user's
workers earned (``workers.kudos``; spending is not recorded per user); ``records.contribution.tokens`` and
``records.fulfillment.text`` sum the user's workers' ``contributions`` and ``fulfilments``; request-side
records are not kept, so they are 0.
"""

from __future__ import annotations

import uuid
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Path
from horde_contract.errors import RC, HordeError
from horde_contract.refusals import invalid_api_key_error
from horde_store import users
from horde_store.db import Conn

from horde_admission.state import AdmissionState, get_state

router = APIRouter(tags=["users"])

PUBLIC, OWNER, MODERATOR = 0, 1, 2
#: The largest user id (PostgreSQL ``bigint``); a longer or larger id names nobody.
MAX_USER_ID = 2**63 - 1
#: At most this many active generation ids are listed (the anonymous user lists none, as upstream).
MAX_ACTIVE_GENERATIONS = 1000

KUDOS_DETAIL_KEYS = (
    "accumulated",
    "gifted",
    "donated",
    "admin",
    "received",
    "recurring",
    "awarded",
    "styled",
)

_DETAILS_SQL = """
SELECT u.id, u.username, u.oauth_id, u.kudos, u.evaluating_kudos, u.trusted, u.flagged, u.deleted, u.moderator,
       u.education, u.service, u.concurrency, u.worker_invited,
       greatest(0, floor(extract(epoch FROM now() - u.created)))::bigint AS account_age,
       w.worker_count, w.worker_kudos, w.contributions, w.fulfilments, w.worker_ids,
       (SELECT count(*) FROM user_suspicions s WHERE s.user_id = u.id) AS suspicions
FROM users u
CROSS JOIN LATERAL (
    SELECT count(*) AS worker_count, coalesce(sum(kudos), 0) AS worker_kudos,
           coalesce(sum(contributions), 0) AS contributions, coalesce(sum(fulfilments), 0) AS fulfilments,
           coalesce(array_agg(id::text ORDER BY created, id) FILTER (WHERE id IS NOT NULL), '{}') AS worker_ids
    FROM workers WHERE user_id = u.id
) w
WHERE u.id = $1
"""
_OWNER_SQL = f"""
SELECT coalesce((SELECT array_agg(id::text ORDER BY created, id) FROM user_shared_keys WHERE user_id = $1), '{{}}')
           AS sharedkey_ids,
       coalesce((SELECT array_agg(id::text) FROM (
                    SELECT w.id FROM waiting_prompts w
                     WHERE w.user_id = $1 AND $1 <> {users.ANONYMOUS_USER_ID}
                       AND w.active AND NOT w.faulted AND NOT w.cancelled
                       AND (w.n > 0 OR EXISTS (SELECT 1 FROM processing_gens p WHERE p.wp_id = w.id
                                               AND NOT p.faulted AND NOT p.fake AND p.generation IS NULL))
                     ORDER BY w.created, w.id LIMIT {MAX_ACTIVE_GENERATIONS}) a), '{{}}') AS active_text
"""


def user_not_found_error(user_id: str) -> HordeError:
    """404 UserNotFound for ``user_id`` (quoted, cut to 64 characters)."""
    return HordeError(404, RC.UserNotFound, f"User with ID '{user_id[:64]}' not found.")


def parse_user_id(raw: str) -> int:
    """The numeric user id of the path; 404 UserNotFound for anything but ASCII digits up to MAX_USER_ID
    (an ``alias#id`` username included: only the number names a user, as upstream)."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or int(raw) > MAX_USER_ID:
        raise HordeError(
            404,
            RC.UserNotFound,
            f"User with ID '{raw[:64]}' not found. Use the numeric part of the user id: the 1 of 'alias#1'.",
        )
    return int(raw)


def _pseudonymous(oauth_id: str | None) -> bool:
    """An account not registered through an OAuth provider: no oauth id, or a generated UUID one (upstream
    stores a UUID for pseudonymous sign-ups). The anonymous user's ``anon`` is neither."""
    if oauth_id is None:
        return True
    try:
        uuid.UUID(oauth_id)
    except ValueError:
        return False
    return True


def _zero_amounts() -> dict[str, int]:
    return {"image": 0, "text": 0, "interrogation": 0}


async def user_details(conn: Conn, user_id: int, privilege: int) -> dict[str, Any] | None:
    """The ``UserDetails`` of ``user_id`` as seen with ``privilege`` (PUBLIC, OWNER or MODERATOR), or None when
    no such user exists. Two queries at most (the second for the owner's fields)."""
    row = await conn.fetchrow(_DETAILS_SQL, user_id)
    if row is None:
        return None
    kudos_details = dict.fromkeys(KUDOS_DETAIL_KEYS, 0.0)
    kudos_details["accumulated"] = round(float(row["worker_kudos"]), 2)
    details: dict[str, Any] = {
        "username": f"{row['username']}#{row['id']}",
        "id": int(row["id"]),
        "kudos": round(float(row["kudos"]), 2),
        "kudos_details": kudos_details,
        "usage": {},
        "contributions": {},
        "records": {
            "usage": {"megapixelsteps": 0.0, "tokens": 0},
            "contribution": {"megapixelsteps": 0.0, "tokens": int(row["contributions"])},
            "fulfillment": {**_zero_amounts(), "text": int(row["fulfilments"])},
            "request": _zero_amounts(),
            "style": _zero_amounts(),
        },
        "concurrency": int(row["concurrency"]),
        "worker_invited": int(row["worker_invited"]),
        "moderator": bool(row["moderator"]),
        "trusted": bool(row["trusted"]),
        "flagged": bool(row["flagged"]),
        "pseudonymous": _pseudonymous(row["oauth_id"]),
        "worker_count": int(row["worker_count"]),
        "account_age": int(row["account_age"]),
        "service": bool(row["service"]),
        "deleted": bool(row["deleted"]),
        "education": bool(row["education"]),
        "customizer": False,
        "styles": [],
    }
    if privilege >= OWNER:
        owned = await conn.fetchrow(_OWNER_SQL, user_id)
        assert owned is not None  # a SELECT without FROM always answers one row
        details["worker_ids"] = list(row["worker_ids"])
        details["sharedkey_ids"] = list(owned["sharedkey_ids"])
        details["vpn"] = False
        details["special"] = False
        active = list(owned["active_text"])
        details["active_generations"] = {"text": active} if active else {}
    if privilege >= MODERATOR:
        details["evaluating_kudos"] = round(float(row["evaluating_kudos"]), 2)
        details["suspicious"] = int(row["suspicions"])
    return details


@router.get("/v2/find_user")
async def find_user(
    state: Annotated[AdmissionState, Depends(get_state)],
    apikey: Annotated[str | None, Header(description="The key whose user to find")] = None,
) -> dict[str, Any]:
    """The details of the user ``apikey`` belongs to (its own fields included); a shared key finds its owner
    with the public fields, the username marked as a shared key's.

    401 InvalidAPIKey for a missing or unknown key. docs/native-api.md#find-user.
    """
    async with state.pool.acquire() as conn:
        found = await users.authenticate(conn, apikey, state.settings.secret_key) if apikey else None
        if found is None:
            raise invalid_api_key_error()
        key = found.shared_key
        details = await user_details(conn, int(found.id), PUBLIC if key is not None else OWNER)
    if details is None:  # deleted between the two reads
        raise invalid_api_key_error()
    if key is not None:
        label = f": {key.name}" if key.name else ""
        details["username"] = f"{details['username']} (Shared Key{label})"
    return details


@router.get("/v2/users/{user_id}")
async def user_by_id(
    state: Annotated[AdmissionState, Depends(get_state)],
    user_id: Annotated[str, Path(description="The numeric user id (the 1 of alias#1)")],
    apikey: Annotated[str | None, Header(description="Optional: the user's own or a moderator's key")] = None,
) -> dict[str, Any]:
    """A user's details: public, or with the user's own key its own fields, or with a moderator's key the
    moderator fields too.

    404 UserNotFound for an unknown or non-numeric id; 401 InvalidAPIKey for an unknown key (a shared key is
    not a user's key here). docs/native-api.md#user-details.
    """
    wanted = parse_user_id(user_id)
    async with state.pool.acquire() as conn:
        privilege = PUBLIC
        if apikey:
            viewer = await users.authenticate(conn, apikey, state.settings.secret_key, shared_keys=False)
            if viewer is None:
                raise invalid_api_key_error()
            if viewer.moderator:
                privilege = MODERATOR
            elif int(viewer.id) == wanted:
                privilege = OWNER
        details = await user_details(conn, wanted, privilege)
    if details is None:
        raise user_not_found_error(user_id)
    return details
