"""Admission's image deletes (a failed activation deletes the images the submission stored) queue every key the
store does not delete, per-key errors included, in the retry set the janitor drains.

See docs/native-api.md#images ("A failed activation deletes the images the submission stored. A key the
store does not delete is added to the Redis set horde:chat:image_delete_retry on the primary").
Runs against the session's real S3 server (moto): a bucket policy refusing s3:DeleteObject on one key makes
DeleteObjects answer HTTP 200 with that key under ``Errors``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from horde_admission.images import ImageStore
from horde_core.redis_keys import CHAT_IMAGE_DELETE_RETRY_KEY, redis_client

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest.fixture
def guarded_bucket(s3_endpoint: Any) -> Iterator[tuple[Any, str]]:
    """A bucket of its own (a policy on the shared image bucket would reach other tests), removed afterwards."""
    client = s3_endpoint.client()
    bucket = f"admission-keyerr-{uuid.uuid4().hex[:10]}"
    client.create_bucket(Bucket=bucket)
    try:
        yield client, bucket
    finally:
        client.delete_bucket_policy(Bucket=bucket)
        for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=item["Key"])
        client.delete_bucket(Bucket=bucket)


def stored(client: Any, bucket: str, key: str) -> bool:
    return bool(client.list_objects_v2(Bucket=bucket, Prefix=key).get("KeyCount", 0))


async def test_a_key_the_store_refuses_to_delete_is_queued_for_retry(
    guarded_bucket: tuple[Any, str], admission_env: dict[str, str]
) -> None:
    client, bucket = guarded_bucket
    cache = redis_client(admission_env["HORDE_REDIS_URL"])
    images = ImageStore(client, bucket, cache)
    request_id = uuid.uuid4()
    keys = await images.put_all(request_id, [b"jpeg-0", b"jpeg-1", b"jpeg-2"])
    assert keys == [f"{request_id}_chat_{n}.jpg" for n in range(3)]
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Deny",
                "Principal": "*",
                "Action": "s3:DeleteObject",
                "Resource": f"arn:aws:s3:::{bucket}/{keys[1]}",
            }
        ],
    }
    client.put_bucket_policy(Bucket=bucket, Policy=json.dumps(policy))
    try:
        await images.delete(keys)
        queued = await cache.smembers(CHAT_IMAGE_DELETE_RETRY_KEY)
        assert keys[1] in queued
        assert keys[0] not in queued and keys[2] not in queued
        assert [stored(client, bucket, k) for k in keys] == [False, True, False]
    finally:
        await cache.srem(CHAT_IMAGE_DELETE_RETRY_KEY, *keys)
        await cache.aclose()
