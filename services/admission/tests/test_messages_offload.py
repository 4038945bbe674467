"""Messages offload at submit against the real S3 server of the fixtures (docs/native-api.md#messages-offload):
the size measured as a base64 worker receives the messages, the object's key, headers and body (plain or
gzip), the separate messages bucket, dry runs, and a store failure (503, no row, no object left)."""

from __future__ import annotations

import base64
import gzip
import json
import uuid
from typing import Any

import pytest
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model
from botocore.exceptions import ClientError
from test_images import VISION, data_url, image_body, png, s3_client

pytestmark = pytest.mark.asyncio(loop_scope="session")

OFFLOAD = {"chat_messages_offload_enabled": True}


def compact(messages: Any) -> bytes:
    return json.dumps(messages, ensure_ascii=False, separators=(",", ":")).encode()


async def post(client: Any, body: Any, key: str) -> Any:
    return await client.post("/api/v2/generate/chat/async", json=body, headers={"apikey": key})


def stored_object(env: dict[str, str], key: str, bucket: str | None = None) -> dict[str, Any] | None:
    """The object's GetObject answer with its body read (``body``), or None when it is not stored."""
    try:
        answer: dict[str, Any] = s3_client(env).get_object(
            Bucket=bucket or env["HORDE_S3_IMAGE_BUCKET"], Key=key
        )
    except ClientError as exc:
        if exc.response["Error"]["Code"] in ("NoSuchKey", "404"):
            return None
        raise
    answer["body"] = answer["Body"].read()
    return answer


def bucket_keys(env: dict[str, str], bucket: str | None = None) -> set[str]:
    pages = (
        s3_client(env)
        .get_paginator("list_objects_v2")
        .paginate(Bucket=bucket or env["HORDE_S3_IMAGE_BUCKET"])
    )
    return {item["Key"] for page in pages for item in page.get("Contents", [])}


async def row(db: Any, rid: str) -> Any:
    return await db.fetchrow("SELECT * FROM waiting_prompts WHERE id = $1", uuid.UUID(rid))


async def text_setup(db: Any) -> tuple[str, str]:
    model = unique_model()
    await add_chat_worker(db, model, image_transports=["messages_url"])
    _, key = await new_user(db)
    return model, key


async def test_threshold_is_the_largest_inline_size(
    make_client: Any, db: Any, admission_env: dict[str, str]
) -> None:
    model, key = await text_setup(db)
    body = chat_body(model, "é" * 400 + " long enough to offload")
    # The stored messages' compact JSON, UTF-8 (é is two bytes), is what is measured.
    probe = await make_client(**OFFLOAD, chat_messages_offload_bytes=10_000)
    first = await post(probe, body, key)
    assert first.status_code == 202, first.text
    stored = await row(db, first.json()["id"])
    size = len(compact(stored["messages"]))
    assert size > 800 and not stored["chat_messages_offloaded"]
    assert stored_object(admission_env, f"{first.json()['id']}_chat_messages.json") is None

    at_size = await make_client(**OFFLOAD, chat_messages_offload_bytes=size)
    inline = await post(at_size, body, key)
    assert inline.status_code == 202
    assert not (await row(db, inline.json()["id"]))["chat_messages_offloaded"]
    assert stored_object(admission_env, f"{inline.json()['id']}_chat_messages.json") is None

    below = await make_client(**OFFLOAD, chat_messages_offload_bytes=size - 1)
    over = await post(below, body, key)
    assert over.status_code == 202, over.text
    rid = over.json()["id"]
    offloaded = await row(db, rid)
    assert offloaded["chat_messages_offloaded"] and offloaded["active"]
    # The row keeps the messages: a worker without messages_url receives them inline.
    assert offloaded["messages"] == stored["messages"]
    obj = stored_object(admission_env, f"{rid}_chat_messages.json")
    assert obj is not None
    assert obj["ContentType"] == "application/json"
    assert obj["CacheControl"] == "no-transform"
    assert "ContentEncoding" not in obj
    assert json.loads(obj["body"]) == stored["messages"] and len(obj["body"]) == size


async def test_offload_off_never_offloads(make_client: Any, db: Any, admission_env: dict[str, str]) -> None:
    model, key = await text_setup(db)
    off = await make_client(chat_messages_offload_enabled=False, chat_messages_offload_bytes=16)
    r = await post(off, chat_body(model, "x" * 2000), key)
    assert r.status_code == 202, r.text
    assert not (await row(db, r.json()["id"]))["chat_messages_offloaded"]
    assert stored_object(admission_env, f"{r.json()['id']}_chat_messages.json") is None


async def test_gzip_is_kept_when_smaller(make_client: Any, db: Any, admission_env: dict[str, str]) -> None:
    model, key = await text_setup(db)
    gz = await make_client(**OFFLOAD, chat_messages_offload_bytes=1024, chat_messages_offload_gzip=True)
    r = await post(gz, chat_body(model, "the same words again " * 500), key)
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    stored = await row(db, rid)
    assert stored["chat_messages_offloaded"]
    obj = stored_object(admission_env, f"{rid}_chat_messages.json")
    assert obj is not None
    assert (obj["ContentType"], obj["CacheControl"], obj["ContentEncoding"]) == (
        "application/json",
        "no-transform",
        "gzip",
    )
    plain = compact(stored["messages"])
    assert len(obj["body"]) < len(plain)
    assert json.loads(gzip.decompress(obj["body"])) == stored["messages"]


async def test_gzip_larger_than_plain_is_stored_plain(
    make_client: Any, db: Any, admission_env: dict[str, str]
) -> None:
    model, key = await text_setup(db)
    # A tiny body: gzip's header and trailer make it larger, so the plain JSON is stored.
    gz = await make_client(**OFFLOAD, chat_messages_offload_bytes=16, chat_messages_offload_gzip=True)
    r = await post(gz, chat_body(model, "Qz7"), key)
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    stored = await row(db, rid)
    assert stored["chat_messages_offloaded"]
    obj = stored_object(admission_env, f"{rid}_chat_messages.json")
    assert obj is not None and "ContentEncoding" not in obj
    assert json.loads(obj["body"]) == stored["messages"]


async def test_images_are_inlined_in_the_object(
    make_client: Any, db: Any, admission_env: dict[str, str]
) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url", "messages_url"])
    user_id, key = await new_user(db, kudos=100)
    client = await make_client(**OFFLOAD, chat_messages_offload_bytes=1024)
    r = await post(client, image_body(model, data_url(png()), data_url(png(32, 32, "RGB"))), key)
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    stored = await row(db, rid)
    assert stored["chat_messages_offloaded"] and stored["has_images"]
    # The row keeps the references; the images are stored as without the offload.
    parts = stored["messages"][0]["content"]
    assert [p["image_url"]["url"] for p in parts[1:]] == [
        f"horde-r2://{rid}_chat_0.jpg",
        f"horde-r2://{rid}_chat_1.jpg",
    ]
    jpegs = [stored_object(admission_env, f"{rid}_chat_{n}.jpg") for n in range(2)]
    assert all(j is not None and j["ContentType"] == "image/jpeg" for j in jpegs)
    obj = stored_object(admission_env, f"{rid}_chat_messages.json")
    assert obj is not None
    inlined = json.loads(obj["body"])
    expected = json.loads(json.dumps(stored["messages"]))
    for n, jpeg in enumerate(jpegs):
        assert jpeg is not None
        expected[0]["content"][n + 1]["image_url"]["url"] = (
            "data:image/jpeg;base64," + base64.b64encode(jpeg["body"]).decode()
        )
    assert inlined == expected
    assert expected[0]["content"][1]["image_url"]["detail"] == "low"
    # The same JSON (the row's jsonb may order an object's keys otherwise), at the measured size.
    assert len(obj["body"]) == len(compact(expected))
    # the horde tax with two images: 1 + 2 * 5; the offload costs nothing
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 89.0


async def test_images_count_toward_the_size(make_client: Any, db: Any, admission_env: dict[str, str]) -> None:
    """The short text alone is under the threshold; inlined as base64, its image takes it over."""
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["base64", "messages_url"])
    _, key = await new_user(db)
    client = await make_client(**OFFLOAD, chat_messages_offload_bytes=400)
    body = image_body(model, data_url(png()))
    r = await post(client, body, key)
    assert r.status_code == 202, r.text
    stored = await row(db, r.json()["id"])
    assert len(compact(stored["messages"])) < 400
    assert stored["chat_messages_offloaded"]


async def test_messages_bucket_setting(make_client: Any, db: Any, admission_env: dict[str, str]) -> None:
    """HORDE_S3_MESSAGES_BUCKET (the spec's R2_CHAT_MESSAGES_BUCKET) puts the object in its own bucket."""
    bucket = f"messages-{uuid.uuid4().hex[:8]}"
    s3_client(admission_env).create_bucket(Bucket=bucket)
    model, key = await text_setup(db)
    client = await make_client(**OFFLOAD, chat_messages_offload_bytes=16, s3_messages_bucket=bucket)
    r = await post(client, chat_body(model, "to the other bucket"), key)
    assert r.status_code == 202, r.text
    object_key = f"{r.json()['id']}_chat_messages.json"
    assert stored_object(admission_env, object_key, bucket) is not None
    assert stored_object(admission_env, object_key) is None


async def test_dry_run_is_never_offloaded(make_client: Any, db: Any, admission_env: dict[str, str]) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url", "messages_url"])
    user_id, key = await new_user(db, kudos=100)
    client = await make_client(**OFFLOAD, chat_messages_offload_bytes=16, chat_messages_offload_gzip=True)
    before = bucket_keys(admission_env)
    r = await post(client, image_body(model, data_url(png()), horde={"dry_run": True}), key)
    assert r.status_code == 200, r.text
    assert r.json()["kudos"] > 0 and "id" not in r.json()
    assert bucket_keys(admission_env) == before
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 100.0


async def test_store_failure_is_503_and_leaves_nothing(
    make_client: Any, db: Any, admission_env: dict[str, str]
) -> None:
    """The images store (the image bucket exists), the messages object cannot (its bucket does not): the
    row and the images already stored are deleted, nothing is charged."""
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url", "messages_url"])
    user_id, key = await new_user(db, kudos=100)
    broken = await make_client(
        **OFFLOAD, chat_messages_offload_bytes=16, s3_messages_bucket=f"missing-{uuid.uuid4().hex[:8]}"
    )
    before = bucket_keys(admission_env)
    r = await post(broken, image_body(model, data_url(png()), data_url(png())), key)
    assert r.json() == {
        "message": "The request's images could not be stored; try again later. Nothing was charged.",
        "rc": "ChatImageStorageUnavailable",
    }
    assert r.status_code == 503
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 100.0
    assert bucket_keys(admission_env) == before


async def test_text_only_store_failure_is_503(make_client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, image_transports=["messages_url"])
    uid, key = await new_user(db, kudos=100)
    broken = await make_client(
        **OFFLOAD, chat_messages_offload_bytes=16, s3_messages_bucket=f"missing-{uuid.uuid4().hex[:8]}"
    )
    r = await post(broken, chat_body(model, "no bucket for these messages"), key)
    assert (r.status_code, r.json()["rc"]) == (503, "ChatImageStorageUnavailable")
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", uid) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", uid) == 100.0


async def test_failed_activation_deletes_the_object(
    make_client: Any, db: Any, admission_env: dict[str, str]
) -> None:
    """The object is stored before activation; a hold the user cannot cover refuses the activation, and the
    row and the object go."""
    model = unique_model()
    await add_chat_worker(
        db, model, max_context_length=16384, max_length=8192, speed=100.0, image_transports=["messages_url"]
    )
    user_id, key = await new_user(db, kudos=0)
    client = await make_client(**OFFLOAD, chat_messages_offload_bytes=16)
    before = bucket_keys(admission_env)
    r = await post(client, chat_body(model, "more than the free allowance", max_tokens=6000), key)
    assert (r.status_code, r.json()["rc"]) == (403, "KudosUpfront"), r.text
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    assert bucket_keys(admission_env) == before
