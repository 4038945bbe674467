"""Whose address a pop comes from: ``X-Forwarded-For`` counts only from a trusted proxy
(``HORDE_FORWARDED_ALLOW_IPS``, passed to uvicorn); unset, nobody is trusted, loopback included (uvicorn's own
default would trust 127.0.0.1). Real dispatch processes on the real stores; the worker's stored ``ipaddr`` (what
the same-IP rules count) and the pop's per-address limit show which address was used."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator

import httpx
import pytest
from horde_store.db import connect
from horde_testing.launcher import ServiceProcess, free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY
from horde_testing.seed import create_test_user

pytestmark = pytest.mark.asyncio(loop_scope="session")

MODEL = "koboldcpp/forwarded-7b"
CLIENT = "203.0.113.7"


def _start(env: dict[str, str], trusted: str | None) -> tuple[ServiceProcess, str]:
    port = free_port()
    env = {
        **env,
        "HORDE_DISPATCH_HTTP_PORT": str(port),
        "HORDE_DISPATCH_GRPC_PORT": str(free_port()),
        "HORDE_LOG_JSON": "false",
        "HORDE_POP_REQUEST_LIMIT_PER_IP": "2/minute",
    }
    if trusted is not None:
        env["HORDE_FORWARDED_ALLOW_IPS"] = trusted
    name = f"dispatch-{'trusted' if trusted else 'untrusted'}"
    process = ServiceProcess(
        name, [sys.executable, "-m", "horde_dispatch"], env, f"http://127.0.0.1:{port}/readyz"
    )
    process.start()
    return process, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def dispatches(horde_settings_env: dict[str, str]) -> Iterator[dict[str, str]]:
    """One dispatch that trusts 127.0.0.1 as a proxy, one with HORDE_FORWARDED_ALLOW_IPS unset."""
    started = [_start(horde_settings_env, "127.0.0.1"), _start(horde_settings_env, None)]
    try:
        for process, _ in started:
            process.wait_healthy()
        yield {"trusted": started[0][1], "untrusted": started[1][1]}
    finally:
        for process, _ in started:
            process.stop()


def _pop_body(name: str) -> dict[str, object]:
    return {"name": name, "models": [MODEL], "max_length": 512, "max_context_length": 4096}


async def _pop(url: str, key: str, name: str, forwarded: str | None) -> httpx.Response:
    headers = {"apikey": key}
    if forwarded is not None:
        headers["X-Forwarded-For"] = forwarded
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.post(f"{url}/api/v2/generate/text/pop", json=_pop_body(name), headers=headers)


async def test_forwarded_for_is_honoured_only_from_a_trusted_proxy(
    horde_settings_env: dict[str, str], dispatches: dict[str, str]
) -> None:
    db = await connect(horde_settings_env["HORDE_DATABASE_URL"])
    try:
        user = await create_test_user(db, salt=TEST_SECRET_KEY, trusted=True)
        trusted_name, untrusted_name = f"w_{uuid.uuid4().hex[:10]}", f"w_{uuid.uuid4().hex[:10]}"
        # The trusted proxy (127.0.0.1) names the client: the right-most address it did not add itself.
        r = await _pop(dispatches["trusted"], user.api_key, trusted_name, f"198.51.100.1, {CLIENT}")
        assert r.status_code == 200, r.text
        # From an untrusted peer the header is the client's own claim: ignored.
        r = await _pop(dispatches["untrusted"], user.api_key, untrusted_name, CLIENT)
        assert r.status_code == 200, r.text
        stored = {
            row["name"]: row["ipaddr"]
            for row in await db.fetch(
                "SELECT name, ipaddr FROM workers WHERE name = ANY($1::text[])",
                [trusted_name, untrusted_name],
            )
        }
        assert stored == {trusted_name: CLIENT, untrusted_name: "127.0.0.1"}

        # What a trusted proxy passes on unchecked (a client in its own range, say) is not an address: the
        # worker is created without one rather than failing on it.
        garbage_name = f"w_{uuid.uuid4().hex[:10]}"
        r = await _pop(dispatches["trusted"], user.api_key, garbage_name, "x" * 200)
        assert r.status_code == 200, r.text
        assert await db.fetchval("SELECT ipaddr FROM workers WHERE name = $1", garbage_name) is None
    finally:
        await db.close()


async def test_per_address_limits_count_clients_behind_a_trusted_proxy_only(
    horde_settings_env: dict[str, str], dispatches: dict[str, str]
) -> None:
    """Pop's limit is 2/minute per address here. Behind the trusted proxy, two clients each get their own
    budget; without trust, a client cannot escape its budget by claiming another address."""
    db = await connect(horde_settings_env["HORDE_DATABASE_URL"])
    try:
        user = await create_test_user(db, salt=TEST_SECRET_KEY, trusted=True)
    finally:
        await db.close()
    name = f"w_{uuid.uuid4().hex[:10]}"
    trusted, untrusted = dispatches["trusted"], dispatches["untrusted"]
    for client in ("192.0.2.21", "192.0.2.22"):
        for _ in range(2):
            assert (await _pop(trusted, user.api_key, name, client)).status_code == 200
    r = await _pop(trusted, user.api_key, name, "192.0.2.21")
    assert (r.status_code, r.json()["rc"]) == (429, "RateLimitExceeded")
    assert r.json()["message"] == "Rate limit exceeded: 2 per 1 minute"

    # The untrusted dispatch counts every pop by its peer, 127.0.0.1, whatever address each one claims (the
    # first test's pop there may already have spent one of the two): a third pop at the latest is refused.
    statuses = [
        (await _pop(untrusted, user.api_key, name, f"192.0.2.{30 + i}")).status_code for i in range(3)
    ]
    assert 429 in statuses and statuses[-1] == 429
