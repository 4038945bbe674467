"""Money under concurrency: one requester firing requests in parallel on the chat and the text
route never gets more upfront kudos held than it can cover, for its own balance and for a shared key's kudos.

The requests go over HTTP to two real admission processes (``python -m horde_admission``) on the shared stores,
so the check-and-hold races across connections and processes exactly as it would in production; the stored
rows are read back afterwards.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from admission_helpers import add_chat_worker, new_user, unique_model
from horde_store import users
from horde_testing.launcher import ServiceProcess, free_port

#: Requests the requester can afford; it fires four times as many.
N = 5
#: max_length 210 on a model the reference does not list (multiplier 1): a hold of round(210 / 21, 2) = 10
#: kudos on either route, and the horde tax of 1 at creation.
MAX_LENGTH = 210
HOLD = 10.0
TAX = 1.0
#: The user's floor (create_user's default min_kudos).
MIN_KUDOS = 25.0

KUDOS_UPFRONT = re.compile(
    r"Due to heavy demand, for requests over \d+ tokens, the client needs to already have the required kudos\. "
    r"This request requires 10 kudos to fulfil\."
)


@pytest.fixture(scope="module")
def admissions(admission_env: dict[str, str], dispatch: Any) -> Iterator[list[str]]:
    """Two admission processes on the shared stores (rate limits off, no availability cache): their base URLs."""
    started: list[ServiceProcess] = []
    bases: list[str] = []
    try:
        for index in range(2):
            port = free_port()
            env = {
                **admission_env,
                "HORDE_ADMISSION_HTTP_PORT": str(port),
                "HORDE_DISPATCH_GRPC_TARGET": dispatch.target,
                "HORDE_SUBMIT_GRPC_TARGET": "127.0.0.1:9",
                "HORDE_RATE_LIMITS_ENABLED": "false",
                "HORDE_AVAILABILITY_CACHE_SECONDS": "0",
                "HORDE_LOG_JSON": "false",
            }
            process = ServiceProcess(
                f"admission-{index}",
                [sys.executable, "-m", "horde_admission"],
                env,
                f"http://127.0.0.1:{port}/readyz",
            )
            started.append(process)
            process.start()
        for process in started:
            process.wait_healthy()
        bases = [p.health_url.removesuffix("/readyz") for p in started if p.health_url]
        yield bases
    finally:
        for process in started:
            process.stop()


def chat(model: str) -> dict[str, Any]:
    """A chat request that always needs a hold (no slow workers) of :data:`HOLD`."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": MAX_LENGTH,
        "horde": {"slow_workers": False, "max_context_length": 2048},
    }


def text(model: str) -> dict[str, Any]:
    """A legacy text request that always needs a hold (no slow workers) of :data:`HOLD`."""
    return {
        "prompt": "hello",
        "models": [model],
        "params": {"max_length": MAX_LENGTH, "max_context_length": 2048},
        "slow_workers": False,
    }


async def fire(bases: list[str], model: str, apikey: str, count: int) -> list[tuple[str, httpx.Response]]:
    """``count`` requests at once, alternating the chat and the text route and the two processes."""
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(i: int) -> tuple[str, httpx.Response]:
            base = bases[i % len(bases)]
            if (i // len(bases)) % 2 == 0:
                r = await client.post(
                    f"{base}/api/v2/generate/chat/async", json=chat(model), headers={"apikey": apikey}
                )
                return "chat", r
            r = await client.post(
                f"{base}/api/v2/generate/text/async", json=text(model), headers={"apikey": apikey}
            )
            return "text", r

        return await asyncio.gather(*(one(i) for i in range(count)))


async def served_model(db: Any) -> str:
    """A model an online, fast chat worker serves (also text), so every request has an eligible worker."""
    model = unique_model()
    await add_chat_worker(db, model, max_length=2048, max_context_length=8192, speed=100, threads=4)
    return model


async def test_parallel_requests_never_hold_more_than_the_balance(admissions: list[str], db: Any) -> None:
    model = await served_model(db)
    # Kudos for exactly N held requests: each costs its hold plus the horde tax, above the floor.
    start = MIN_KUDOS + N * (HOLD + TAX)
    user_id, key = await new_user(db, kudos=start, concurrency=1000)

    results = await fire(admissions, model, key, 4 * N)

    accepted = [(route, r) for route, r in results if r.status_code == 202]
    refused = [(route, r) for route, r in results if r.status_code != 202]
    assert len(accepted) == N, [(route, r.status_code, r.text) for route, r in results]
    assert {route for route, _ in results} == {"chat", "text"}
    for route, r in refused:
        body = r.json()
        assert (r.status_code, body["rc"]) == (403, "KudosUpfront"), (route, r.text)
        assert KUDOS_UPFRONT.fullmatch(body["message"]), (route, body["message"])

    holds = await db.fetch("SELECT wp_id, amount FROM kudos_holds WHERE user_id = $1", user_id)
    assert sorted(str(h["wp_id"]) for h in holds) == sorted(r.json()["id"] for _, r in accepted)
    assert all(h["amount"] == HOLD for h in holds)
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == N
    balance = await db.fetchrow(
        """
        SELECT u.kudos, u.min_kudos,
               u.kudos - u.min_kudos - coalesce((SELECT sum(amount) FROM kudos_holds h WHERE h.user_id = u.id), 0)
                   AS available
        FROM users u WHERE u.id = $1
        """,
        user_id,
    )
    assert balance["kudos"] == pytest.approx(start - N * TAX)
    # Never below the floor: the holds fit in what the user had above it.
    assert balance["available"] == pytest.approx(0.0)
    assert balance["available"] >= -1e-9


async def test_parallel_requests_never_hold_more_than_the_shared_key_has(
    admissions: list[str], db: Any
) -> None:
    model = await served_model(db)
    owner_id, _ = await new_user(db, kudos=100_000, concurrency=1000)
    owner = await users.get_user(db, user_id=owner_id)
    # Kudos for exactly N held requests on the key: each takes the tax from it and holds HOLD against it.
    key_kudos = N * (HOLD + TAX)
    shared = await users.create_shared_key(db, owner.username, kudos=key_kudos)

    results = await fire(admissions, model, str(shared.id), 4 * N)

    accepted = [(route, r) for route, r in results if r.status_code == 202]
    refused = [(route, r) for route, r in results if r.status_code != 202]
    assert len(accepted) == N, [(route, r.status_code, r.text) for route, r in results]
    assert {route for route, _ in refused} == {"chat", "text"}
    for route, r in refused:
        # The key's holds and taxes used it up: each refusal sees none of its kudos left.
        assert (r.status_code, r.json()) == (
            403,
            {
                "message": f"This shared key has 0 kudos left; the request needs {HOLD:g}.",
                "rc": "SharedKeyInsufficientKudos",
            },
        ), route

    holds = await db.fetch(
        "SELECT wp_id, amount, shared_key_id FROM kudos_holds WHERE user_id = $1", owner_id
    )
    assert sorted(str(h["wp_id"]) for h in holds) == sorted(r.json()["id"] for _, r in accepted)
    assert all((h["amount"], h["shared_key_id"]) == (HOLD, shared.id) for h in holds)
    rows = await db.fetch("SELECT shared_key_id FROM waiting_prompts WHERE user_id = $1", owner_id)
    assert [r["shared_key_id"] for r in rows] == [shared.id] * N
    key_row = await db.fetchrow("SELECT kudos, utilized FROM user_shared_keys WHERE id = $1", shared.id)
    assert (key_row["kudos"], key_row["utilized"]) == (
        pytest.approx(key_kudos - N * TAX),
        pytest.approx(N * TAX),
    )
    # The key's holds fit in its kudos.
    assert sum(h["amount"] for h in holds) <= key_row["kudos"] + 1e-9
    # The owner, rich, was charged only the taxes.
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", owner_id) == pytest.approx(
        100_000 - N * TAX
    )


async def test_a_shared_key_hold_counts_against_later_requests(admissions: list[str], db: Any) -> None:
    """Sequentially too: a held request's kudos are not available to the next request on the same key."""
    model = await served_model(db)
    owner_id, _ = await new_user(db, kudos=100_000)
    owner = await users.get_user(db, user_id=owner_id)
    shared = await users.create_shared_key(db, owner.username, kudos=15)
    async with httpx.AsyncClient(timeout=30) as client:
        url = f"{admissions[0]}/api/v2/generate/chat/async"
        first = await client.post(url, json=chat(model), headers={"apikey": str(shared.id)})
        assert first.status_code == 202, first.text
        second = await client.post(url, json=chat(model), headers={"apikey": str(shared.id)})
    assert (second.status_code, second.json()) == (
        403,
        {
            "message": "This shared key has 4 kudos left; the request needs 10.",
            "rc": "SharedKeyInsufficientKudos",
        },
    )
    key_row = await db.fetchrow("SELECT kudos, utilized FROM user_shared_keys WHERE id = $1", shared.id)
    assert (key_row["kudos"], key_row["utilized"]) == (14.0, 1.0)
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE shared_key_id = $1", shared.id) == 1
