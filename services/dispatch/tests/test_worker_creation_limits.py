"""Worker creation limits at pop (docs/native-api.md#workers; upstream ``JobPopTemplate.get_worker``): an
untrusted owner already holding more than 3 workers gets 403 TooManyWorkers, any owner past 20 and past its
``worker_invited`` allowance 403 TooManyWorkersTrusted; an existing worker keeps checking in; parallel pops
with new names cannot create past the limit together. The app runs in-process on the real stores."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from horde_dispatch.workers import (
    TOO_MANY_SAME_IPS_MESSAGE,
    TOO_MANY_WORKERS_MESSAGE,
    TOO_MANY_WORKERS_TRUSTED_MESSAGE,
    creation_refusal,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")


def _name() -> str:
    return f"w_{uuid.uuid4().hex[:12]}"


async def _add_workers(h: Any, user_id: int, count: int, ipaddr: str = "192.0.2.50") -> None:
    await h.db.executemany(
        "INSERT INTO workers (user_id, name, ipaddr, last_check_in) VALUES ($1, $2, $3, now() - interval '1 day')",
        [(user_id, _name(), ipaddr) for _ in range(count)],
    )


async def test_an_untrusted_owner_gets_at_most_four_workers(h: Any) -> None:
    _, key = await h.user()
    names = [_name() for _ in range(4)]
    for name in names:
        r = await h.pop(key, h.chat_body(name))
        assert r.status_code == 200, r.text
    r = await h.pop(key, h.chat_body(_name()))
    assert r.status_code == 403
    assert r.json() == {"message": TOO_MANY_WORKERS_MESSAGE, "rc": "TooManyWorkers"}
    assert r.json()["message"] == "To avoid abuse, untrusted users can only have up to 3 distinct workers."
    # the existing ones still check in
    assert (await h.pop(key, h.chat_body(names[0]))).status_code == 200


async def test_a_trusted_owner_gets_twenty_one_unless_invited_for_more(h: Any) -> None:
    user_id, key = await h.user(trusted=True)
    await _add_workers(h, user_id, 20)
    assert (await h.pop(key, h.chat_body(_name()))).status_code == 200  # 20 held: the 21st is created
    r = await h.pop(key, h.chat_body(_name()))
    assert r.status_code == 403
    assert r.json() == {"message": TOO_MANY_WORKERS_TRUSTED_MESSAGE, "rc": "TooManyWorkersTrusted"}
    assert "onboard more than 20 workers as a trusted user" in r.json()["message"]

    await h.db.execute("UPDATE users SET worker_invited = 30 WHERE id = $1", user_id)
    assert (await h.pop(key, h.chat_body(_name()))).status_code == 200


async def test_the_untrusted_limit_ignores_the_invitation(h: Any) -> None:
    user_id, key = await h.user()
    await h.db.execute("UPDATE users SET worker_invited = 50 WHERE id = $1", user_id)
    await _add_workers(h, user_id, 4)
    r = await h.pop(key, h.chat_body(_name()))
    assert (r.status_code, r.json()["rc"]) == (403, "TooManyWorkers")


async def test_parallel_pops_with_new_names_cannot_pass_the_limit(h: Any) -> None:
    user_id, key = await h.user()
    results = await asyncio.gather(*(h.pop(key, h.chat_body(_name())) for _ in range(12)))
    statuses = sorted(r.status_code for r in results)
    assert statuses == [200] * 4 + [403] * 8, [r.text for r in results]
    assert await h.db.fetchval("SELECT count(*) FROM workers WHERE user_id = $1", user_id) == 4


async def test_an_address_holds_four_workers_unless_trusted_or_invited(h: Any) -> None:
    """More than 3 workers already on an address (any owners): a new one is 403 TooManySameIPs, unless its
    owner is trusted (20) or invited for more; the address's existing workers keep checking in."""
    address = f"192.0.2.{uuid.uuid4().int % 200 + 20}"
    transport = httpx.ASGITransport(app=h.app, client=(address, 4321))
    async with httpx.AsyncClient(transport=transport, base_url="http://dispatch") as remote:

        async def pop(key: str, name: str) -> httpx.Response:
            return await remote.post(
                "/api/v2/generate/text/pop", json=h.chat_body(name), headers={"apikey": key}
            )

        first: list[tuple[str, str]] = []
        for _ in range(2):
            _, key = await h.user()
            for _ in range(2):
                name = _name()
                assert (await pop(key, name)).status_code == 200
                first.append((key, name))
        _, newcomer = await h.user()
        r = await pop(newcomer, _name())
        assert r.status_code == 403
        assert r.json() == {"message": TOO_MANY_SAME_IPS_MESSAGE, "rc": "TooManySameIPs"}
        assert r.json()["message"].startswith("You are running too many workers from the same location.")
        # the same owner from another address is fine, and the address's workers still check in
        assert (await h.pop(newcomer, h.chat_body(_name()))).status_code == 200
        assert (await pop(*first[0])).status_code == 200

        _, trusted = await h.user(trusted=True)
        assert (await pop(trusted, _name())).status_code == 200
        invited_id, invited = await h.user()
        await h.db.execute("UPDATE users SET worker_invited = 10 WHERE id = $1", invited_id)
        assert (await pop(invited, _name())).status_code == 200
    stored = await h.db.fetchval("SELECT count(*) FROM workers WHERE ipaddr = $1", address)
    assert stored == 6


async def test_loopback_workers_are_not_counted(h: Any) -> None:
    """Workers on the broker's own host (127.0.0.1: make run, the tests) are not an address's workers."""
    for _ in range(3):
        _, key = await h.user()
        for _ in range(2):
            assert (await h.pop(key, h.chat_body(_name()))).status_code == 200


async def test_refusal_order_and_thresholds() -> None:
    """Upstream's order: the owner's count first (untrusted > 3; anyone > 20 and > worker_invited), then the
    address (> 3, trusted > 20, and > worker_invited)."""
    assert creation_refusal(trusted=False, worker_invited=0, workers=3, same_ip=3) is None
    refusal = creation_refusal(trusted=False, worker_invited=0, workers=4, same_ip=9)
    assert refusal is not None and refusal.rc == "TooManyWorkers"
    refusal = creation_refusal(trusted=False, worker_invited=0, workers=0, same_ip=4)
    assert refusal is not None and (refusal.status, refusal.rc) == (403, "TooManySameIPs")
    assert creation_refusal(trusted=True, worker_invited=0, workers=0, same_ip=20) is None
    assert creation_refusal(trusted=True, worker_invited=0, workers=0, same_ip=21) is not None
    assert creation_refusal(trusted=True, worker_invited=25, workers=21, same_ip=21) is None
