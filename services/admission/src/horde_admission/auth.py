"""API key authentication for the generate, status and cancel routes (docs/native-api.md#text-route headers, #kudos shared keys).

``apikey`` is required on generate routes; an unknown key is 401 InvalidAPIKey. A key that parses as a UUID is
first tried as a shared key, whose owner is the requester and is charged; the anonymous key ``0000000000``
is the user with id 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from horde_contract.errors import RC, HordeError
from horde_contract.refusals import deleted_user_error, invalid_api_key_error
from horde_core.metrics import requester_kind
from horde_store import users
from horde_store.db import Conn

ANONYMOUS_API_KEY = "0000000000"


@dataclass
class Requester:
    """The authenticated requester: the user (the shared key's owner when one is used)."""

    user_id: int
    username: str
    kudos: float
    min_kudos: float
    concurrency: int
    trusted: bool = False
    patron: bool = False
    flagged: bool = False
    anonymous: bool = False
    shared_key_id: str | None = None
    shared_key_kudos: float | None = None  # -1 is unlimited
    shared_key_max_text_tokens: int | None = None

    @property
    def kind(self) -> str:
        """The horde.requester metric attribute: anonymous, registered or shared_key."""
        return requester_kind(anonymous=self.anonymous, shared_key=bool(self.shared_key_id))


def _from_store(found: users.AuthenticatedUser) -> Requester:
    key = found.shared_key
    return Requester(
        user_id=int(found.id),
        username=found.username,
        kudos=float(found.kudos),
        min_kudos=float(found.min_kudos),
        concurrency=int(found.concurrency),
        trusted=found.trusted,
        patron=found.patron,
        flagged=found.flagged,
        anonymous=found.is_anonymous,
        shared_key_id=str(key.id) if key else None,
        shared_key_kudos=float(key.kudos) if key else None,
        shared_key_max_text_tokens=int(key.max_text_tokens) if key else None,
    )


async def resolve_api_key(conn: Conn, apikey: str | None, salt: str) -> users.AuthenticatedUser | None:
    """The user ``apikey`` resolves to (a shared key's owner, with the key), or None for a missing or
    unknown key. Refuses nothing: :func:`admit` applies the refusals. One query per step taken."""
    if not apikey:
        return None
    return await users.authenticate(conn, apikey, salt)


def admit(found: users.AuthenticatedUser | None) -> Requester:
    """The requester for a resolved key, with every refusal of a new submission.

    401 InvalidAPIKey for a missing or unknown key (``found`` None); 403 DeletedUser; for a shared key 403
    SharedKeyExpired and 403 SharedKeyEmpty (kudos 0). docs/native-api.md#text-route, #kudos.
    """
    if found is None:
        raise invalid_api_key_error()
    if found.deleted:
        raise deleted_user_error()
    key = found.shared_key
    if key is not None:
        if key.is_expired():
            raise HordeError(403, RC.SharedKeyExpired, "This shared key has expired.")
        if key.kudos == 0:
            raise HordeError(403, RC.SharedKeyEmpty, "This shared key has no kudos left.")
    return _from_store(found)


async def authenticate(conn: Conn, apikey: str | None, salt: str) -> Requester:
    """The requester for ``apikey`` (:func:`resolve_api_key`, then :func:`admit` and its refusals).

    401 InvalidAPIKey for a missing or unknown key; 403 DeletedUser; for a shared key 403 SharedKeyExpired
    and 403 SharedKeyEmpty (kudos 0). docs/native-api.md#text-route, #kudos.
    """
    return admit(await resolve_api_key(conn, apikey, salt))


def operation_key_owner(found: users.AuthenticatedUser | None) -> int | None:
    """The user id an operation key is claimed for (docs/native-api.md#operation-key): the key's user, the owner when it
    is a shared key, or None for a missing or unknown key or a deleted user.

    A shared key's expiry and kudos are not checked: a retry of a submit that used up or outlived its shared
    key still finds the request that submit created (200 ``{id, kudos}``), and nothing is created on this
    path. A submission whose key finds no claim is admitted with :func:`admit`, which refuses such a key.
    """
    if found is None or found.deleted:
        return None
    return int(found.id)
