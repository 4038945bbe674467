"""The image pipeline under attack: malformed and non-ASCII URLs, non-standard ports and
6to4/NAT64/site-local addresses refused before any connection; compressed bodies refused (nothing is
decompressed); deadlines per fetch and per request's image stage; an explicit format list and Pillow's pixel
limit; images fetched only after every other check; images in turns truncate_oldest dropped neither fetched,
charged nor required of a worker. Each refusal stores and charges nothing.

Loopback is refused by design, so the tests that fetch from a local HTTP server use an admission app with
``image_fetch_allow_private`` (which lifts the address and port checks, as the existing image tests do) and,
for the deadlines, a fetcher with short deadlines put in its state.
"""

from __future__ import annotations

import base64
import gzip
import io
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
import pytest_asyncio
from admission_helpers import add_chat_worker, new_user, unique_model
from botocore.config import Config
from horde_admission.images import ImageFetcher, is_public_address
from PIL import Image

pytestmark = pytest.mark.asyncio(loop_scope="session")

VISION = ["prompt_overflow_refused", "vision"]
PATH = "messages[0].content[1].image_url.url"


def png(width: int = 64, height: int = 48, mode: str = "RGB") -> bytes:
    out = io.BytesIO()
    Image.new(mode, (width, height), 0).save(out, format="PNG")
    return out.getvalue()


def encoded(width: int, height: int, kind: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (10, 20, 30)).save(out, format=kind)
    return out.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def image_body(model: str, *urls: str, **extra: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": 64, **extra}


async def post(client: Any, body: Any, key: str) -> Any:
    return await client.post("/api/v2/generate/chat/async", json=body, headers={"apikey": key})


def refusal(r: Any, status: int, rc: str, text: str, path: str = PATH) -> None:
    assert r.status_code == status, r.text
    assert r.json() == {"rc": rc, "message": f"'{path}': {text}"}


async def nothing_stored(db: Any, user_id: int, kudos: float) -> None:
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == kudos
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE user_id = $1", user_id) == 0


def stored_objects(env: dict[str, str]) -> int:
    client = boto3.session.Session().client(
        "s3",
        endpoint_url=env["HORDE_S3_ENDPOINT_URL"],
        aws_access_key_id=env["HORDE_S3_ACCESS_KEY_ID"],
        aws_secret_access_key=env["HORDE_S3_SECRET_ACCESS_KEY"],
        region_name=env["HORDE_S3_REGION"],
        config=Config(s3={"addressing_style": "path"}),
    )
    return int(client.list_objects_v2(Bucket=env["HORDE_S3_IMAGE_BUCKET"]).get("KeyCount", 0))


@dataclass
class Server:
    """A local image server and the paths it was asked for."""

    url: str
    hits: list[str] = field(default_factory=list)

    def count(self, path: str) -> int:
        return sum(1 for hit in self.hits if hit == path)


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[Server]:
    """/img.png (200); /gzip (a gzip bomb: 64 MiB of zeros as about 64 KiB, Content-Encoding: gzip);
    /declared-big (Content-Length 6 MiB); /slow (a byte every 0.2 s for 3 s, then the rest of a PNG);
    /delay (0.6 s, then a PNG)."""
    image = png()
    bomb = gzip.compress(b"\0" * (64 * 1024 * 1024), compresslevel=9)
    server_state = Server(url="")

    class Handler(BaseHTTPRequestHandler):
        def _head(self, length: int | None, **headers: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            if length is not None:
                self.send_header("Content-Length", str(length))
            for name, value in headers.items():
                self.send_header(name.replace("_", "-"), value)
            self.end_headers()

        def do_GET(self) -> None:
            server_state.hits.append(self.path)
            try:
                if self.path == "/img.png":
                    self._head(len(image))
                    self.wfile.write(image)
                elif self.path == "/gzip":
                    self._head(len(bomb), Content_Encoding="gzip")
                    self.wfile.write(bomb)
                elif self.path == "/declared-big":
                    self._head(6 * 1024 * 1024)
                    self.wfile.write(b"\0" * 1024)
                elif self.path == "/slow":
                    self._head(len(image))
                    deadline = time.monotonic() + 3
                    sent = 0
                    while time.monotonic() < deadline and sent < len(image) - 1:
                        self.wfile.write(image[sent : sent + 1])
                        self.wfile.flush()
                        sent += 1
                        time.sleep(0.2)
                    self.wfile.write(image[sent:])
                elif self.path == "/delay":
                    time.sleep(0.6)
                    self._head(len(image))
                    self.wfile.write(image)
                else:
                    self.send_response(404)
                    self.end_headers()
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server_state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield server_state
    finally:
        server.shutdown()
        server.server_close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def local(make_client: Any) -> AsyncIterator[Any]:
    """An admission client that may fetch from loopback (image_fetch_allow_private), with a fetcher whose
    deadlines tests may shorten (``local.fetcher(...)``)."""
    client = await make_client(image_fetch_allow_private=True)
    state = client.horde_app.state.admission
    original = state.fetcher
    made: list[ImageFetcher] = []

    def fetcher(**kw: Any) -> None:
        made.append(ImageFetcher(allow_private=True, **kw))
        state.fetcher = made[-1]

    client.fetcher = fetcher
    try:
        yield client
    finally:
        state.fetcher = original
        for one in made:
            await one.aclose()


@pytest_asyncio.fixture(loop_scope="session")
async def vision_model(db: Any) -> str:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"])
    return model


# --- Addresses ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2606:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("100.64.0.1", False),  # shared address space (carrier-grade NAT)
        ("::ffff:127.0.0.1", False),
        ("2002:7f00:1::1", False),  # 6to4 of 127.0.0.1
        ("2002:a00:1::1", False),  # 6to4 of 10.0.0.1
        ("2002:808:808::1", True),  # 6to4 of 8.8.8.8
        ("64:ff9b::7f00:1", False),  # NAT64 of 127.0.0.1
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254 (cloud metadata)
        ("64:ff9b::808:808", True),  # NAT64 of 8.8.8.8
        ("64:ff9b:1::808:808", False),  # local-use NAT64
        ("fec0::1", False),  # site-local
        ("fefe::1", False),  # site-local
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", False),  # Teredo
        ("fc00::1", False),
        ("fe80::1%eth0", False),
    ],
)
async def test_public_addresses(address: str, public: bool) -> None:
    assert is_public_address(address) is public


@pytest.mark.parametrize(
    "url",
    ["http://[2002:7f00:1::1]/a.png", "http://[64:ff9b::a9fe:a9fe]/a.png", "http://[fec0::1]/a.png"],
    ids=["6to4", "nat64", "site-local"],
)
async def test_embedded_and_site_local_addresses_are_refused(
    client: Any, db: Any, vision_model: str, url: str
) -> None:
    user_id, key = await new_user(db, kudos=100)
    r = await post(client, image_body(vision_model, url), key)
    refusal(
        r,
        400,
        "SourceImageUrlRefused",
        "the image URL resolves to an address the Horde does not fetch from, or redirects too often.",
    )
    await nothing_stored(db, user_id, 100.0)


# --- URLs refused before anything is looked up ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "rc", "text"),
    [
        ("http://[::1/a.png", "SourceImageUrlInvalid", "the image URL is malformed."),
        ("http://example.com:65536/a.png", "SourceImageUrlInvalid", "the image URL is malformed."),
        ("http://example.com:http/a.png", "SourceImageUrlInvalid", "the image URL is malformed."),
        ("http:///a.png", "SourceImageUrlInvalid", "the image URL has no host."),
        (
            "http://" + "ä" * 64 + ".example/a.png",
            "SourceImageUrlInvalid",
            "the image URL's host cannot be encoded as ASCII.",
        ),
        (
            "http://a..example/a.png",
            "SourceImageUrlInvalid",
            "the image URL's host cannot be encoded as ASCII.",
        ),
        (
            "http://example.com/a b.png",
            "SourceImageUrlInvalid",
            "the image URL holds whitespace or control characters.",
        ),
        (
            "http://example.com/" + "a" * 8192,
            "SourceImageUrlInvalid",
            "the image URL is longer than 8192 characters.",
        ),
        (
            "http://93.184.215.14:8080/a.png",
            "SourceImageUrlRefused",
            "the image URL names port 8080; images are fetched from ports 80 and 443 only.",
        ),
        (
            "https://example.com:22/a.png",
            "SourceImageUrlRefused",
            "the image URL names port 22; images are fetched from ports 80 and 443 only.",
        ),
    ],
    ids=[
        "bracket",
        "port-range",
        "port-name",
        "no-host",
        "idna-label",
        "empty-label",
        "space",
        "long",
        "port-8080",
        "port-22",
    ],
)
async def test_bad_urls_are_refused_before_any_lookup(
    client: Any, db: Any, vision_model: str, url: str, rc: str, text: str
) -> None:
    user_id, key = await new_user(db, kudos=100)
    r = await post(client, image_body(vision_model, url), key)
    refusal(r, 400, rc, text)
    await nothing_stored(db, user_id, 100.0)


async def test_a_bad_url_is_refused_before_any_other_image_is_fetched(
    local: Any, db: Any, vision_model: str, hostile_server: Server
) -> None:
    user_id, key = await new_user(db, kudos=100)
    before = hostile_server.count("/img.png")
    r = await post(local, image_body(vision_model, f"{hostile_server.url}/img.png", "http://[::1/a.png"), key)
    refusal(
        r, 400, "SourceImageUrlInvalid", "the image URL is malformed.", "messages[0].content[2].image_url.url"
    )
    assert hostile_server.count("/img.png") == before
    await nothing_stored(db, user_id, 100.0)


# --- Bodies and deadlines -------------------------------------------------------------------------------------


async def test_compressed_bodies_are_refused_undecompressed(
    local: Any, db: Any, vision_model: str, hostile_server: Server, admission_env: dict[str, str]
) -> None:
    user_id, key = await new_user(db, kudos=100)
    objects = stored_objects(admission_env)
    r = await post(local, image_body(vision_model, f"{hostile_server.url}/gzip"), key)
    refusal(
        r,
        400,
        "SourceImageUrlInvalid",
        "the image URL answered with a compressed body (Content-Encoding: gzip); images are fetched uncompressed.",
    )
    await nothing_stored(db, user_id, 100.0)
    assert stored_objects(admission_env) == objects


async def test_a_declared_length_above_the_cap_is_refused_unread(
    local: Any, db: Any, vision_model: str, hostile_server: Server
) -> None:
    user_id, key = await new_user(db, kudos=100)
    r = await post(local, image_body(vision_model, f"{hostile_server.url}/declared-big"), key)
    refusal(r, 400, "SourceImageSizeExceeded", "the image takes 6291456 bytes; at most 5242880 are allowed.")
    await nothing_stored(db, user_id, 100.0)


async def test_a_fetch_has_a_deadline(local: Any, db: Any, vision_model: str, hostile_server: Server) -> None:
    local.fetcher(fetch_deadline=1.0)
    user_id, key = await new_user(db, kudos=100)
    r = await post(local, image_body(vision_model, f"{hostile_server.url}/slow"), key)
    refusal(r, 400, "SourceImageUrlInvalid", "the image URL did not answer within 1 seconds.")  # the bound
    await nothing_stored(db, user_id, 100.0)


async def test_the_image_stage_has_a_deadline(
    local: Any, db: Any, vision_model: str, hostile_server: Server
) -> None:
    local.fetcher(fetch_deadline=5.0, stage_deadline=1.0)
    user_id, key = await new_user(db, kudos=100)
    url = f"{hostile_server.url}/delay"
    r = await post(local, image_body(vision_model, url, url, url), key)
    # The first fetch takes 0.6 s, the second is cut at 1 s.
    refusal(
        r,
        400,
        "SourceImageUrlInvalid",
        "the request's image URLs did not answer within the 1 seconds its images may take.",
        "messages[0].content[2].image_url.url",
    )  # the stage's bound, not the fetch's (5 s)
    await nothing_stored(db, user_id, 100.0)


async def test_decoding_past_the_stage_deadline_is_503(local: Any, db: Any, vision_model: str) -> None:
    local.fetcher(stage_deadline=0.001)
    user_id, key = await new_user(db, kudos=100)
    images = [data_url(png(3000, 2000)) for _ in range(3)]
    r = await post(local, image_body(vision_model, *images), key)
    assert r.status_code == 503, r.text
    assert r.json() == {
        "rc": "ChatImageStorageUnavailable",
        "message": "The request's images could not be processed within 0.001 seconds; try again later. "
        "Nothing was charged.",
    }
    await nothing_stored(db, user_id, 100.0)


# --- Decoding: formats and Pillow's pixel limit ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["BMP", "TIFF", "ICO", "PPM"])
async def test_only_web_formats_are_decoded(client: Any, db: Any, vision_model: str, kind: str) -> None:
    user_id, key = await new_user(db, kudos=100)
    r = await post(client, image_body(vision_model, data_url(encoded(32, 32, kind), "png")), key)
    refusal(r, 400, "SourceImageUnreadable", "the image cannot be read.")
    await nothing_stored(db, user_id, 100.0)


@pytest.mark.parametrize("kind", ["JPEG", "PNG", "WEBP", "GIF"])
async def test_web_formats_are_decoded(client: Any, db: Any, vision_model: str, kind: str) -> None:
    _, key = await new_user(db, kudos=100)
    r = await post(client, image_body(vision_model, data_url(encoded(32, 32, kind), kind.lower())), key)
    assert r.status_code == 202, r.text


async def test_pillow_refuses_a_bomb_at_the_pixel_cap(client: Any, db: Any, vision_model: str) -> None:
    """Twice the cap (9437184 pixels) is refused by Pillow's own guard while the header is read."""
    user_id, key = await new_user(db, kudos=100)
    r = await post(client, image_body(vision_model, data_url(png(5000, 4000, "1"))), key)
    refusal(
        r,
        400,
        "SourceImageResolutionExceeded",
        "the image is 20000000 pixels; at most 9437184 pixels (3072x3072) are allowed.",
    )
    await nothing_stored(db, user_id, 100.0)


# --- Order: images only after every other check ---------------------------------------------------------------


async def test_no_image_is_fetched_for_a_request_refused_for_kudos(
    local: Any, db: Any, hostile_server: Server
) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"], max_length=8192, speed=100.0)
    user_id, key = await new_user(db, kudos=10)
    before = hostile_server.count("/img.png")
    r = await post(local, image_body(model, f"{hostile_server.url}/img.png", max_tokens=6000), key)
    assert r.status_code == 403, r.text
    assert r.json() == {
        "rc": "KudosUpfront",
        "message": "Due to heavy demand, for requests over 4096 tokens, the client needs to already have the "
        "required kudos. This request requires 285.71 kudos to fulfil.",
    }
    assert hostile_server.count("/img.png") == before
    await nothing_stored(db, user_id, 10.0)


async def test_no_image_is_fetched_past_a_shared_key_limit(
    local: Any, db: Any, hostile_server: Server
) -> None:
    from horde_store import users

    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"])
    owner_id, _ = await new_user(db, kudos=100)
    owner = await users.get_user(db, user_id=owner_id)
    shared = await users.create_shared_key(db, owner.username, kudos=50, max_text_tokens=32)
    before = hostile_server.count("/img.png")
    r = await post(local, image_body(model, f"{hostile_server.url}/img.png"), str(shared.id))
    assert r.status_code == 400
    assert r.json() == {
        "rc": "BadRequest",
        "message": "This shared key is limited to 32 tokens per request; max_tokens is 64.",
    }
    assert hostile_server.count("/img.png") == before
    await nothing_stored(db, owner_id, 100.0)


# --- truncate_oldest drops images: not fetched, charged or required -----------------------------------------


async def test_images_in_dropped_turns_are_neither_fetched_charged_nor_required(
    local: Any, db: Any, hostile_server: Server, admission_env: dict[str, str]
) -> None:
    model = unique_model()
    # A worker without vision: only the sized request, whose image was dropped, can be served by it.
    await add_chat_worker(db, model, max_context_length=1024, max_length=512)
    user_id, key = await new_user(db, kudos=100)
    before = hostile_server.count("/img.png")
    objects = stored_objects(admission_env)
    old_turn = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": f"{hostile_server.url}/img.png"}},
    ]
    horde = {"context_fit": "truncate_oldest", "max_context_length": 1024}
    body: dict[str, Any] = {
        "model": model,
        "messages": [
            {"role": "user", "content": old_turn},
            {"role": "assistant", "content": "A square."},
            {"role": "user", "content": "q" * 1200},
        ],
        "max_tokens": 400,
        "horde": horde,
    }
    dry = await post(local, dict(body, horde=dict(horde, dry_run=True)), key)
    assert dry.status_code == 200, dry.text
    r = await post(local, body, key)
    assert r.status_code == 202, r.text
    assert "message" not in r.json()  # the worker without vision is eligible
    row = await db.fetchrow(
        "SELECT messages, has_images, chat_required_features, consumed_kudos, context_adjustments "
        "FROM waiting_prompts WHERE id = $1",
        uuid.UUID(r.json()["id"]),
    )
    assert len(row["messages"]) == 1 and not row["has_images"]
    assert "vision" not in row["chat_required_features"]
    assert [a["reason"] for a in row["context_adjustments"]] == ["truncate_oldest"]
    # The horde tax without the 5 kudos of an image, in the quote and the charge.
    assert row["consumed_kudos"] == 1.0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 99.0
    assert dry.json()["kudos"] == r.json()["kudos"]
    assert hostile_server.count("/img.png") == before
    assert stored_objects(admission_env) == objects
