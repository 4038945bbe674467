"""Messages offload: a large chat request's whole messages array stored as one object at submit
(docs/native-api.md#messages-offload).

The size compared with ``HORDE_CHAT_MESSAGES_OFFLOAD_BYTES`` is the compact JSON of the messages as a worker
that receives images as base64 gets them: each ``horde-r2://<request id>_chat_<n>.jpg`` reference inlined as
``data:image/jpeg;base64,`` of the stored JPEG. Over it, that same JSON is the object, keyed
``<request id>_chat_messages.json`` in the messages bucket (``HORDE_S3_MESSAGES_BUCKET``, the image bucket
unless set), stored with ``Content-Type: application/json`` and ``Cache-Control: no-transform``; with
``HORDE_CHAT_MESSAGES_OFFLOAD_GZIP`` the body is gzipped and kept only when smaller, with
``Content-Encoding: gzip``. The row is written with ``chat_messages_offloaded`` set and the object is stored
before activation, with the images (:mod:`horde_admission.creation`). A dry run is never offloaded: it
returns before anything is measured.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import gzip
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from horde_contract.limits import CHAT_IMAGE_REFERENCE_SCHEME
from horde_store.objects import chat_image_key, chat_messages_key, delete_objects

from horde_admission.images import ImageStore
from horde_admission.settings import AdmissionSettings

log = logging.getLogger(__name__)

MESSAGES_CONTENT_TYPE = "application/json"
#: Object stores that honour it (R2, Garage) serve a gzip-stored body as stored, whatever the client accepts.
MESSAGES_CACHE_CONTROL = "no-transform"
GZIP_LEVEL = 6


@dataclass(frozen=True)
class OffloadedMessages:
    """The messages object to store: ``key`` in the messages bucket, the ``body`` bytes as stored and
    ``content_encoding`` (``gzip``, or None for plain JSON). ``size`` is the measured (uncompressed) size."""

    key: str
    body: bytes
    content_encoding: str | None
    size: int


def inline_images(
    messages: Sequence[Mapping[str, Any]], request_id: object, jpegs: Sequence[bytes]
) -> list[dict[str, Any]]:
    """A copy of the stored ``messages`` with each ``horde-r2://`` image reference of this request replaced by
    ``data:image/jpeg;base64,`` of its JPEG (``jpegs[n]`` for ``<request id>_chat_<n>.jpg``): what a worker
    that declared only base64 receives (dispatch's ``worker_messages``)."""
    by_reference = {
        f"{CHAT_IMAGE_REFERENCE_SCHEME}{chat_image_key(request_id, n)}": data for n, data in enumerate(jpegs)
    }
    out: list[dict[str, Any]] = copy.deepcopy([dict(m) for m in messages])
    if not by_reference:
        return out
    for message in out:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            image = part.get("image_url") if isinstance(part, dict) else None
            if isinstance(image, dict) and image.get("url") in by_reference:
                data = by_reference[image["url"]]
                image["url"] = "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")
    return out


def compact_json(messages: Sequence[Mapping[str, Any]]) -> bytes:
    """The compact JSON (no spaces, UTF-8, non-ASCII unescaped) the pop response would carry: the bytes
    measured and stored."""
    return json.dumps(messages, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def build_object(
    settings: AdmissionSettings,
    messages: Sequence[Mapping[str, Any]],
    request_id: object,
    jpegs: Sequence[bytes],
) -> OffloadedMessages | None:
    """The messages object for a request about to be created, or None when it stays inline (offload off, or
    the inlined size at most ``chat_messages_offload_bytes``). CPU-bound (JSON, base64, gzip): call it in a
    thread (:func:`plan`)."""
    if not settings.chat_messages_offload_enabled:
        return None
    body = compact_json(inline_images(messages, request_id, jpegs))
    size = len(body)
    if size <= settings.chat_messages_offload_bytes:
        return None
    encoding: str | None = None
    if settings.chat_messages_offload_gzip:
        # mtime=0: the same messages give the same bytes (no timestamp in the gzip header).
        packed = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
        if len(packed) < size:
            body, encoding = packed, "gzip"
    return OffloadedMessages(chat_messages_key(request_id), body, encoding, size)


async def plan(
    settings: AdmissionSettings,
    messages: Sequence[Mapping[str, Any]],
    request_id: object,
    jpegs: Sequence[bytes],
) -> OffloadedMessages | None:
    """:func:`build_object` off the event loop (a body can be tens of MiB); None without the offload."""
    if not settings.chat_messages_offload_enabled:
        return None
    return await asyncio.to_thread(build_object, settings, messages, request_id, jpegs)


class MessagesStore:
    """The messages bucket, through the image store's client (boto3 is synchronous: calls run in a thread).
    A key that does not delete joins the image store's retry set, which the janitor drains into the right
    bucket by the key's suffix."""

    def __init__(self, images: ImageStore, bucket: str) -> None:
        self.images = images
        self.bucket = bucket

    async def put(self, offloaded: OffloadedMessages) -> None:
        """Store the object with its headers; raises whatever the store raises."""
        extra: dict[str, Any] = {}
        if offloaded.content_encoding:
            extra["ContentEncoding"] = offloaded.content_encoding
        await asyncio.to_thread(
            self.images.client.put_object,
            Bucket=self.bucket,
            Key=offloaded.key,
            Body=offloaded.body,
            ContentType=MESSAGES_CONTENT_TYPE,
            CacheControl=MESSAGES_CACHE_CONTROL,
            **extra,
        )

    async def delete(self, key: str) -> None:
        """Delete the object (absent counts as deleted); a key the store does not delete is queued for retry."""
        failed = await asyncio.to_thread(delete_objects, self.images.client, self.bucket, [key])
        if failed:
            log.warning("chat messages object delete failed; queued for retry", extra={"keys": failed})
            await self.images.queue_retry(failed)


def messages_store(images: ImageStore, settings: AdmissionSettings) -> MessagesStore:
    """The messages bucket of this process (``settings.messages_bucket``: the image bucket unless set)."""
    return MessagesStore(images, settings.messages_bucket)
