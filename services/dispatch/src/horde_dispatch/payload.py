"""The pop response's ``payload``: a chat job's messages and sampling fields, or a text job's prompt and
params; image references and offloaded messages resolved to what the worker declared.

See docs/native-api.md#chat-job-payload, #images (url → presigned URL valid for the job's TTL and
at least 600 s; base64 alone → a data URL of the stored JPEG), #messages-offload (messages_url → a
presigned URL valid 120 s); docs/native-api.md#pop (text payload: params minus n, plus prompt and n: 1).

Everything here runs after the pop statement committed, so the store is never read under the queue lock.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import logging
from typing import Any

from horde_contract import (
    CHAT_IMAGE_REFERENCE_SCHEME,
    CHAT_MESSAGES_URL_SECONDS,
    MIN_CHAT_IMAGE_URL_SECONDS,
    TEXT_JOB_LEASE_SECONDS,
    ChatImageTransport,
    build_chat_job_payload,
)
from horde_store.objects import chat_messages_key

from .queue import PoppedJob

log = logging.getLogger(__name__)


def text_job_payload(job: PoppedJob) -> dict[str, Any]:
    """A legacy text job's payload: the stored params without ``n``, the prompt, the budgets, ``n: 1``."""
    payload = {k: v for k, v in job.params.items() if k != "n"}
    payload["prompt"] = job.prompt
    payload["max_length"] = job.max_length
    payload["max_context_length"] = job.max_context_length
    payload["n"] = 1
    return payload


def _image_parts(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``image_url`` objects of every image part that references a stored image."""
    found = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and part.get("type") == "image_url":
                image = part.get("image_url")
                if isinstance(image, dict) and str(image.get("url", "")).startswith(
                    CHAT_IMAGE_REFERENCE_SCHEME
                ):
                    found.append(image)
    return found


class ObjectStore:
    """Presigning and reading stored chat objects (boto3 is synchronous: reads run in a thread)."""

    def __init__(self, client: Any, image_bucket: str, messages_bucket: str) -> None:
        self.client = client
        self.image_bucket = image_bucket
        self.messages_bucket = messages_bucket

    def presign(self, bucket: str, key: str, seconds: int) -> str:
        """A presigned GET URL, signed locally (no request to the store)."""
        url: str = self.client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=seconds
        )
        return url

    async def read(self, bucket: str, key: str) -> bytes:
        """The object's bytes."""

        def _get() -> bytes:
            body: bytes = self.client.get_object(Bucket=bucket, Key=key)["Body"].read()
            return body

        return await asyncio.to_thread(_get)


async def worker_messages(
    messages: list[dict[str, Any]], transport: str | None, store: ObjectStore | None
) -> list[dict[str, Any]]:
    """The messages with each ``horde-r2://`` image reference replaced for ``transport`` (url or base64).

    A reference that cannot be resolved (no store configured, a failed read) is left as stored and logged:
    the job is already assigned, and a worker that cannot fetch an image faults the job, which restarts it.
    """
    out = copy.deepcopy(messages)
    parts = _image_parts(out)
    if not parts or store is None or transport not in (ChatImageTransport.url, ChatImageTransport.base64):
        if parts:
            log.warning("chat images not resolved at pop", extra={"transport": transport})
        return out
    seconds = max(TEXT_JOB_LEASE_SECONDS, MIN_CHAT_IMAGE_URL_SECONDS)
    for image in parts:
        key = str(image["url"])[len(CHAT_IMAGE_REFERENCE_SCHEME) :]
        try:
            if transport == ChatImageTransport.url:
                image["url"] = store.presign(store.image_bucket, key, seconds)
            else:
                data = await store.read(store.image_bucket, key)
                image["url"] = "data:image/jpeg;base64," + base64.b64encode(data).decode("ascii")
        except Exception:
            log.warning("chat image not resolved at pop", extra={"key": key}, exc_info=True)
    return out


async def chat_job_payload(job: PoppedJob, store: ObjectStore | None) -> dict[str, Any]:
    """A chat job's payload (``horde_contract.build_chat_job_payload``) with the assigned transport applied."""
    messages_url: str | None = None
    messages: list[dict[str, Any]] | None = None
    if job.image_transport == ChatImageTransport.messages_url and store is not None:
        messages_url = store.presign(
            store.messages_bucket, chat_messages_key(job.wp_id), CHAT_MESSAGES_URL_SECONDS
        )
    else:
        messages = await worker_messages(list(job.messages or []), job.image_transport, store)
    return build_chat_job_payload(
        messages=messages,
        text_params=job.params,
        chat_extras=job.chat_extras,
        max_length=job.max_length,
        max_context_length=job.max_context_length,
        messages_url=messages_url,
    )
