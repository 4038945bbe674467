"""Fair limits behind a proxy on admission's read routes: upstream's status limit (60/minute per address, method
and path), counted by the front's client (proxy passkey) or by the X-Forwarded-For client of a trusted proxy
only; a hung Redis lets the limited route answer within the limiter's deadline; the model list's cache is keyed
by normalised parameters, so no query string makes a request miss it."""

from __future__ import annotations

import asyncio
import sys
import uuid
from typing import Any

import httpx
from admission_helpers import add_chat_worker, unique_model
from horde_core.redis_keys import models_cache_key
from horde_testing.launcher import ServiceProcess, free_port

PASSKEY = "front-passkey-for-tests"


def not_found(request_id: str) -> dict[str, str]:
    return {
        "message": f"Chat Waiting Prompt (Status) with ID '{request_id}' not found.",
        "rc": "RequestNotFound",
    }


def limited(r: httpx.Response, limit: str = "2 per 1 minute") -> bool:
    return r.status_code == 429 and r.json() == {
        "message": f"Rate limit exceeded: {limit}",
        "rc": "RateLimitExceeded",
    }


async def test_status_reads_are_limited_per_request_and_address(make_client: Any) -> None:
    client = await make_client(
        rate_limits_enabled=True, status_request_limit_per_ip="2/minute", proxy_passkeys=[PASSKEY]
    )
    rid, other = str(uuid.uuid4()), str(uuid.uuid4())
    path = f"/api/v2/generate/chat/status/{rid}"
    first, second, third = [await client.get(path) for _ in range(3)]
    assert (first.status_code, first.json()) == (404, not_found(rid))
    assert second.status_code == 404
    assert limited(third)
    assert 1 <= int(third.headers["Retry-After"]) <= 60
    # another request's status and the cancel (another method) have budgets of their own
    assert (await client.get(f"/api/v2/generate/chat/status/{other}")).status_code == 404
    assert (await client.delete(path)).status_code == 404
    # the front's clients, each forwarded with the passkey, are counted one by one
    for address in ("198.51.100.7", "198.51.100.8"):
        headers = {"Proxy-Authorization": PASSKEY, "Proxied-For": address}
        assert (await client.get(path, headers=headers)).status_code == 404
    # a wrong passkey forwards nothing: the peer's budget, already spent
    r = await client.get(path, headers={"Proxy-Authorization": "guess", "Proxied-For": "198.51.100.9"})
    assert limited(r)
    # X-Forwarded-For from an untrusted peer (this in-process client) is the client's claim: ignored
    assert limited(await client.get(path, headers={"X-Forwarded-For": "198.51.100.10"}))


async def test_a_hung_redis_lets_the_status_route_answer_in_time(make_client: Any, hung_redis: str) -> None:
    """Redis accepts and never answers: the status limit fails open within HORDE_RATE_LIMIT_TIMEOUT_SECONDS
    (0.3 s here), and the route answers from PostgreSQL."""
    client = await make_client(
        redis_url=hung_redis,
        rate_limits_enabled=True,
        rate_limit_timeout_seconds=0.3,
        status_request_limit_per_ip="1/minute",
    )
    rid = str(uuid.uuid4())
    # Without its deadline the limit would wait for the hung store forever: answering at all is the proof
    # (the wait_for is a hang guard).
    for _ in range(3):
        r = await asyncio.wait_for(client.get(f"/api/v2/generate/chat/status/{rid}"), 30)
        assert (r.status_code, r.json()) == (404, not_found(rid))


async def test_the_model_list_cache_ignores_the_query_string(client: Any, db: Any) -> None:
    """Within the 2 s cache, a new min_count, an unknown parameter or a reordered query is served from the one
    cached list (a worker added meanwhile is not in it), and only the normalised keys exist in Redis."""
    redis = client.horde_app.state.admission.redis
    await redis.delete(models_cache_key(False), models_cache_key(True))
    first_model, later_model = unique_model(), unique_model()
    await add_chat_worker(db, first_model)
    r = await client.get("/api/v2/status/models", params={"type": "text"})
    assert first_model in {e["name"] for e in r.json()}
    await add_chat_worker(db, later_model)
    for params in (
        {"type": "text", "min_count": 1},
        {"type": "text", "nocache": uuid.uuid4().hex},
        {"model_state": "all", "type": "text", "max_count": 10**9},
    ):
        names = {e["name"] for e in (await client.get("/api/v2/status/models", params=params)).json()}
        assert first_model in names and later_model not in names, params
    # the filters still apply to the cached list
    r = await client.get("/api/v2/status/models", params={"type": "text", "min_count": 10**6})
    assert r.json() == []
    keys = {k async for k in redis.scan_iter("horde:admission:models:*")}
    assert keys <= {models_cache_key(False), models_cache_key(True)}
    await redis.delete(models_cache_key(False))
    r = await client.get("/api/v2/status/models", params={"type": "text", "nocache": "x"})
    assert later_model in {e["name"] for e in r.json()}


def _admission(env: dict[str, str], trusted: str | None) -> tuple[ServiceProcess, str]:
    port = free_port()
    env = {
        **env,
        "HORDE_ADMISSION_HTTP_PORT": str(port),
        "HORDE_DISPATCH_GRPC_TARGET": "127.0.0.1:9",
        "HORDE_SUBMIT_GRPC_TARGET": "127.0.0.1:9",
        "HORDE_STATUS_REQUEST_LIMIT_PER_IP": "1/minute",
        "HORDE_LOG_JSON": "false",
    }
    if trusted is not None:
        env["HORDE_FORWARDED_ALLOW_IPS"] = trusted
    process = ServiceProcess(
        f"admission-{'trusted' if trusted else 'untrusted'}",
        [sys.executable, "-m", "horde_admission"],
        env,
        f"http://127.0.0.1:{port}/readyz",
    )
    return process, f"http://127.0.0.1:{port}"


def test_forwarded_for_counts_clients_only_behind_a_trusted_proxy(admission_env: dict[str, str]) -> None:
    """Two admission processes, one trusting 127.0.0.1 as its proxy and one with HORDE_FORWARDED_ALLOW_IPS unset
    (uvicorn's own default would trust 127.0.0.1): the status limit (1/minute here) counts each forwarded client
    behind the trusted proxy, and the peer, whatever it claims, behind none."""
    trusted, trusted_url = _admission(admission_env, "127.0.0.1")
    untrusted, untrusted_url = _admission(admission_env, None)
    with trusted, untrusted:
        path = f"/api/v2/generate/chat/status/{uuid.uuid4()}"
        with httpx.Client(timeout=10) as http:
            for address in ("203.0.113.31", "203.0.113.32"):
                r = http.get(f"{trusted_url}{path}", headers={"X-Forwarded-For": address})
                assert r.status_code == 404, r.text
            r = http.get(f"{trusted_url}{path}", headers={"X-Forwarded-For": "203.0.113.31"})
            assert limited(r, "1 per 1 minute")

            other = f"/api/v2/generate/chat/status/{uuid.uuid4()}"
            r = http.get(f"{untrusted_url}{other}", headers={"X-Forwarded-For": "203.0.113.41"})
            assert r.status_code == 404, r.text
            r = http.get(f"{untrusted_url}{other}", headers={"X-Forwarded-For": "203.0.113.42"})
            assert limited(r, "1 per 1 minute")
