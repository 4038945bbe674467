"""Object clean-up: the images and offloaded messages of expired chat requests, and the delete retry set
(docs/native-api.md#images, #messages-offload).

Keys ending in ``_chat_messages.json`` live in the messages bucket, every other key in the image bucket. A key
the store does not delete goes to the Redis set ``horde:chat:image_delete_retry`` (bounded at 100,000 keys;
past it keys are logged); each pass retries up to 1000 of them and removes each key that deletes. "Does not
delete" covers a failed DeleteObjects call (every key of it) and each key the call's answer lists under
``Errors`` (a per-key failure in an HTTP 200 answer): ``horde_store.objects.delete_objects`` decides.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from typing import Any

import redis.asyncio as redis
from horde_core.redis_keys import CHAT_IMAGE_DELETE_RETRY_KEY
from horde_store.objects import DELETE_OBJECTS_BATCH, delete_objects

log = logging.getLogger(__name__)

MESSAGES_SUFFIX = "_chat_messages.json"
MAX_CHAT_IMAGE_DELETE_RETRY_KEYS = 100_000
RETRY_BATCH = 1000
DELETE_BATCH = DELETE_OBJECTS_BATCH  # S3 DeleteObjects takes at most 1000 keys


class ObjectCleaner:
    """Deletes chat objects; ``client`` is a boto3 S3 client (calls run in a thread)."""

    def __init__(
        self, client: Any, image_bucket: str, messages_bucket: str, redis_client: redis.Redis
    ) -> None:
        self.client = client
        self.image_bucket = image_bucket
        self.messages_bucket = messages_bucket
        self.redis = redis_client

    def _bucket(self, key: str) -> str:
        return self.messages_bucket if key.endswith(MESSAGES_SUFFIX) else self.image_bucket

    def _delete_sync(self, keys: Sequence[str]) -> list[str]:
        """Delete ``keys``, each from its bucket; returns the keys that did not delete (a failed call's keys
        and the per-key ``Errors`` of a call that answered: :func:`horde_store.objects.delete_objects`)."""
        failed: list[str] = []
        by_bucket: dict[str, list[str]] = {}
        for key in keys:
            by_bucket.setdefault(self._bucket(key), []).append(key)
        for bucket, bucket_keys in by_bucket.items():
            failed.extend(delete_objects(self.client, bucket, bucket_keys))
        return failed

    async def delete(self, keys: Iterable[str]) -> int:
        """Delete ``keys``, queueing the ones that fail (the call failed, or the store refused that key) in
        the retry set; returns how many failed."""
        keys = list(dict.fromkeys(keys))
        if not keys:
            return 0
        failed = await asyncio.to_thread(self._delete_sync, keys)
        if failed:
            await self._queue(failed)
        return len(failed)

    async def _queue(self, keys: Sequence[str]) -> None:
        try:
            if await self.redis.scard(CHAT_IMAGE_DELETE_RETRY_KEY) >= MAX_CHAT_IMAGE_DELETE_RETRY_KEYS:
                log.error("chat object delete retry set full; keys left stored", extra={"keys": list(keys)})
                return
            await self.redis.sadd(CHAT_IMAGE_DELETE_RETRY_KEY, *keys)
        except Exception:
            log.error("chat object delete retry not queued", extra={"keys": list(keys)}, exc_info=True)

    async def retry(self) -> int:
        """Retry up to 1000 queued keys; returns how many deleted (and left the set). A key the store refuses
        again stays in the set for the next pass."""
        try:
            found = await self.redis.srandmember(CHAT_IMAGE_DELETE_RETRY_KEY, RETRY_BATCH)
        except Exception:
            log.warning("chat object delete retry set unreadable", exc_info=True)
            return 0
        # With a count Redis answers a list of members.
        if not isinstance(found, list) or not found:
            return 0
        keys = [k.decode() if isinstance(k, bytes) else k for k in found]
        failed = set(await asyncio.to_thread(self._delete_sync, list(keys)))
        done = [k for k in keys if k not in failed]
        if done:
            await self.redis.srem(CHAT_IMAGE_DELETE_RETRY_KEY, *done)
        return len(done)
