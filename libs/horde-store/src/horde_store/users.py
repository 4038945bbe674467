"""Users, API keys and shared keys (docs/native-api.md#text-route, #kudos).

API keys are stored as ``sha256_hex(salt + key)`` (upstream ``horde/utils.py hash_api_key``), the salt
being ``HORDE_SECRET_KEY``. The anonymous key ``0000000000`` maps to user id 0 whatever the salt.
A key that parses as a UUID is first tried as a shared-key id (the owner is returned with the key).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
from asyncpg.pool import PoolConnectionProxy

ANONYMOUS_API_KEY = "0000000000"
ANONYMOUS_USER_ID = 0
#: The salt used when ``HORDE_SECRET_KEY`` is unset (horde_core.settings.HordeSettings default).
DEV_SECRET_KEY = "horde-chat-dev-salt"

_USER_COLUMNS = (
    "id, username, api_key_hash, oauth_id, kudos, min_kudos, evaluating_kudos, trusted, patron, flagged, "
    "deleted, moderator, education, service, concurrency, worker_invited, created"
)
_KEY_COLUMNS = "id, user_id, name, kudos, utilized, expiry, max_text_tokens, created"


class UserNotFound(LookupError):
    """No user with that username/id."""


class UserExists(ValueError):
    """The username is taken."""


def hash_api_key(key: str, salt: str) -> str:
    """``sha256(salt + key)`` as 64 lowercase hex characters."""
    return hashlib.sha256(salt.encode("utf-8") + key.encode("utf-8")).hexdigest()


def generate_api_key() -> str:
    """A new random API key: 22 URL-safe characters (16 random bytes)."""
    return secrets.token_urlsafe(16)


@dataclass(frozen=True)
class SharedKeyInfo:
    """A shared key (``user_shared_keys`` row). ``kudos`` -1 = unlimited; ``max_text_tokens`` -1 =
    unlimited; ``expiry`` None = never (aware UTC datetime otherwise)."""

    id: uuid.UUID
    user_id: int
    name: str | None
    kudos: float
    utilized: float
    expiry: datetime | None
    max_text_tokens: int
    created: datetime

    @property
    def unlimited(self) -> bool:
        return self.kudos == -1

    def is_expired(self, now: datetime | None = None) -> bool:
        """True once ``expiry`` has passed (403 SharedKeyExpired is the caller's to raise)."""
        return self.expiry is not None and self.expiry <= (now or datetime.now(UTC))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["id"] = str(self.id)
        data["expiry"] = self.expiry.isoformat() if self.expiry else None
        data["created"] = self.created.isoformat()
        return data


@dataclass(frozen=True)
class UserRecord:
    """A ``users`` row. ``api_key_hash`` is None only for the anonymous user."""

    id: int
    username: str
    api_key_hash: str | None
    oauth_id: str | None
    kudos: float
    min_kudos: float
    evaluating_kudos: float
    trusted: bool
    patron: bool
    flagged: bool
    deleted: bool
    moderator: bool
    education: bool
    service: bool
    concurrency: int
    worker_invited: int
    created: datetime

    @property
    def is_anonymous(self) -> bool:
        return self.id == ANONYMOUS_USER_ID

    def to_json(self) -> dict[str, Any]:
        """The operator view (no key hash)."""
        data = asdict(self)
        data.pop("api_key_hash")
        data["created"] = self.created.isoformat()
        return data


@dataclass(frozen=True)
class AuthenticatedUser(UserRecord):
    """The user an API key resolved to; ``shared_key`` is set when the key was a shared key (the
    user is then its owner, who is charged). Flags such as ``deleted``/``flagged`` and an expired or
    empty shared key are the caller's to refuse."""

    shared_key: SharedKeyInfo | None = None


def _user(row: asyncpg.Record) -> UserRecord:
    return UserRecord(**{k: row[k] for k in UserRecord.__dataclass_fields__})


def _authenticated(row: asyncpg.Record, shared_key: SharedKeyInfo | None = None) -> AuthenticatedUser:
    # Straight from the row: dataclasses.asdict deep-copies, a few percent of an authenticated route's CPU.
    return AuthenticatedUser(**{k: row[k] for k in UserRecord.__dataclass_fields__}, shared_key=shared_key)


def _key(row: asyncpg.Record) -> SharedKeyInfo:
    return SharedKeyInfo(**{k: row[k] for k in SharedKeyInfo.__dataclass_fields__})


def _parse_uuid(value: str) -> uuid.UUID | None:
    try:
        return uuid.UUID(value)
    except ValueError:
        return None


async def authenticate(
    conn: asyncpg.Connection | PoolConnectionProxy | asyncpg.Pool,
    apikey: str,
    salt: str,
    *,
    shared_keys: bool = True,
) -> AuthenticatedUser | None:
    """Resolve an ``apikey`` header to its user, or None for an unknown key (401 InvalidAPIKey).

    Order (§1): the anonymous key; a UUID-looking key as a shared-key id (owner + ``shared_key``);
    otherwise (or when no such shared key exists) the salted hash. One query per step taken.
    ``conn`` is an asyncpg connection or pool.

    ``shared_keys=False`` resolves only a user's own key (upstream ``find_user_by_api_key``): the worker
    routes (pop, submit, progress) take the worker owner's key, and a shared key is a spending key only, so
    there it matches no user (401 InvalidAPIKey).
    """
    if not apikey:
        return None
    if apikey == ANONYMOUS_API_KEY:
        row = await conn.fetchrow(f"SELECT {_USER_COLUMNS} FROM users WHERE id = $1", ANONYMOUS_USER_ID)
        return _authenticated(row) if row else None
    key_id = _parse_uuid(apikey) if shared_keys else None
    if key_id is not None:
        row = await conn.fetchrow(
            f"""
            SELECT {", ".join("u." + c.strip() for c in _USER_COLUMNS.split(","))},
                   k.id AS k_id, k.user_id AS k_user_id, k.name AS k_name, k.kudos AS k_kudos,
                   k.utilized AS k_utilized, k.expiry AS k_expiry, k.max_text_tokens AS k_max_text_tokens,
                   k.created AS k_created
            FROM user_shared_keys k JOIN users u ON u.id = k.user_id
            WHERE k.id = $1
            """,
            key_id,
        )
        if row is not None:
            shared = SharedKeyInfo(**{f: row["k_" + f] for f in SharedKeyInfo.__dataclass_fields__})
            return _authenticated(row, shared)
    row = await conn.fetchrow(
        f"SELECT {_USER_COLUMNS} FROM users WHERE api_key_hash = $1", hash_api_key(apikey, salt)
    )
    return _authenticated(row) if row else None


async def get_user(
    conn: asyncpg.Connection, *, username: str | None = None, user_id: int | None = None
) -> UserRecord:
    """The user by ``username`` or ``user_id``; raises UserNotFound."""
    if (username is None) == (user_id is None):
        raise ValueError("give exactly one of username and user_id")
    if username is not None:
        row = await conn.fetchrow(f"SELECT {_USER_COLUMNS} FROM users WHERE username = $1", username)
    else:
        row = await conn.fetchrow(f"SELECT {_USER_COLUMNS} FROM users WHERE id = $1", user_id)
    if row is None:
        raise UserNotFound(f"no user {username!r}" if username is not None else f"no user with id {user_id}")
    return _user(row)


async def create_user(
    conn: asyncpg.Connection,
    username: str,
    *,
    salt: str,
    api_key: str | None = None,
    kudos: float = 0.0,
    trusted: bool = False,
    patron: bool = False,
    flagged: bool = False,
    concurrency: int = 30,
    min_kudos: float = 25.0,
    oauth_id: str | None = None,
) -> tuple[UserRecord, str]:
    """Create a user; return ``(user, api_key)``. The key (generated when None) is stored hashed
    with ``salt`` and is never recoverable. Raises UserExists when the username is taken."""
    if not username or len(username) > 100:
        raise ValueError("username must be 1-100 characters")
    key = api_key or generate_api_key()
    try:
        row = await conn.fetchrow(
            f"""
            INSERT INTO users (username, api_key_hash, oauth_id, kudos, trusted, patron, flagged, concurrency,
                               min_kudos)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
            RETURNING {_USER_COLUMNS}
            """,
            username,
            hash_api_key(key, salt),
            oauth_id,
            float(kudos),
            trusted,
            patron,
            flagged,
            concurrency,
            float(min_kudos),
        )
    except asyncpg.UniqueViolationError as exc:
        raise UserExists(f"user {username!r} already exists") from exc
    assert row is not None
    return _user(row), key


_SETTABLE = {
    "kudos",
    "min_kudos",
    "trusted",
    "patron",
    "flagged",
    "deleted",
    "moderator",
    "education",
    "service",
    "concurrency",
    "worker_invited",
}


async def set_user(conn: asyncpg.Connection, username: str, **changes: Any) -> UserRecord:
    """Update the given columns (``kudos``, ``trusted``, ``patron``, ``flagged``, ``concurrency``,
    ``min_kudos``, ``deleted``, …; None values are skipped) and return the user.

    ``kudos`` sets the balance (it does not add). Raises UserNotFound, ValueError for an unknown column.
    """
    values = {k: v for k, v in changes.items() if v is not None}
    unknown = set(values) - _SETTABLE
    if unknown:
        raise ValueError(f"cannot set {sorted(unknown)}")
    if not values:
        return await get_user(conn, username=username)
    assignments = ", ".join(f"{col} = ${i}" for i, col in enumerate(values, start=2))
    row = await conn.fetchrow(
        f"UPDATE users SET {assignments} WHERE username = $1 RETURNING {_USER_COLUMNS}",
        username,
        *values.values(),
    )
    if row is None:
        raise UserNotFound(f"no user {username!r}")
    return _user(row)


async def create_shared_key(
    conn: asyncpg.Connection,
    username: str,
    *,
    kudos: float = 5000,
    expiry_days: int | None = None,
    max_text_tokens: int = -1,
    name: str | None = None,
) -> SharedKeyInfo:
    """Create a shared key for ``username`` and return it; its ``id`` is the key to send as ``apikey``.

    ``kudos`` -1 = unlimited (§5 input range -1..50,000,000); ``expiry_days`` None or -1 = never;
    ``max_text_tokens`` -1 = unlimited (-1..500). Raises UserNotFound, ValueError for out-of-range values.
    """
    if not (kudos == -1 or 0 <= kudos <= 50_000_000):
        raise ValueError("kudos must be -1 (unlimited) or 0..50000000")
    if not (max_text_tokens == -1 or 1 <= max_text_tokens <= 500):
        raise ValueError("max_text_tokens must be -1 (unlimited) or 1..500")
    if name is not None and len(name) > 255:
        raise ValueError("name must be at most 255 characters")
    expiry = None
    if expiry_days is not None and expiry_days != -1:
        if expiry_days < 1:
            raise ValueError("expiry_days must be -1 (never) or a positive number of days")
        expiry = datetime.now(UTC) + timedelta(days=expiry_days)
    row = await conn.fetchrow(
        f"""
        INSERT INTO user_shared_keys (user_id, name, kudos, expiry, max_text_tokens)
        SELECT id, $2, $3, $4, $5 FROM users WHERE username = $1
        RETURNING {_KEY_COLUMNS}
        """,
        username,
        name,
        float(kudos),
        expiry,
        max_text_tokens,
    )
    if row is None:
        raise UserNotFound(f"no user {username!r}")
    return _key(row)
