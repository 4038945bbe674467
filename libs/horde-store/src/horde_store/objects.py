"""Object storage (S3 API via boto3): chat images ``<req>_chat_<n>.jpg`` and offloaded messages
``<req>_chat_messages.json`` (docs/native-api.md#images, #messages-offload; README.md#architecture).

boto3 is synchronous: async callers run these calls in a thread (``asyncio.to_thread``). Clients use
path-style addressing (``http://host:port/bucket/key``) so that moto, MinIO and Garage on a bare
host:port work without wildcard DNS; S3 and R2 accept it too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

log = logging.getLogger(__name__)

DEFAULT_IMAGE_BUCKET = "horde-chat-images"

#: S3 DeleteObjects takes at most 1000 keys per call.
DELETE_OBJECTS_BATCH = 1000

#: Per-key error codes that mean the object is not stored (any more): the key counts as deleted. S3 itself
#: answers a missing key as deleted; some S3-compatible stores report it as an error instead.
_GONE_CODES = frozenset({"NoSuchKey", "NotFound", "404"})


@dataclass(frozen=True)
class S3Settings:
    """Where objects live. ``endpoint_url`` None = AWS S3 itself. ``messages_bucket`` defaults to the
    image bucket (spec: R2_CHAT_MESSAGES_BUCKET)."""

    endpoint_url: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    region: str = "us-east-1"
    image_bucket: str = DEFAULT_IMAGE_BUCKET
    messages_bucket: str | None = None

    @property
    def buckets(self) -> tuple[str, ...]:
        """The distinct buckets in use (image bucket first)."""
        msgs = self.messages_bucket or self.image_bucket
        return (self.image_bucket,) if msgs == self.image_bucket else (self.image_bucket, msgs)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> S3Settings:
        """Read ``HORDE_S3_ENDPOINT_URL``, ``HORDE_S3_ACCESS_KEY_ID``, ``HORDE_S3_SECRET_ACCESS_KEY``,
        ``HORDE_S3_REGION``, ``HORDE_S3_IMAGE_BUCKET``, ``HORDE_S3_MESSAGES_BUCKET``."""
        env = os.environ if environ is None else environ
        return cls(
            endpoint_url=env.get("HORDE_S3_ENDPOINT_URL") or None,
            access_key_id=env.get("HORDE_S3_ACCESS_KEY_ID") or None,
            secret_access_key=env.get("HORDE_S3_SECRET_ACCESS_KEY") or None,
            region=env.get("HORDE_S3_REGION") or "us-east-1",
            image_bucket=env.get("HORDE_S3_IMAGE_BUCKET") or DEFAULT_IMAGE_BUCKET,
            messages_bucket=env.get("HORDE_S3_MESSAGES_BUCKET") or None,
        )

    @classmethod
    def from_settings(cls, settings: Any) -> S3Settings:
        """From any object with ``s3_endpoint_url``, ``s3_access_key_id``, ``s3_secret_access_key``,
        ``s3_region``, ``s3_image_bucket``, ``s3_messages_bucket`` attributes (e.g. HordeSettings)."""
        return cls(
            endpoint_url=getattr(settings, "s3_endpoint_url", None),
            access_key_id=getattr(settings, "s3_access_key_id", None) or None,
            secret_access_key=getattr(settings, "s3_secret_access_key", None) or None,
            region=getattr(settings, "s3_region", None) or "us-east-1",
            image_bucket=getattr(settings, "s3_image_bucket", None) or DEFAULT_IMAGE_BUCKET,
            messages_bucket=getattr(settings, "s3_messages_bucket", None),
        )


def make_s3_client(
    settings: S3Settings | Any | None = None,
    *,
    endpoint_url: str | None = None,
    access_key_id: str | None = None,
    secret_access_key: str | None = None,
    region: str | None = None,
    connect_timeout: float = 5.0,
    read_timeout: float = 30.0,
    max_attempts: int = 3,
) -> Any:
    """A boto3 S3 client with path-style addressing and SigV4 (needed for presigned URLs on R2/MinIO).

    ``settings``: an :class:`S3Settings` or a settings object (see :meth:`S3Settings.from_settings`);
    keyword arguments override it. Timeouts are seconds. Credentials left None (``HORDE_S3_ACCESS_KEY_ID`` and
    ``HORDE_S3_SECRET_ACCESS_KEY`` unset, the default) fall back to boto3's own chain: ``AWS_ACCESS_KEY_ID``/
    ``AWS_SECRET_ACCESS_KEY``, a web identity token (EKS IRSA: ``AWS_ROLE_ARN`` and
    ``AWS_WEB_IDENTITY_TOKEN_FILE``), a profile, the container or instance role. Set, they win over the chain.
    """
    if settings is not None and not isinstance(settings, S3Settings):
        settings = S3Settings.from_settings(settings)
    base = settings or S3Settings()
    config = Config(
        s3={"addressing_style": "path"},
        signature_version="s3v4",
        connect_timeout=connect_timeout,
        read_timeout=read_timeout,
        retries={"max_attempts": max_attempts, "mode": "standard"},
    )
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url or base.endpoint_url,
        aws_access_key_id=access_key_id or base.access_key_id,
        aws_secret_access_key=secret_access_key or base.secret_access_key,
        region_name=region or base.region,
        config=config,
    )


def ensure_buckets(client: Any, buckets: Iterable[str], *, region: str | None = None) -> list[str]:
    """Create each bucket that does not exist yet; return the ones created. Idempotent, and safe
    against another process creating the same bucket at the same time."""
    created: list[str] = []
    region = region or client.meta.region_name or "us-east-1"
    for bucket in dict.fromkeys(buckets):
        try:
            client.head_bucket(Bucket=bucket)
            continue
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("404", "NoSuchBucket", "NotFound"):
                raise
        kwargs: dict[str, Any] = {"Bucket": bucket}
        if region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            client.create_bucket(**kwargs)
            created.append(bucket)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in (
                "BucketAlreadyOwnedByYou",
                "BucketAlreadyExists",
            ):
                raise
    return created


def chat_image_key(request_id: object, n: int) -> str:
    """``<request id>_chat_<n>.jpg``, n counting the request's images from 0 (docs/native-api.md#images)."""
    return f"{request_id}_chat_{n}.jpg"


def chat_messages_key(request_id: object) -> str:
    """``<request id>_chat_messages.json`` (docs/native-api.md#messages-offload)."""
    return f"{request_id}_chat_messages.json"


def delete_objects(client: Any, bucket: str, keys: Iterable[str]) -> list[str]:
    """Delete ``keys`` from ``bucket`` with S3 DeleteObjects (batches of :data:`DELETE_OBJECTS_BATCH`, quiet
    mode) and return the keys that were **not** deleted, in order, so the caller can queue them for a retry
    (docs/native-api.md#images: "A key the store does not delete is added to the Redis set
    horde:chat:image_delete_retry").

    A key is not deleted when its batch's call raised (a transport error, an unknown bucket, AccessDenied on
    the whole request: every key of that batch), or when the answer lists it under ``Errors`` (a per-key
    failure, e.g. ``{"Key": k, "Code": "AccessDenied", "Message": "Access Denied"}`` for a key a bucket
    policy or an object lock protects; HTTP 200 for the call). A per-key ``NoSuchKey`` counts as deleted; an
    ``Errors`` entry that names no key fails its whole batch, since the answer does not say which key it
    was. Each failure is logged (WARNING) with the bucket, the key and the store's code. Synchronous
    (boto3): async callers run it in a thread. Never raises for a store failure.
    """
    failed: list[str] = []
    batch_keys = list(dict.fromkeys(keys))
    for start in range(0, len(batch_keys), DELETE_OBJECTS_BATCH):
        batch = batch_keys[start : start + DELETE_OBJECTS_BATCH]
        try:
            answer = client.delete_objects(
                Bucket=bucket, Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True}
            )
        except Exception:
            log.warning("object delete failed", extra={"bucket": bucket, "keys": len(batch)}, exc_info=True)
            failed.extend(batch)
            continue
        errors = answer.get("Errors") or []
        refused: set[str] = set()
        for error in errors:
            key, code = error.get("Key"), str(error.get("Code") or "")
            if key is None:
                log.warning(
                    "object delete error without a key; the batch is retried",
                    extra={"bucket": bucket, "code": code, "error_message": error.get("Message")},
                )
                refused.update(batch)
                break
            if code in _GONE_CODES:
                continue
            log.warning(
                "object not deleted",
                extra={"bucket": bucket, "key": key, "code": code, "error_message": error.get("Message")},
            )
            refused.add(str(key))
        failed.extend(k for k in batch if k in refused)
    return failed
