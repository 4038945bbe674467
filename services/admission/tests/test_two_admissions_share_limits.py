"""Two admission replicas share one rate-limit budget (issue 13: rate limits shared through Redis, not per process;
docs/operator-guide.md#correct-with-n-replicas, docs/native-api.md#rate-limits).

Two app instances, each with its own limiter and Redis connection as two processes would have, take a client's
requests alternately: the per-address and the per-key limits count the hits of both, so the request past the
limit is refused whichever replica it reaches.
"""

from __future__ import annotations

from typing import Any

import pytest
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def dry_run(client: Any, model: str, key: str) -> Any:
    return await client.post(
        "/api/v2/generate/chat/async",
        json=chat_body(model, horde={"dry_run": True}),
        headers={"apikey": key},
    )


async def test_the_per_address_limit_counts_the_hits_on_both_replicas(make_client: Any, db: Any) -> None:
    limits = {"rate_limits_enabled": True, "chat_request_2sec_limit_per_ip": "3/minute"}
    a, b = await make_client(**limits), await make_client(**limits)
    await a.horde_app.state.admission.limiter.reset()
    model = unique_model()
    await add_chat_worker(db, model)
    keys = [(await new_user(db))[1] for _ in range(4)]  # one key each: only the address is shared
    codes = [(await dry_run(c, model, k)).status_code for c, k in zip((a, b, a, b), keys, strict=True)]
    assert codes == [200, 200, 200, 429]
    refused = await dry_run(a, model, keys[0])
    assert refused.status_code == 429
    assert refused.json() == {"message": "Rate limit exceeded: 3 per 1 minute", "rc": "RateLimitExceeded"}
    assert 1 <= int(refused.headers["retry-after"]) <= 60


async def test_the_per_key_limit_counts_the_hits_on_both_replicas(make_client: Any, db: Any) -> None:
    limits = {
        "rate_limits_enabled": True,
        "apikey_request_limit": "2/minute",
        "chat_request_2sec_limit_per_ip": "100/minute",
    }
    a, b = await make_client(**limits), await make_client(**limits)
    await a.horde_app.state.admission.limiter.reset()
    model = unique_model()
    await add_chat_worker(db, model)
    _, key = await new_user(db)
    assert [(await dry_run(c, model, key)).status_code for c in (a, b)] == [200, 200]
    for replica in (a, b):
        refused = await replica.post(
            "/api/v2/generate/chat/async",
            json=chat_body(model, horde={"dry_run": True}),
            headers={"apikey": key},
        )
        assert refused.status_code == 429
        assert refused.json() == {"message": "Rate limit exceeded: 2 per 1 minute", "rc": "RateLimitExceeded"}
    _, other = await new_user(db)
    assert (await dry_run(b, model, other)).status_code == 200  # another key has its own budget
