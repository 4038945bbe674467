"""Images in chat requests: load (decode or fetch), check, normalise to JPEG, store, and reference.

Spec: chat-requests.md **Images** (caps and refusals, the public fetch, normalisation, storage keys
``<request id>_chat_<n>.jpg`` behind ``horde-r2://`` references, 503 ChatImageStorageUnavailable). The
refusals come from horde_contract; the count cap and the 25 MiB data-URL bound were applied at parse.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import io
import ipaddress
import logging
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx
from horde_contract.limits import (
    CHAT_IMAGE_JPEG_QUALITY,
    CHAT_IMAGE_MAX_SIDE,
    CHAT_IMAGE_REFERENCE_SCHEME,
    MAX_CHAT_IMAGE_BYTES,
    MAX_CHAT_IMAGE_PIXELS,
)
from horde_core.redis_keys import CHAT_IMAGE_DELETE_RETRY_KEY
from horde_store.objects import chat_image_key, delete_objects
from PIL import Image, UnidentifiedImageError

from horde_admission import contract

log = logging.getLogger(__name__)

MAX_IMAGE_REDIRECTS = 3
IMAGE_FETCH_TIMEOUT_SECONDS = 2.0


@dataclass(frozen=True)
class ImagePart:
    """One image part of the messages: where it is and its URL."""

    message_index: int
    part_index: int
    url: str

    @property
    def path(self) -> str:
        """The request path of its URL, e.g. ``messages[2].content[1].image_url.url``."""
        return f"messages[{self.message_index}].content[{self.part_index}].image_url.url"

    @property
    def is_data_url(self) -> bool:
        return self.url[:5].lower() == "data:"


def image_parts(messages: Sequence[dict[str, Any]]) -> list[ImagePart]:
    """The image parts of ``messages`` in order (n counts from 0 in this order)."""
    found = []
    for mi, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for pi, part in enumerate(content):
            if isinstance(part, dict) and part.get("type") == "image_url":
                found.append(ImagePart(mi, pi, str(part["image_url"]["url"])))
    return found


def decode_data_url(part: ImagePart) -> bytes:
    """The bytes of a ``data:image/...;base64,`` URL; 400 SourceImageSizeExceeded above 5 MiB, 400
    SourceImageUnreadable when the payload is not base64."""
    payload = part.url[part.url.find(",") + 1 :]
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise contract.source_image_unreadable_error(part.path) from None
    if len(data) > MAX_CHAT_IMAGE_BYTES:
        raise contract.source_image_size_error(part.path, len(data))
    return data


def is_public_address(address: str) -> bool:
    """False for private, loopback, link-local, multicast, reserved and unspecified addresses (an
    IPv4-mapped IPv6 address is checked as IPv4)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


class ImageFetcher:
    """Fetches public http(s) image URLs (fetch_public_image).

    Each hop resolves its host once, refuses the hop when any address is not public, and connects to the
    checked address itself, sending the URL's host as Host and, over https, as the TLS server name the
    certificate is verified against; at most 3 redirects; connect and each read time out after 2 s.
    ``allow_private`` lifts the address check (local development and tests only).
    """

    def __init__(self, *, allow_private: bool = False) -> None:
        self.allow_private = allow_private
        timeout = httpx.Timeout(IMAGE_FETCH_TIMEOUT_SECONDS)
        self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _resolve(self, host: str, port: int) -> str:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [str(info[4][0]) for info in infos]
        if not addresses:
            raise OSError(f"{host} does not resolve")
        if not self.allow_private and not all(is_public_address(a) for a in addresses):
            raise PermissionError(host)
        return addresses[0]

    async def fetch(self, part: ImagePart, limit: int) -> bytes:
        """The image bytes at ``part.url``; 400 SourceImageUrlRefused / SourceImageUrlInvalid /
        SourceImageSizeExceeded (above ``limit`` bytes)."""
        url = part.url
        for _ in range(MAX_IMAGE_REDIRECTS + 1):
            split = urlsplit(url)
            if split.scheme not in ("http", "https") or not split.hostname:
                raise contract.source_image_url_refused_error(part.path)
            port = split.port or (443 if split.scheme == "https" else 80)
            try:
                address = await self._resolve(split.hostname, port)
            except PermissionError:
                raise contract.source_image_url_refused_error(part.path) from None
            except OSError:
                raise contract.source_image_url_invalid_error(part.path) from None
            literal = f"[{address}]" if ":" in address else address
            target = urlunsplit((split.scheme, f"{literal}:{port}", split.path or "/", split.query, ""))
            host_header = split.hostname if split.port is None else f"{split.hostname}:{split.port}"
            extensions = {"sni_hostname": split.hostname} if split.scheme == "https" else {}
            request = self._client.build_request(
                "GET", target, headers={"Host": host_header}, extensions=extensions
            )
            try:
                response = await self._client.send(request, stream=True)
            except httpx.HTTPError:
                raise contract.source_image_url_invalid_error(part.path) from None
            try:
                if response.status_code in (301, 302, 303, 307, 308) and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise contract.source_image_url_invalid_error(part.path, response.status_code)
                data = bytearray()
                try:
                    async for chunk in response.aiter_bytes():
                        data += chunk
                        if len(data) > limit:
                            raise contract.source_image_size_error(part.path, len(data))
                except httpx.HTTPError:
                    raise contract.source_image_url_invalid_error(part.path) from None
                return bytes(data)
            finally:
                await response.aclose()
        raise contract.source_image_url_refused_error(part.path)


_BOMB_PIXELS = re.compile(r"\((\d+) pixels\)")


def _bomb_pixels(exc: Image.DecompressionBombError) -> int | None:
    """The pixel count Pillow's decompression-bomb guard reports (``Image size (N pixels) exceeds ...``)."""
    match = _BOMB_PIXELS.search(str(exc))
    return int(match.group(1)) if match else None


def normalise(data: bytes, path: str) -> bytes:
    """The image as stored: RGB (transparency flattened onto white), longest side at most 2048, JPEG at
    quality 90. 400 SourceImageResolutionExceeded above 3072*3072 pixels (read from the header before
    decoding), including an image Pillow's guard refuses as a decompression bomb (``DecompressionBombError``,
    raised while the header is read, before our own check sees the size); 400 SourceImageUnreadable when the
    bytes are not a readable image. Spec: chat-requests.md *Images*."""
    try:
        image: Image.Image = Image.open(io.BytesIO(data))
        width, height = image.size
        if width * height > MAX_CHAT_IMAGE_PIXELS:
            raise contract.source_image_resolution_error(path, width, height)
        image.load()
    except Image.DecompressionBombError as exc:
        raise contract.source_image_resolution_error(path, pixels=_bomb_pixels(exc)) from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise contract.source_image_unreadable_error(path) from None
    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        image = background
    elif image.mode != "RGB":
        image = image.convert("RGB")
    if max(image.size) > CHAT_IMAGE_MAX_SIDE:
        image.thumbnail((CHAT_IMAGE_MAX_SIDE, CHAT_IMAGE_MAX_SIDE), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=CHAT_IMAGE_JPEG_QUALITY)
    return out.getvalue()


async def load_chat_images(
    parts: Sequence[ImagePart], *, trusted: bool, dry_run: bool, fetcher: ImageFetcher
) -> list[bytes]:
    """Load, check and encode the request's images (load_chat_images); the JPEGs, in order.

    The data URLs are counted against the user's total (25 MiB trusted or patron, 5 MiB otherwise) before
    anything is fetched; each fetched URL is added and the total checked before the next fetch; the JPEGs
    are held to the same total. A dry run checks the data URLs only and returns ``[]``.
    """
    loaded: dict[int, bytes] = {}
    total = 0
    for i, part in enumerate(parts):
        if part.is_data_url:
            loaded[i] = decode_data_url(part)
            total += len(loaded[i])
    contract.check_image_total(total, trusted=trusted)
    if dry_run:
        return []
    for i, part in enumerate(parts):
        if part.is_data_url:
            continue
        loaded[i] = await fetcher.fetch(part, MAX_CHAT_IMAGE_BYTES)
        total += len(loaded[i])
        contract.check_image_total(total, trusted=trusted)
    encoded = []
    for i, part in enumerate(parts):
        encoded.append(await asyncio.to_thread(normalise, loaded[i], part.path))
    contract.check_image_total(sum(len(e) for e in encoded), trusted=trusted, encoded=True)
    return encoded


def reference_images(
    messages: Sequence[dict[str, Any]], parts: Sequence[ImagePart], request_id: object
) -> list[dict[str, Any]]:
    """A copy of ``messages`` with each image part's url replaced by ``horde-r2://<request id>_chat_<n>.jpg``
    (the row never holds image bytes or the submitted URL); ``detail`` is kept."""
    out = copy.deepcopy(list(messages))
    for n, part in enumerate(parts):
        out[part.message_index]["content"][part.part_index]["image_url"]["url"] = (
            f"{CHAT_IMAGE_REFERENCE_SCHEME}{chat_image_key(request_id, n)}"
        )
    return out


#: The retry set is bounded; past it keys are logged instead (MAX_CHAT_IMAGE_DELETE_RETRY_KEYS).
MAX_CHAT_IMAGE_DELETE_RETRY_KEYS = 100_000


class ImageStore:
    """The source image bucket (boto3 is synchronous: calls run in a thread). A key that does not delete
    goes to the Redis retry set the janitor drains (CHAT_IMAGE_DELETE_RETRY_KEY)."""

    def __init__(self, client: Any, bucket: str, redis: Any) -> None:
        self.client = client
        self.bucket = bucket
        self.redis = redis

    async def put_all(self, request_id: object, jpegs: Sequence[bytes]) -> list[str]:
        """Store each JPEG under ``<request id>_chat_<n>.jpg``; returns the keys stored. Raises on failure
        after deleting the keys it stored."""
        stored: list[str] = []
        try:
            for n, data in enumerate(jpegs):
                key = chat_image_key(request_id, n)
                await asyncio.to_thread(
                    self.client.put_object, Bucket=self.bucket, Key=key, Body=data, ContentType="image/jpeg"
                )
                stored.append(key)
        except Exception:
            await self.delete(stored)
            raise
        return stored

    async def delete(self, keys: Sequence[str]) -> None:
        """Delete ``keys``; each key the store does not delete (a failed call, or a per-key error in the
        answer: ``horde_store.objects.delete_objects``) is queued in the retry set the janitor drains."""
        if not keys:
            return
        failed = await asyncio.to_thread(delete_objects, self.client, self.bucket, keys)
        if failed:
            log.warning("chat image delete failed; queued for retry", extra={"keys": failed})
            await self._queue_retry(failed)

    async def _queue_retry(self, keys: Sequence[str]) -> None:
        try:
            if await self.redis.scard(CHAT_IMAGE_DELETE_RETRY_KEY) >= MAX_CHAT_IMAGE_DELETE_RETRY_KEYS:
                log.error("chat image delete retry set full; keys left stored", extra={"keys": list(keys)})
                return
            await self.redis.sadd(CHAT_IMAGE_DELETE_RETRY_KEY, *keys)
        except Exception:
            log.error("chat image delete retry not queued", extra={"keys": list(keys)}, exc_info=True)
