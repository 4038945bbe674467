"""The worker owner's API key on pop (docs/native-api.md#pop: apikey header; anonymous, flagged and
deleted users do not run workers)."""

from __future__ import annotations

from horde_contract import RC
from horde_contract.errors import HordeError
from horde_contract.refusals import deleted_user_error, invalid_api_key_error
from horde_store import users
from horde_store.db import Conn


def owner_refusal(anonymous: bool, deleted: bool, flagged: bool) -> HordeError | None:
    """The 403 an owner's worker gets on pop, or None: AnonForbiddenWorker, DeletedUser, then
    WorkerFlaggedMaintenance (a flagged owner). Checked at authentication and before each retry of a long poll."""
    if anonymous:
        return HordeError(403, RC.AnonForbiddenWorker, "Anonymous user is forbidden from running a worker.")
    if deleted:
        return deleted_user_error()
    if flagged:
        return HordeError(
            403,
            RC.WorkerFlaggedMaintenance,
            "Your account has been flagged, so your workers are in maintenance. Please contact the horde moderators.",
        )
    return None


async def authenticate_worker_owner(conn: Conn, apikey: str | None, salt: str) -> users.AuthenticatedUser:
    """The user a worker pops as.

    401 InvalidAPIKey (missing or unknown key, or a shared key: a spending key, never a worker's credential,
    matches no user here as upstream's ``find_user_by_api_key``); 403 AnonForbiddenWorker (the anonymous key);
    403 DeletedUser; 403 WorkerFlaggedMaintenance (a flagged owner). One query.
    """
    if not apikey:
        raise invalid_api_key_error()
    user = await users.authenticate(conn, apikey, salt, shared_keys=False)
    if user is None:
        raise invalid_api_key_error()
    refusal = owner_refusal(user.is_anonymous, user.deleted, user.flagged)
    if refusal is not None:
        raise refusal
    return user
