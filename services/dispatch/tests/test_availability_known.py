"""``GetAvailability``: which workers keep a model known, and what the declaration gap names for images.

See docs/native-api.md#known-models (a model is known while an online chat worker serves it, paused or in
maintenance included; only the workers that take the requester's jobs serve it) and #impossible-reason
(``image_transports`` is named only for a worker that declares vision without an image transport).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from horde.dispatch.v1 import worker_pool_pb2, worker_pool_pb2_grpc
from horde_core.grpc import check_health, insecure_channel

pytestmark = pytest.mark.asyncio(loop_scope="session")

Harness = Any
CHAT_MODEL = "koboldcpp/test-chat-7b"
VISION_REQUEST = {"required_features": ["prompt_overflow_refused", "vision"], "has_images": True}


@pytest_asyncio.fixture(loop_scope="session")
async def stub(h: Harness) -> AsyncIterator[Any]:
    async with insecure_channel(f"127.0.0.1:{h.settings.dispatch_grpc_port}") as channel:
        assert await check_health(channel, "horde.dispatch.v1.WorkerPoolService")
        yield worker_pool_pb2_grpc.WorkerPoolServiceStub(channel)


async def ask(stub: Any, **fields: Any) -> Any:
    fields.setdefault("slow_workers", True)
    return await stub.GetAvailability(worker_pool_pb2.GetAvailabilityRequest(**fields), timeout=5)


async def add_worker(h: Harness, key: str, name: str, **declaration: Any) -> None:
    r = await h.pop(key, h.chat_body(name, **declaration))
    assert r.status_code == 200, r.text


async def test_paused_and_maintenance_workers_keep_the_model_known(h: Harness, stub: Any) -> None:
    owner, key = await h.user()
    await add_worker(h, key, "k-1", threads=2)
    await add_worker(h, key, "k-2", chat_limits={"max_context_length": 32768, "max_length": 4096})
    r = await ask(stub, models=[CHAT_MODEL], max_length=512)
    assert (r.known_workers, r.serving_workers, r.eligible_workers, r.max_chat_length) == (2, 2, 2, 4096)

    # In maintenance or paused: still known, no longer serving (nor counted in the limits) for others.
    await h.set_worker("k-1", maintenance=True)
    await h.set_worker("k-2", paused=True)
    r = await ask(stub, models=[CHAT_MODEL], max_length=512)
    assert (r.known_workers, r.serving_workers, r.eligible_workers, r.eligible_threads) == (2, 0, 0, 0)
    assert (r.max_chat_length, r.max_chat_context_length) == (0, 0)
    assert not r.HasField("declaration_gap")
    # Their owner is still served by them.
    r = await ask(stub, models=[CHAT_MODEL], max_length=512, requester_user_id=owner)
    assert (r.known_workers, r.serving_workers, r.eligible_workers, r.max_chat_length) == (2, 2, 2, 4096)

    # Offline (past 300 s) or without chat: not known.
    past = await h.db.fetchval("SELECT now() - interval '301 seconds'")
    await h.set_worker("k-1", last_check_in=past)
    r = await ask(stub, models=[CHAT_MODEL])
    assert (r.known_workers, r.serving_workers) == (1, 0)
    await add_worker(h, key, "k-2", chat_jobs=False)
    r = await ask(stub, models=[CHAT_MODEL])
    assert (r.known_workers, r.serving_workers) == (0, 0)


async def test_gap_names_image_transports_only_for_vision_workers(h: Harness, stub: Any) -> None:
    _, key = await h.user()
    # A worker without vision lacks vision, not a transport (even with none declared).
    await add_worker(h, key, "v-plain", chat_features=["prompt_overflow_refused"])
    r = await ask(stub, models=[CHAT_MODEL], **VISION_REQUEST)
    assert r.eligible_workers == 0
    assert list(r.declaration_gap.missing_declarations) == ["vision"]
    assert list(r.declaration_gap.exceeded_limits) == []
    # A caller that left vision out of the features still gets vision, never image_transports.
    r = await ask(stub, models=[CHAT_MODEL], required_features=["prompt_overflow_refused"], has_images=True)
    assert (r.eligible_workers, list(r.declaration_gap.missing_declarations)) == (0, ["vision"])

    # A vision worker without url or base64 is the one that names image_transports.
    await add_worker(h, key, "v-eyes", chat_features=["prompt_overflow_refused", "vision"])
    r = await ask(stub, models=[CHAT_MODEL], **VISION_REQUEST)
    assert list(r.declaration_gap.missing_declarations) == ["image_transports", "vision"]
    await add_worker(h, key, "v-plain", chat_features=["prompt_overflow_refused"], chat_jobs=False)
    r = await ask(stub, models=[CHAT_MODEL], **VISION_REQUEST)
    assert list(r.declaration_gap.missing_declarations) == ["image_transports"]
    # messages_url alone does not carry images either.
    await add_worker(
        h,
        key,
        "v-eyes",
        chat_features=["prompt_overflow_refused", "vision"],
        image_transports=["messages_url"],
    )
    r = await ask(stub, models=[CHAT_MODEL], **VISION_REQUEST)
    assert list(r.declaration_gap.missing_declarations) == ["image_transports"]
    # With a transport it is eligible and there is no gap.
    await add_worker(
        h, key, "v-eyes", chat_features=["prompt_overflow_refused", "vision"], image_transports=["base64"]
    )
    r = await ask(stub, models=[CHAT_MODEL], **VISION_REQUEST)
    assert (r.eligible_workers, r.HasField("declaration_gap")) == (1, False)
