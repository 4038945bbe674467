"""Images in chat requests: stored as JPEGs under horde-r2 references, the caps, the public fetch, storage
failures (docs/native-api.md#images)."""

from __future__ import annotations

import base64
import io
import os
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import boto3
import pytest
from admission_helpers import add_chat_worker, new_user, unique_model
from botocore.config import Config
from PIL import Image

pytestmark = pytest.mark.asyncio(loop_scope="session")

VISION = ["prompt_overflow_refused", "vision"]


def png(width: int = 64, height: int = 48, mode: str = "RGBA") -> bytes:
    color: Any = (255, 0, 0, 0) if mode == "RGBA" else (0, 128, 255)
    out = io.BytesIO()
    Image.new(mode, (width, height), color).save(out, format="PNG")
    return out.getvalue()


def data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(data).decode()


def image_body(model: str, *urls: str, **extra: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": "What is this?"}]
    parts += [{"type": "image_url", "image_url": {"url": u, "detail": "low"}} for u in urls]
    return {"model": model, "messages": [{"role": "user", "content": parts}], "max_tokens": 64, **extra}


def s3_client(env: dict[str, str]) -> Any:
    return boto3.session.Session().client(
        "s3",
        endpoint_url=env["HORDE_S3_ENDPOINT_URL"],
        aws_access_key_id=env["HORDE_S3_ACCESS_KEY_ID"],
        aws_secret_access_key=env["HORDE_S3_SECRET_ACCESS_KEY"],
        region_name=env["HORDE_S3_REGION"],
        config=Config(s3={"addressing_style": "path"}),
    )


@pytest.fixture(scope="module")
def image_server() -> Iterator[str]:
    """A local HTTP server: /img.png (200), /moved (302 to /img.png), /loop (302 to itself), else 404."""
    body = png(mode="RGB")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/img.png":
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            elif self.path in ("/moved", "/loop"):
                self.send_response(302)
                self.send_header("Location", "/img.png" if self.path == "/moved" else "/loop")
                self.end_headers()
            else:
                self.send_response(404)
                self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def post(client: Any, body: Any, key: str) -> Any:
    return await client.post("/api/v2/generate/chat/async", json=body, headers={"apikey": key})


async def test_data_url_image_is_stored_as_jpeg(client: Any, db: Any, admission_env: dict[str, str]) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"])
    user_id, key = await new_user(db, kudos=100)
    r = await post(client, image_body(model, data_url(png())), key)
    assert r.status_code == 202, r.text
    rid = r.json()["id"]
    row = await db.fetchrow("SELECT * FROM waiting_prompts WHERE id = $1", uuid.UUID(rid))
    part = row["messages"][0]["content"][1]
    assert part == {
        "type": "image_url",
        "image_url": {"url": f"horde-r2://{rid}_chat_0.jpg", "detail": "low"},
    }
    assert row["has_images"] and row["active"] and "vision" in row["chat_required_features"]
    assert "[image]" in row["prompt"] and "base64" not in str(row["messages"])
    # the horde tax with one image: 1 + 5
    assert row["consumed_kudos"] == 6.0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 94.0
    stored = s3_client(admission_env).get_object(
        Bucket=admission_env["HORDE_S3_IMAGE_BUCKET"], Key=f"{rid}_chat_0.jpg"
    )
    assert stored["ContentType"] == "image/jpeg"
    image = Image.open(io.BytesIO(stored["Body"].read()))
    assert (image.format, image.mode, image.size) == ("JPEG", "RGB", (64, 48))
    # transparency is flattened onto white
    pixel = image.getpixel((10, 10))
    assert isinstance(pixel, tuple) and pixel[0] > 240 and pixel[1] > 240


async def test_large_image_is_scaled_down(client: Any, db: Any, admission_env: dict[str, str]) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["base64"])
    _, key = await new_user(db)
    r = await post(client, image_body(model, data_url(png(3000, 1500, "RGB"))), key)
    assert r.status_code == 202, r.text
    stored = s3_client(admission_env).get_object(
        Bucket=admission_env["HORDE_S3_IMAGE_BUCKET"], Key=f"{r.json()['id']}_chat_0.jpg"
    )
    assert Image.open(io.BytesIO(stored["Body"].read())).size == (2048, 1024)


async def test_image_refusals(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"])
    user_id, key = await new_user(db)
    path = "'messages[0].content[1].image_url.url'"

    r = await post(client, image_body(model, data_url(b"not an image")), key)
    assert (r.status_code, r.json()["rc"]) == (400, "SourceImageUnreadable")
    assert r.json()["message"] == f"{path}: the image cannot be read."

    # Past Image.MAX_IMAGE_PIXELS but under twice it: Pillow warns (the test run turns warnings into errors,
    # which the header read would take for a bomb) and the size check refuses it.
    with pytest.warns(Image.DecompressionBombWarning):
        r = await post(client, image_body(model, data_url(png(4000, 3000, "RGB"))), key)
    assert (r.status_code, r.json()["rc"]) == (400, "SourceImageResolutionExceeded")
    assert r.json()["message"].startswith(f"{path}: the image is 4000x3000 pixels")

    # An untrusted user's images may total 5 MiB, counted on the data URLs before anything is decoded.
    blob = os.urandom(3 * 1024 * 1024)
    r = await post(client, image_body(model, data_url(blob), data_url(blob)), key)
    assert (r.status_code, r.json()["rc"]) == (400, "SourceImageSizeExceeded")
    assert (
        r.json()["message"]
        == f"The request's images total {2 * len(blob)} bytes, above the cap of 5242880 bytes."
    )
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0

    # No online worker with vision and a transport: the request is served nowhere, but a known model.
    other = unique_model()
    await add_chat_worker(db, other)
    r = await post(client, image_body(other, data_url(png()), horde={"dry_run": True}), key)
    assert r.status_code == 200 and r.json()["kudos"] == round(64 * 3.4 / 100 + 1 + 6)


async def test_public_fetch_refuses_private_addresses(client: Any, db: Any, image_server: str) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"])
    _, key = await new_user(db)
    r = await post(client, image_body(model, f"{image_server}/img.png"), key)
    assert (r.status_code, r.json()["rc"]) == (400, "SourceImageUrlRefused")
    assert r.json()["message"].startswith("'messages[0].content[1].image_url.url': ")


async def test_fetch_follows_redirects_and_refuses_bad_answers(
    make_client: Any, db: Any, image_server: str, admission_env: dict[str, str]
) -> None:
    local = await make_client(image_fetch_allow_private=True)
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"])
    _, key = await new_user(db)
    r = await post(local, image_body(model, f"{image_server}/moved"), key)
    assert r.status_code == 202, r.text
    stored = s3_client(admission_env).get_object(
        Bucket=admission_env["HORDE_S3_IMAGE_BUCKET"], Key=f"{r.json()['id']}_chat_0.jpg"
    )
    assert Image.open(io.BytesIO(stored["Body"].read())).format == "JPEG"
    row = await db.fetchrow("SELECT messages FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"]))
    assert image_server not in str(row["messages"])  # the submitted URL is never stored

    r = await post(local, image_body(model, f"{image_server}/missing.png"), key)
    assert (r.status_code, r.json()["rc"]) == (400, "SourceImageUrlInvalid")
    assert r.json()["message"].endswith("the image URL answered with HTTP 404.")
    r = await post(local, image_body(model, f"{image_server}/loop"), key)
    assert (r.status_code, r.json()["rc"]) == (400, "SourceImageUrlRefused")


async def test_storage_failure_is_503_and_charges_nothing(make_client: Any, db: Any) -> None:
    broken = await make_client(s3_image_bucket=f"missing-{uuid.uuid4().hex[:8]}")
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"])
    user_id, key = await new_user(db, kudos=100)
    r = await post(broken, image_body(model, data_url(png())), key)
    assert r.json() == {
        "message": "The request's images could not be stored; try again later. Nothing was charged.",
        "rc": "ChatImageStorageUnavailable",
    }
    assert r.status_code == 503
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 100.0


async def test_operation_key_with_images(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, features=VISION, image_transports=["url"])
    _, key = await new_user(db)
    op = str(uuid.uuid4())
    body = image_body(model, data_url(png()), horde={"operation_key": op})
    first = await post(client, body, key)
    assert first.status_code == 202
    again = await post(client, body, key)
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    row = await db.fetchrow(
        "SELECT operation_key, active FROM waiting_prompts WHERE id = $1", uuid.UUID(first.json()["id"])
    )
    assert str(row["operation_key"]) == op and row["active"]
