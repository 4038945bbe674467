"""Retries of one client call are one operation (beyond the spec; docs/openai-front.md#retries-and-idempotency).

The OpenAI SDKs retry a 408, 409, 429, 5xx or dropped connection with the same body, and many clients send an
``Idempotency-Key``. The front gives every retry of a call the native ``horde.operation_key`` of its first
attempt, so the Horde answers the retry with the first request (200 ``{id, kudos}``, docs/native-api.md
#operation-key): no second row, no second charge, and the client gets the first request's outcome.

A call is named by its *call key*: SHA-256 over its caller (the API key's digest) and either the client's
Idempotency-Key or ``horde.operation_key`` (kind ``idem``) or the request digest (kind ``body``: the native body without its
stream flag and operation key). Its record ``horde:oai:operation:<call key>`` is a hash on the front's stream
database, kept :data:`OPERATION_RECORD_TTL_SECONDS` (the native request's expiry). Calls with the shared
anonymous key keep no record (:data:`NO_RECORDS`): its callers cannot be told apart, so they never join.

- ``op``: the operation key every attempt of the call submits with;
- ``state``: ``open`` (a connection waits on it), ``retryable`` (none does: the last one ended with an error a
  retry may fix, or dropped; after the grace, a request that still runs or has its reply), ``delivered`` (its completion was sent) or ``final`` (an idem call's settled
  error, kept in ``error`` and replayed);
- ``live``: the connections waiting on it now.

Which attempt takes over a record (:data:`horde_core.operation_records.CLAIM_SCRIPT`):

=========== ================= ========================== ================================
record      kind idem         kind body, declared retry  kind body, otherwise
=========== ================= ========================== ================================
none        new               new                        new
open        joins             joins                      new (a concurrent identical call)
retryable   joins             joins                      joins
delivered   joins             joins                      new
final       replays the error (deleted instead)          (deleted instead)
=========== ================= ========================== ================================

A declared retry carries ``x-stainless-retry-count`` above 0 (the OpenAI SDKs). A body call whose error
settled it (``x-should-retry: false``) deletes its record, so a later identical call is a new operation. Every
record operation is best effort: a Redis failure makes the call its own operation, never fails it. Without
Redis no record is kept: an idem call's operation key is derived from its key, so the Horde still answers its
retries with the first request, and every other call is its own operation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

import redis.asyncio as redis
from horde_contract import RC
from horde_core.operation_records import ABANDON_SCRIPT, CLAIM_SCRIPT, END_SCRIPT, LIVE_SCRIPT
from horde_core.redis_keys import operation_record_key

from horde_oai.errors import OpenAIError

log = logging.getLogger(__name__)

# The native request expires 20 minutes after submission; a retry after that has nothing to join.
OPERATION_RECORD_TTL_SECONDS = 20 * 60
IDEMPOTENCY_KEY_HEADER = "idempotency-key"
SDK_RETRY_COUNT_HEADER = "x-stainless-retry-count"
# A call whose attempt met an error before anything was queued (a 429, a 502 at submit) waits this long for a
# retry: the SDKs wait at most 60 s (a Retry-After they honour), so a flood of refused calls leaves no
# 20-minute records.
UNQUEUED_RECORD_TTL_SECONDS = 120
# The longest Idempotency-Key the front takes (the IETF draft sets none; Stripe's is 255).
MAX_IDEMPOTENCY_KEY_LENGTH = 255
# Namespace of the operation keys derived from an Idempotency-Key when the front runs without Redis.
IDEMPOTENCY_NAMESPACE = uuid.UUID("0f4b6a52-6d1f-4c55-9c7e-2b8f0a1d7e93")


def idempotency_key_of(headers: Any) -> str | None:
    """The ``Idempotency-Key`` header, stripped; None when absent or blank. Raises 400 BadRequest past
    :data:`MAX_IDEMPOTENCY_KEY_LENGTH` characters."""
    value = headers.get(IDEMPOTENCY_KEY_HEADER)
    value = value.strip() if isinstance(value, str) else ""
    if len(value) > MAX_IDEMPOTENCY_KEY_LENGTH:
        raise OpenAIError(
            400,
            f"The Idempotency-Key header is longer than {MAX_IDEMPOTENCY_KEY_LENGTH} characters.",
            RC.BadRequest,
        )
    return value or None


def normal_operation_key(value: Any) -> str | None:
    """A ``horde.operation_key`` in its canonical UUID spelling (so spellings of one key are one call), the
    value as given when it is no UUID (the contract refuses it), None when absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return value


def operation_conflict(client_operation_key: bool) -> OpenAIError:
    """400 OperationKeyConflict: the key already names a settled call with another body."""
    what = "horde.operation_key" if client_operation_key else "Idempotency-Key"
    return OpenAIError(
        400,
        f"This {what} already identifies a different request.",
        RC.OperationKeyConflict,
        param="horde.operation_key" if client_operation_key else None,
    )


def declared_retry(headers: Any) -> bool:
    """True when the attempt says it is a retry: ``x-stainless-retry-count`` above 0."""
    value = headers.get(SDK_RETRY_COUNT_HEADER)
    try:
        return value is not None and int(value) > 0
    except ValueError:
        return False


@dataclass(slots=True)
class Call:
    """One attempt's hold on its call's record. ``tracked`` is False without a record (no Redis, or a Redis
    failure at the claim): then ending, dropping and closing do nothing, and a dropped call is abandoned."""

    records: OperationRecords
    call_key: str
    operation_key: str
    kind: str
    joined: bool
    tracked: bool
    ended: bool = False

    async def end(
        self, outcome: str, error: OpenAIError | None = None, *, ttl: int = OPERATION_RECORD_TTL_SECONDS
    ) -> None:
        """The attempt ended: ``delivered`` (completion sent), ``retryable`` (an error a retry of the same call
        may fix: ``x-should-retry: true``), ``dropped`` (the client left; :meth:`abandon` after the grace
        decides), ``final`` (an error that settled a request the Horde created: an idem call replays it) or
        ``refused`` (an error that settled the call before any request existed: the record goes, so a later
        attempt is a new operation). Once per attempt."""
        if self.ended:
            return
        self.ended = True
        if self.tracked:
            payload = json.dumps(error.to_record()) if error is not None else ""
            await self.records.run(
                END_SCRIPT, self.call_key, self.operation_key, outcome, payload, self.kind, ttl
            )

    async def end_with(self, error: OpenAIError, *, created: bool) -> None:
        """End with ``error``: ``retryable`` when it says ``x-should-retry: true``, else ``final`` for a request
        the Horde ``created``, ``refused`` otherwise. A joined attempt refused at submit (another body under the
        same Idempotency-Key: 400 OperationKeyConflict) only lets go: the call belongs to its first attempt."""
        if error.should_retry or (self.joined and not created):
            unqueued = not created and not self.joined
            await self.end(
                "retryable",
                error,
                ttl=UNQUEUED_RECORD_TTL_SECONDS if unqueued else OPERATION_RECORD_TTL_SECONDS,
            )
        else:
            await self.end("final" if created else "refused", error)

    async def joined_meanwhile(self) -> bool:
        """After a dropped attempt's grace: True when a retry of the call is waiting on it now."""
        if not self.tracked:
            return False
        found = await self.records.run(LIVE_SCRIPT, self.call_key, self.operation_key)
        return found is not None and int(found) > 0

    async def abandon(self, leave: str | None) -> None:
        """The dropped call's request was cancelled: leave its record ``retryable`` (a request the Horde still
        charges, whose reply a later retry may have) or ``delivered`` (its client resumed it another way), or
        delete it (None: a later identical call is a new operation). A retry that joined meanwhile keeps it."""
        if self.tracked:
            await self.records.run(ABANDON_SCRIPT, self.call_key, self.operation_key, leave or "")


class OperationRecords:
    """The call records on ``client`` (None: no records, see the module docstring)."""

    def __init__(self, client: redis.Redis | None) -> None:
        self.client = client

    def untracked(self) -> Call:
        """A call without a record (a resumed stream, which is no new call)."""
        return Call(self, "", "", "body", joined=False, tracked=False)

    async def run(self, script: str, call_key: str, *args: Any) -> Any:
        """Run a record script; None when Redis failed (logged)."""
        if self.client is None:
            return None
        try:
            return await self.client.eval(script, 1, operation_record_key(call_key), *args)
        except Exception:
            log.warning("operation record script failed", exc_info=True)
            return None

    async def claim(
        self,
        caller: str,
        body_digest: str,
        *,
        idempotency_key: str | None,
        client_operation_key: str | None,
        declared: bool,
    ) -> Call | OpenAIError:
        """The attempt's :class:`Call`, or the settled error an idem call replays.

        ``caller`` names the caller (see the module docstring), ``body_digest`` is the request digest,
        ``idempotency_key`` the header, ``client_operation_key`` a ``horde.operation_key`` the client chose (it
        then stays the operation key), ``declared`` whether the attempt declares itself a retry.
        """
        if client_operation_key:
            kind, ident = "idem", f"op:{client_operation_key}"
        elif idempotency_key is not None:
            kind, ident = "idem", f"key:{idempotency_key}"
        else:
            kind, ident = "body", f"body:{body_digest}"
        call_key = hashlib.sha256(f"{caller}\n{ident}".encode("utf-8", "surrogatepass")).hexdigest()
        if client_operation_key:
            fresh = client_operation_key
        elif kind == "idem" and self.client is None:
            fresh = str(uuid.uuid5(IDEMPOTENCY_NAMESPACE, call_key))
        else:
            fresh = str(uuid.uuid4())
        found = await self.run(
            CLAIM_SCRIPT,
            call_key,
            fresh,
            kind,
            "1" if declared else "0",
            OPERATION_RECORD_TTL_SECONDS,
            body_digest,
        )
        if not isinstance(found, list) or len(found) != 2:
            return Call(self, call_key, fresh, kind, joined=False, tracked=False)
        verdict, value = str(found[0]), str(found[1])
        if verdict == "conflict":
            return operation_conflict(bool(client_operation_key))
        if verdict == "final":
            replayed = OpenAIError.from_record(value)
            if replayed is not None:
                return replayed
            return Call(self, call_key, fresh, kind, joined=False, tracked=False)
        return Call(self, call_key, value, kind, joined=verdict == "joined", tracked=True)


# Calls that keep no record (the shared anonymous key's).
NO_RECORDS = OperationRecords(None)
