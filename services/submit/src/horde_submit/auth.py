"""The worker owner's key check of submit and progress (docs/native-api.md#submit: 401 InvalidAPIKey, 403 WrongCredentials)."""

from __future__ import annotations

from horde_contract.refusals import invalid_api_key_error, wrong_credentials_error
from horde_store.db import Conn
from horde_store.users import authenticate, hash_api_key


async def authenticate_owner(
    conn: Conn, apikey: str | None, salt: str, owner_id: int, owner_key_hash: str | None = None
) -> None:
    """Raise 401 InvalidAPIKey when ``apikey`` matches no user, 403 WrongCredentials when it is not the key of
    the worker's owner ``owner_id``.

    ``owner_key_hash`` (read with the generation) settles the common case without a query: the owner's own key.
    Any other key is looked up, to tell an unknown key (401) from another user's (403). A shared key is a
    spending key, never a worker's credential: it matches no user here (401, upstream ``find_user_by_api_key``),
    whoever owns it and whether or not it expired.
    """
    if apikey and owner_key_hash is not None and hash_api_key(apikey, salt) == owner_key_hash.strip():
        return
    user = await authenticate(conn, apikey, salt, shared_keys=False) if apikey else None
    if user is None:
        raise invalid_api_key_error(register_page=True)
    if int(user.id) != int(owner_id):
        raise wrong_credentials_error()
