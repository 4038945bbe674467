"""Images in chat requests: load (decode or fetch), check, normalise to JPEG, store, and reference.

See docs/native-api.md#images (caps and refusals, the public fetch, normalisation, storage keys
``<request id>_chat_<n>.jpg`` behind ``horde-r2://`` references, 503 ChatImageStorageUnavailable). The
refusals come from horde_contract; the count cap and the 25 MiB data-URL bound were applied at parse.

Under attack: an image URL is parsed and refused before anything is fetched when it is
malformed, longer than MAX_CHAT_IMAGE_URL_LENGTH or not encodable as ASCII (SourceImageUrlInvalid) or names a
port other than 80 or 443 (SourceImageUrlRefused); an address is public only when it is global and not a
6to4 or NAT64 address embedding a non-public IPv4 address, nor site-local; a fetch asks for and accepts only
an uncompressed body, read raw and refused past the byte cap (nothing is decompressed), within
CHAT_IMAGE_FETCH_DEADLINE_SECONDS for the URL and its redirects and CHAT_IMAGE_STAGE_DEADLINE_SECONDS for all
of a request's images, fetched and decoded; DNS lookups and decoding run on small executors of their own,
never the event loop or the default executor; Pillow opens only CHAT_IMAGE_FORMATS, and its decompression-bomb
limit is the pixel cap.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import functools
import io
import ipaddress
import logging
import os
import re
import socket
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import horde_contract as contract
import httpx
from horde_contract.limits import (
    CHAT_IMAGE_FETCH_DEADLINE_SECONDS,
    CHAT_IMAGE_FETCH_PORTS,
    CHAT_IMAGE_FORMATS,
    CHAT_IMAGE_JPEG_QUALITY,
    CHAT_IMAGE_MAX_SIDE,
    CHAT_IMAGE_REFERENCE_SCHEME,
    CHAT_IMAGE_STAGE_DEADLINE_SECONDS,
    MAX_CHAT_IMAGE_BYTES,
    MAX_CHAT_IMAGE_PIXELS,
    MAX_CHAT_IMAGE_URL_LENGTH,
)
from horde_contract.vocab import ChatFeature
from horde_core.redis_keys import CHAT_IMAGE_DELETE_RETRY_KEY
from horde_store.objects import chat_image_key, delete_objects
from PIL import Image

log = logging.getLogger(__name__)

MAX_IMAGE_REDIRECTS = 3
IMAGE_FETCH_TIMEOUT_SECONDS = 2.0
#: Threads of one process for the fetch's DNS lookups and for decoding: a flood of image requests waits here
#: (each within its request's stage deadline) instead of taking the event loop or the default executor.
IMAGE_DNS_THREADS = 8
IMAGE_DECODE_THREADS = max(1, min(4, os.cpu_count() or 1))

# Pillow's decompression-bomb guard at the pixel cap: it warns above MAX_CHAT_IMAGE_PIXELS and refuses above
# twice that while reading the header; normalise refuses above the cap itself (process-wide: admission decodes
# no other images).
Image.MAX_IMAGE_PIXELS = MAX_CHAT_IMAGE_PIXELS

#: What a fetch asks for: the formats the decoder opens (a server that negotiates picks one of them), and
#: no content coding (an encoded answer is refused, never decompressed).
_ACCEPT = ",".join(f"image/{kind.lower()}" for kind in CHAT_IMAGE_FORMATS)
_URL_FORBIDDEN = re.compile(r"[\x00-\x20\x7f]")
# Characters left as they are when a URL's path or query is percent-encoded (RFC 3986 reserved, unreserved, %).
_PATH_SAFE = "/%!$&'()*+,;=:@-._~"
_QUERY_SAFE = _PATH_SAFE + "?"


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


def kept_image_features(required_features: Sequence[str], kept: Sequence[ImagePart]) -> list[str]:
    """The request's required features once sizing kept the image parts ``kept``: without ``vision`` when
    truncate_oldest dropped every turn with an image (docs/native-api.md#context-adjustments, images in dropped turns are
    not fetched, stored or charged; nor do they restrict the request to vision workers)."""
    if kept:
        return list(required_features)
    return [feature for feature in required_features if feature != str(ChatFeature.vision)]


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


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address stands for: IPv4-mapped (``::ffff:a.b.c.d``), 6to4 (``2002::/16``)
    or the NAT64 well-known prefix (``64:ff9b::/96``, RFC 6052); None otherwise."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64_WELL_KNOWN:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


_NAT64_WELL_KNOWN = ipaddress.IPv6Network("64:ff9b::/96")
#: IPv6 ranges refused whatever they hold: site-local (deprecated, fec0::/10, still routed inside some
#: networks), the local-use NAT64 prefix (RFC 8215) and Teredo (the client address is obfuscated).
_REFUSED_IPV6 = (
    ipaddress.IPv6Network("fec0::/10"),
    ipaddress.IPv6Network("64:ff9b:1::/48"),
    ipaddress.IPv6Network("2001::/32"),
)


def is_public_address(address: str) -> bool:
    """False for private, loopback, link-local, multicast, reserved, unspecified and other non-global
    addresses. An IPv6 address that stands for an IPv4 address (IPv4-mapped, 6to4, NAT64 well-known prefix) is
    checked as that IPv4 address; site-local, local-use NAT64 and Teredo addresses are never public."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.is_site_local or any(ip in network for network in _REFUSED_IPV6):
            return False
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            ip = embedded
    return not (
        ip.is_private
        or ip.is_loopback
        or ip.is_link_local
        or ip.is_multicast
        or ip.is_reserved
        or ip.is_unspecified
        or not ip.is_global
    )


def _invalid(part: ImagePart, reason: str) -> contract.HordeError:
    return contract.source_image_url_invalid_error(part.path, reason=reason)


@dataclass(frozen=True)
class ImageUrl:
    """An http(s) image URL taken apart for one hop: ``host`` in ASCII (IDNA) without brackets, the port,
    the percent-encoded path and query, and the Host header to send."""

    scheme: str
    host: str
    port: int
    path_query: str
    host_header: str

    def target(self, address: str) -> str:
        """The URL of this hop at the checked ``address`` (the host is never resolved again)."""
        literal = f"[{address}]" if ":" in address else address
        return f"{self.scheme}://{literal}:{self.port}{self.path_query}"


def parse_image_url(part: ImagePart, url: str, ports: Collection[int] | None) -> ImageUrl:
    """``url`` (the part's URL or a redirect's) taken apart, refused before any lookup.

    400 SourceImageUrlInvalid for a URL above MAX_CHAT_IMAGE_URL_LENGTH, with whitespace or control
    characters, that does not parse (``http://[::1/a.png``, a port above 65535), without a host, or whose
    host or path cannot be encoded as ASCII; 400 SourceImageUrlRefused for a scheme other than http(s) and
    for a port outside ``ports`` (None: any port).
    """
    if len(url) > MAX_CHAT_IMAGE_URL_LENGTH:
        raise _invalid(part, f"the image URL is longer than {MAX_CHAT_IMAGE_URL_LENGTH} characters.")
    if _URL_FORBIDDEN.search(url):
        raise _invalid(part, "the image URL holds whitespace or control characters.")
    try:
        split = urlsplit(url)
        port = split.port
        hostname = split.hostname
    except ValueError:
        raise _invalid(part, "the image URL is malformed.") from None
    if split.scheme not in ("http", "https"):
        raise contract.source_image_url_refused_error(part.path)
    if not hostname:
        raise _invalid(part, "the image URL has no host.")
    try:
        ipaddress.ip_address(hostname)
        host = hostname
    except ValueError:
        try:
            host = hostname.encode("idna").decode("ascii")
        except UnicodeError:
            raise _invalid(part, "the image URL's host cannot be encoded as ASCII.") from None
    if ports is not None and port is not None and port not in ports:
        allowed = " and ".join(str(p) for p in sorted(ports))
        raise contract.source_image_url_refused_error(
            part.path, f"the image URL names port {port}; images are fetched from ports {allowed} only."
        )
    try:
        path = quote(split.path or "/", safe=_PATH_SAFE)
        query = quote(split.query, safe=_QUERY_SAFE)
    except UnicodeError:
        raise _invalid(part, "the image URL's path cannot be encoded as ASCII.") from None
    literal = f"[{host}]" if ":" in host else host
    return ImageUrl(
        scheme=split.scheme,
        host=host,
        port=port or (443 if split.scheme == "https" else 80),
        path_query=path + (f"?{query}" if query else ""),
        host_header=literal if port is None else f"{literal}:{port}",
    )


class ImageFetcher:
    """Fetches public http(s) image URLs (fetch_public_image) and decodes images, on executors of its own.

    Each hop resolves its host once, refuses the hop when any address is not public, and connects to the
    checked address itself, sending the URL's host as Host and, over https, as the TLS server name the
    certificate is verified against; at most 3 redirects; connect and each read time out after 2 s, the URL
    with its redirects after ``fetch_deadline`` seconds; only ports 80 and 443; only an uncompressed body.
    ``stage_deadline`` bounds all of a request's images (:func:`load_chat_images`). ``allow_private`` lifts
    the address and port checks (local development and tests only).
    """

    def __init__(
        self,
        *,
        allow_private: bool = False,
        fetch_deadline: float = CHAT_IMAGE_FETCH_DEADLINE_SECONDS,
        stage_deadline: float = CHAT_IMAGE_STAGE_DEADLINE_SECONDS,
    ) -> None:
        self.allow_private = allow_private
        self.ports: Collection[int] | None = None if allow_private else CHAT_IMAGE_FETCH_PORTS
        self.fetch_deadline = fetch_deadline
        self.stage_deadline = stage_deadline
        timeout = httpx.Timeout(IMAGE_FETCH_TIMEOUT_SECONDS)
        self._client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False)
        self._dns = ThreadPoolExecutor(IMAGE_DNS_THREADS, thread_name_prefix="image-dns")
        self._decode = ThreadPoolExecutor(IMAGE_DECODE_THREADS, thread_name_prefix="image-decode")

    async def aclose(self) -> None:
        await self._client.aclose()
        self._dns.shutdown(wait=False, cancel_futures=True)
        self._decode.shutdown(wait=False, cancel_futures=True)

    def parse(self, part: ImagePart, url: str | None = None) -> ImageUrl:
        """:func:`parse_image_url` under this fetcher's port rule."""
        return parse_image_url(part, part.url if url is None else url, self.ports)

    async def _resolve(self, host: str, port: int) -> str:
        """The address to connect to; PermissionError when any address of ``host`` is not public."""
        try:
            addresses = [str(ipaddress.ip_address(host))]
        except ValueError:
            loop = asyncio.get_running_loop()
            lookup = functools.partial(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
            infos = await loop.run_in_executor(self._dns, lookup)
            addresses = [str(info[4][0]) for info in infos]
        if not addresses:
            raise OSError(f"{host} does not resolve")
        if not self.allow_private and not all(is_public_address(a) for a in addresses):
            raise PermissionError(host)
        return addresses[0]

    async def fetch(self, part: ImagePart, limit: int) -> bytes:
        """The image bytes at ``part.url``; 400 SourceImageUrlRefused / SourceImageUrlInvalid /
        SourceImageSizeExceeded (above ``limit`` bytes). SourceImageUrlInvalid when the URL and its
        redirects take longer than ``fetch_deadline`` seconds."""
        try:
            async with asyncio.timeout(self.fetch_deadline):
                return await self._fetch(part, limit)
        except TimeoutError:
            raise _invalid(
                part, f"the image URL did not answer within {self.fetch_deadline:g} seconds."
            ) from None

    async def _fetch(self, part: ImagePart, limit: int) -> bytes:
        url = part.url
        for _ in range(MAX_IMAGE_REDIRECTS + 1):
            hop = self.parse(part, url)
            try:
                address = await self._resolve(hop.host, hop.port)
            except PermissionError:
                raise contract.source_image_url_refused_error(part.path) from None
            except (OSError, UnicodeError):
                raise contract.source_image_url_invalid_error(part.path) from None
            extensions = {"sni_hostname": hop.host} if hop.scheme == "https" else {}
            headers = {"Host": hop.host_header, "Accept-Encoding": "identity", "Accept": _ACCEPT}
            try:
                request = self._client.build_request(
                    "GET", hop.target(address), headers=headers, extensions=extensions
                )
                response = await self._client.send(request, stream=True)
            except httpx.InvalidURL:
                raise _invalid(part, "the image URL is malformed.") from None
            except httpx.HTTPError:
                raise contract.source_image_url_invalid_error(part.path) from None
            try:
                if response.status_code in (301, 302, 303, 307, 308) and "location" in response.headers:
                    try:
                        url = urljoin(url, response.headers["location"])
                    except ValueError:
                        raise _invalid(part, "the image URL redirects to a malformed URL.") from None
                    continue
                if response.status_code != 200:
                    raise contract.source_image_url_invalid_error(part.path, response.status_code)
                return await _read_body(response, part, limit)
            finally:
                await response.aclose()
        raise contract.source_image_url_refused_error(part.path)

    async def decode(self, data: bytes, path: str) -> bytes:
        """:func:`normalise` on the decoding executor."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._decode, normalise, data, path)


async def _read_body(response: httpx.Response, part: ImagePart, limit: int) -> bytes:
    """The body as sent, read raw and refused past ``limit`` bytes: 400 SourceImageUrlInvalid for a
    Content-Encoding other than identity (nothing is decompressed), 400 SourceImageSizeExceeded for a
    Content-Length or a body above ``limit``."""
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise _invalid(
            part,
            f"the image URL answered with a compressed body (Content-Encoding: {encoding[:32]}); "
            "images are fetched uncompressed.",
        )
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise contract.source_image_size_error(part.path, int(declared))
    data = bytearray()
    try:
        async for chunk in response.aiter_raw():
            data += chunk
            if len(data) > limit:
                raise contract.source_image_size_error(part.path, len(data))
    except httpx.HTTPError:
        raise contract.source_image_url_invalid_error(part.path) from None
    return bytes(data)


_BOMB_PIXELS = re.compile(r"\((\d+) pixels\)")


def _bomb_pixels(exc: Exception) -> int | None:
    """The pixel count Pillow's decompression-bomb guard reports (``Image size (N pixels) exceeds ...``)."""
    match = _BOMB_PIXELS.search(str(exc))
    return int(match.group(1)) if match else None


def normalise(data: bytes, path: str) -> bytes:
    """The image as stored: RGB (transparency flattened onto white), longest side at most 2048, JPEG at
    quality 90. Only CHAT_IMAGE_FORMATS are opened. 400 SourceImageResolutionExceeded above 3072*3072 pixels
    (read from the header before decoding), including an image Pillow's guard refuses as a decompression bomb
    (``DecompressionBombError``, or its warning when warnings are errors, raised while the header is read,
    before our own check sees the size); 400 SourceImageUnreadable when the bytes are not a readable image of
    those formats, whatever the decoder raises. See docs/native-api.md#images."""
    try:
        image: Image.Image = Image.open(io.BytesIO(data), formats=CHAT_IMAGE_FORMATS)
        width, height = image.size
        if width * height > MAX_CHAT_IMAGE_PIXELS:
            raise contract.source_image_resolution_error(path, width, height)
        image.load()
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
    except contract.HordeError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise contract.source_image_resolution_error(path, pixels=_bomb_pixels(exc)) from None
    except Exception:  # a hostile file can make a decoder raise anything; it is unreadable, never a 500
        raise contract.source_image_unreadable_error(path) from None


def image_stage_timeout_error(seconds: float) -> contract.HordeError:
    """503 when the request's images could not be decoded within the stage deadline (the decoders are busy):
    nothing was created or charged, and a retry may pass."""
    return contract.HordeError(
        503,
        contract.RC.ChatImageStorageUnavailable,
        f"The request's images could not be processed within {seconds:g} seconds; try again later. "
        "Nothing was charged.",
        None,
    )


async def load_chat_images(
    parts: Sequence[ImagePart], *, trusted: bool, dry_run: bool, fetcher: ImageFetcher
) -> list[bytes]:
    """Load, check and encode the request's images (load_chat_images); the JPEGs, in order.

    The data URLs are counted against the user's total (25 MiB trusted or patron, 5 MiB otherwise) before
    anything is fetched; each fetched URL is added and the total checked before the next fetch; the JPEGs
    are held to the same total. A dry run checks the data URLs only and returns ``[]``. Every http(s) URL is
    parsed (:func:`parse_image_url`) before the first fetch. Fetching and decoding share the fetcher's stage
    deadline: past it while fetching, 400 SourceImageUrlInvalid for the URL being fetched; while decoding,
    503 (:func:`image_stage_timeout_error`).
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
    for part in parts:
        if not part.is_data_url:
            fetcher.parse(part)
    current: ImagePart | None = None
    encoded: list[bytes] = []
    try:
        async with asyncio.timeout(fetcher.stage_deadline):
            for i, part in enumerate(parts):
                if part.is_data_url:
                    continue
                current = part
                loaded[i] = await fetcher.fetch(part, MAX_CHAT_IMAGE_BYTES)
                total += len(loaded[i])
                contract.check_image_total(total, trusted=trusted)
            current = None
            for i, part in enumerate(parts):
                encoded.append(await fetcher.decode(loaded[i], part.path))
    except TimeoutError:
        if current is not None:
            raise _invalid(
                current,
                f"the request's image URLs did not answer within the {fetcher.stage_deadline:g} seconds "
                "its images may take.",
            ) from None
        raise image_stage_timeout_error(fetcher.stage_deadline) from None
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
            await self.queue_retry(failed)

    async def queue_retry(self, keys: Sequence[str]) -> None:
        """Add ``keys`` (images or a messages object: the janitor routes each by its suffix) to the retry set,
        or log them when the set is full or Redis fails."""
        try:
            if await self.redis.scard(CHAT_IMAGE_DELETE_RETRY_KEY) >= MAX_CHAT_IMAGE_DELETE_RETRY_KEYS:
                log.error("chat image delete retry set full; keys left stored", extra={"keys": list(keys)})
                return
            await self.redis.sadd(CHAT_IMAGE_DELETE_RETRY_KEY, *keys)
        except Exception:
            log.error("chat image delete retry not queued", extra={"keys": list(keys)}, exc_info=True)
