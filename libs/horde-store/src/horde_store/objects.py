"""Object storage (S3 API via boto3): chat images ``<req>_chat_<n>.jpg`` and offloaded messages
``<req>_chat_messages.json`` (spec: Images, Messages offload; ARCHITECTURE.md "Stores").

boto3 is synchronous: async callers run these calls in a thread (``asyncio.to_thread``). Clients use
path-style addressing (``http://host:port/bucket/key``) so that moto, MinIO and Garage on a bare
host:port work without wildcard DNS; S3 and R2 accept it too.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

DEFAULT_IMAGE_BUCKET = "horde-chat-images"


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
            access_key_id=getattr(settings, "s3_access_key_id", None),
            secret_access_key=getattr(settings, "s3_secret_access_key", None),
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
    keyword arguments override it. Timeouts are seconds. Credentials left None fall back to boto3's
    own chain (env, profile, instance role).
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
    """``<request id>_chat_<n>.jpg``, n counting the request's images from 0 (spec: Images)."""
    return f"{request_id}_chat_{n}.jpg"


def chat_messages_key(request_id: object) -> str:
    """``<request id>_chat_messages.json`` (spec: Messages offload)."""
    return f"{request_id}_chat_messages.json"
