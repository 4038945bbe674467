"""POST /v2/generate/chat/async: every refusal in route order, the 202 and the stored row, operation keys,
dry runs, max_length lowering, context sizing and upfront kudos (docs/native-api.md#routes and the
sections it names)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def post(client: Any, body: Any, key: str | None, **headers: str) -> Any:
    if key is not None:
        headers["apikey"] = key
    return await client.post("/api/v2/generate/chat/async", json=body, headers=headers)


def err(r: Any) -> tuple[int, str, str]:
    body = r.json()
    return r.status_code, body["rc"], body["message"]


async def test_accepts_and_stores_the_request(client: Any, db: Any) -> None:
    model = unique_model()
    user_id, key = await new_user(db, kudos=500)
    await add_chat_worker(db, model)
    body = chat_body(
        model,
        "Say hi",
        max_tokens=300,
        temperature=0.5,
        stop="END",
        stream=True,
        horde={"trusted_workers": False, "conformance": "best_effort"},
    )
    r = await post(client, body, key, **{"Client-Agent": "tester:1:me"})
    assert r.status_code == 202, r.text
    out = r.json()
    assert set(out) == {"id", "kudos", "warnings"} and out["warnings"] == []
    row = await db.fetchrow("SELECT * FROM waiting_prompts WHERE id = $1", uuid.UUID(out["id"]))
    assert row["is_chat"] and row["active"] and not row["faulted"] and not row["cancelled"]
    assert (row["n"], row["jobs"], row["user_id"], row["models"]) == (1, 1, user_id, [model])
    assert row["messages"] == [{"role": "user", "content": "Say hi"}]
    assert row["prompt"] == "user: Say hi" and row["submitted_prompt"] == "user: Say hi"
    assert row["params"] == {"max_length": 300, "temperature": 0.5, "stop_sequence": ["END"]}
    assert (row["max_length"], row["max_context_length"]) == (300, 2048)
    assert row["chat_extras"] == {"stream_progress": True} and row["stream_progress"]
    assert row["chat_conformance"] == "best_effort" and row["chat_required_features"] == []
    assert row["client_agent"] == "tester:1:me"
    assert row["extra_priority"] == 500  # the user's kudos before the tax
    assert row["consumed_kudos"] == 1.0 and row["kudos"] == out["kudos"]
    assert 19 * 60 < (row["expiry"] - row["created"]).total_seconds() <= 20 * 60
    assert row["context_adjustments"] is None and row["operation_key"] is None
    # the horde tax is charged to the user at activation
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 499.0
    assert await db.fetchval("SELECT count(*) FROM kudos_holds WHERE wp_id = $1", row["id"]) == 0


async def test_body_over_the_limit_is_413_before_parsing(client: Any) -> None:
    import horde_contract as contract

    size = contract.MAX_CHAT_BODY_BYTES + 1
    r = await client.post(
        "/api/v2/generate/chat/async",
        content=b"x" * size,
        headers={"apikey": "whatever", "content-type": "application/json"},
    )
    assert err(r) == (
        413,
        "RequestTooLarge",
        f"The request body is larger than {contract.MAX_CHAT_BODY_BYTES} bytes.",
    )

    async def chunks() -> Any:
        for _ in range(size // (1 << 20) + 1):
            yield b"x" * (1 << 20)

    r = await client.post("/api/v2/generate/chat/async", content=chunks(), headers={"apikey": "k"})
    assert r.status_code == 413 and r.json()["rc"] == "RequestTooLarge"


@pytest.mark.parametrize(
    ("body", "status", "rc", "param_prefix"),
    [
        ({"model": "a", "messages": []}, 400, "BadRequest", "'messages'"),
        ({"messages": [{"role": "user", "content": "x"}]}, 400, "BadRequest", "'model'"),
        (
            {"model": "a", "models": ["a"], "messages": [{"role": "user", "content": "x"}]},
            400,
            "ChatRequestConflict",
            "'models'",
        ),
        (
            {"model": "a", "messages": [{"role": "user", "content": "x"}], "logprobs": True},
            400,
            "UnsupportedChatParameter",
            "'logprobs'",
        ),
        (
            {"model": "a", "messages": [{"role": "user", "content": "x"}], "n": 2},
            400,
            "UnsupportedChatParameter",
            "'n=2'",
        ),
        (
            {"model": "a", "messages": [{"role": "user", "content": "x"}], "horde": {"models": 1}},
            400,
            "UnsupportedChatParameter",
            "'horde.models'",
        ),
        (
            {"model": "a", "messages": [{"role": "user", "content": "x"}], "max_tokens": 5},
            400,
            "BadRequest",
            "'max_tokens'",
        ),
        (
            {
                "model": "a",
                "messages": [{"role": "user", "content": "x"}],
                "horde": {"operation_key": "nope"},
            },
            400,
            "BadRequest",
            "'horde.operation_key'",
        ),
    ],
)
async def test_contract_refusals_come_before_auth(
    client: Any, body: Any, status: int, rc: str, param_prefix: str
) -> None:
    r = await post(client, body, "not-a-key")
    code, got_rc, message = err(r)
    assert (code, got_rc) == (status, rc), r.text
    assert param_prefix in message, message


async def test_invalid_json_is_bad_request(client: Any) -> None:
    r = await client.post("/api/v2/generate/chat/async", content=b"{nope", headers={"apikey": "k"})
    assert r.status_code == 400 and r.json()["rc"] == "BadRequest"


async def test_unknown_key_is_401(client: Any) -> None:
    r = await post(client, chat_body(unique_model()), "not-a-key")
    assert err(r) == (401, "InvalidAPIKey", "No user matching sent API Key. Have you remembered to register?")
    r = await post(client, chat_body(unique_model()), None)
    assert r.status_code == 401


async def test_admission_flag_is_503_even_for_dry_runs(make_client: Any, db: Any) -> None:
    off = await make_client(chat_admission_enabled=False)
    _, key = await new_user(db)
    for horde in ({}, {"dry_run": True}):
        r = await post(off, chat_body(unique_model(), horde=horde), key)
        assert err(r) == (
            503,
            "ChatAdmissionDisabled",
            "This horde is not accepting new chat requests at the moment.",
        )


async def test_unknown_model_is_404_after_auth(client: Any, db: Any) -> None:
    _, key = await new_user(db)
    served = unique_model()
    await add_chat_worker(db, served)
    missing = unique_model()
    r = await post(client, chat_body(missing), key)
    code, rc, message = err(r)
    assert (code, rc) == (404, "UnknownChatModel")
    assert (
        message
        == f"The model '{missing}' is not known: no text model reference entry or online chat worker lists it."
    )
    # Under models, the message starts with the first unknown entry's quoted path; the entry is never dropped.
    body = {"models": [served, missing], "messages": [{"role": "user", "content": "x"}]}
    code, rc, message = err(await post(client, body, key))
    assert (code, rc) == (404, "UnknownChatModel") and message.startswith("'models[1]': ")
    # an offline worker's model is unknown too; dry runs are refused the same way
    offline = unique_model()
    await add_chat_worker(db, offline, online=False)
    r = await post(client, chat_body(offline, horde={"dry_run": True}), key)
    assert err(r)[:2] == (404, "UnknownChatModel")
    # a bad key gets 401 first
    assert (await post(client, chat_body(missing), "bad")).status_code == 401


async def test_too_many_prompts_is_429(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    _, key = await new_user(db, concurrency=2)
    for _ in range(2):
        assert (await post(client, chat_body(model), key)).status_code == 202
    r = await post(client, chat_body(model), key)
    assert err(r) == (
        429,
        "TooManyPrompts",
        "Parallel requests (3) exceeded user limit (2). Please try again later or request to increase your concurrency.",
    )
    # the concurrency limit comes before the model check
    r = await post(client, chat_body(unique_model()), key)
    assert err(r)[:2] == (429, "TooManyPrompts")


async def test_max_tokens_lowered_to_largest_declared(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, max_length=1024, max_context_length=8192)
    await add_chat_worker(db, model, max_length=768, max_context_length=4096)
    _, key = await new_user(db)
    r = await post(client, chat_body(model, max_tokens=4000, horde={"max_context_length": 8192}), key)
    assert r.status_code == 202, r.text
    row = await db.fetchrow("SELECT * FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"]))
    assert row["max_length"] == 1024 and row["params"]["max_length"] == 1024
    assert row["context_adjustments"] == [{"from": 4000, "to": 1024, "reason": "worker_max_length"}]
    # a dry run is lowered the same way
    r = await post(client, chat_body(model, max_tokens=4000, horde={"dry_run": True}), key)
    assert r.status_code == 200 and r.json()["resolved"]["max_length"] == 1024
    assert r.json()["context_adjustments"] == [{"from": 4000, "to": 1024, "reason": "worker_max_length"}]


async def test_context_grows_and_truncates(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, max_length=512, max_context_length=4096)
    _, key = await new_user(db)
    long_text = "word " * 2000  # ~2500 tokens
    r = await post(client, chat_body(model, long_text, horde={"context_fit": "grow"}), key)
    assert r.status_code == 202, r.text
    row = await db.fetchrow("SELECT * FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"]))
    (grow,) = row["context_adjustments"]
    assert grow["reason"] == "grow" and grow["from"] == 2048 and 2048 < grow["to"] <= 4096
    assert row["max_context_length"] == grow["to"] and row["params"]["max_context_length"] == grow["to"]

    # reject: refused with the contract's PromptExceedsContext
    r = await post(client, chat_body(model, long_text, horde={"context_fit": "reject"}), key)
    assert err(r)[:2] == (400, "PromptExceedsContext")
    # grow past the largest declared context: refused
    huge = "word " * 8000
    r = await post(client, chat_body(model, huge, horde={"context_fit": "grow"}), key)
    assert err(r)[:2] == (400, "PromptExceedsContext")

    # truncate_oldest (the default): oldest turns dropped, latest user message kept
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(6):
        messages += [
            {"role": "user", "content": f"q{i} " + "x" * 3000},
            {"role": "assistant", "content": "a" * 3000},
        ]
    messages.append({"role": "user", "content": "latest question"})
    r = await post(client, {"model": model, "messages": messages}, key)
    assert r.status_code == 202, r.text
    row = await db.fetchrow("SELECT * FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"]))
    grow, trunc = row["context_adjustments"]
    assert grow == {"from": 2048, "to": 4096, "reason": "grow"}
    assert (
        trunc["reason"] == "truncate_oldest" and trunc["dropped_messages"] >= 2 and trunc["to"] <= 4096 - 512
    )
    assert row["messages"][0] == {"role": "system", "content": "be brief"}
    assert row["messages"][-1] == {"role": "user", "content": "latest question"}
    assert len(row["messages"]) == len(messages) - trunc["dropped_messages"]
    assert "q0" in row["submitted_prompt"] and "q0" not in row["prompt"]

    # a single user message that can never fit is refused, even under truncate_oldest
    r = await post(client, chat_body(model, huge), key)
    assert err(r)[:2] == (400, "PromptExceedsContext")


async def test_operation_key_repeat_and_conflict(make_client: Any, client: Any, db: Any) -> None:
    model = unique_model()
    worker = await add_chat_worker(db, model)
    _, key = await new_user(db)
    op = str(uuid.uuid4())
    body = chat_body(model, "once", horde={"operation_key": op})
    first = await post(client, body, key)
    assert first.status_code == 202
    rid = first.json()["id"]
    row = await db.fetchrow(
        "SELECT operation_key, operation_fingerprint FROM waiting_prompts WHERE id = $1", uuid.UUID(rid)
    )
    assert str(row["operation_key"]) == op and len(row["operation_fingerprint"]) == 64

    # Same fingerprint: 200 with the first {id, kudos}, nothing queued or charged, even with models spelled
    # differently and the worker gone, and with admission off.
    await db.execute("UPDATE workers SET last_check_in = now() - interval '1 hour' WHERE id = $1", worker)
    kudos_before = await db.fetchval(
        "SELECT kudos FROM users WHERE id = (SELECT user_id FROM waiting_prompts WHERE id = $1)",
        uuid.UUID(rid),
    )
    same = {
        "models": [model],
        "messages": [{"role": "user", "content": "once"}],
        "max_tokens": 512,
        "horde": {"operation_key": op},
    }
    r = await post(client, same, key)
    assert r.status_code == 200 and r.json() == {"id": rid, "kudos": first.json()["kudos"]}
    off = await make_client(chat_admission_enabled=False)
    r = await post(off, body, key)
    assert r.status_code == 200 and r.json()["id"] == rid
    assert (
        await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE operation_key = $1", uuid.UUID(op)) == 1
    )
    assert (
        await db.fetchval(
            "SELECT kudos FROM users WHERE id = (SELECT user_id FROM waiting_prompts WHERE id = $1)",
            uuid.UUID(rid),
        )
        == kudos_before
    )

    # Different fingerprint: 400 OperationKeyConflict.
    r = await post(client, chat_body(model, "twice", horde={"operation_key": op}), key)
    assert err(r) == (
        400,
        "OperationKeyConflict",
        "'horde.operation_key': this key already identifies a different request.",
    )
    # Another user's same key is a separate claim (refused here only because the worker is offline).
    _, other_key = await new_user(db)
    r = await post(client, body, other_key)
    assert r.status_code == 404
    # A dry run with the key quotes without looking it up.
    await db.execute("UPDATE workers SET last_check_in = now() WHERE id = $1", worker)
    r = await post(client, chat_body(model, "twice", horde={"operation_key": op, "dry_run": True}), key)
    assert r.status_code == 200 and "id" not in r.json()


async def test_operation_key_race_has_one_winner(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    _, key = await new_user(db)
    op = str(uuid.uuid4())
    body = chat_body(model, "race", horde={"operation_key": op})
    results = await asyncio.gather(*(post(client, body, key) for _ in range(6)))
    codes = sorted(r.status_code for r in results)
    assert codes.count(202) == 1 and set(codes) <= {200, 202}
    assert len({r.json()["id"] for r in results}) == 1
    assert (
        await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE operation_key = $1", uuid.UUID(op)) == 1
    )
    # a different body racing on the same key gets OperationKeyConflict, never a second row
    op2 = str(uuid.uuid4())
    bodies = [chat_body(model, f"race {i}", horde={"operation_key": op2}) for i in range(4)]
    results = await asyncio.gather(*(post(client, b, key) for b in bodies))
    assert sorted(r.status_code for r in results) == [202, 400, 400, 400]
    assert {r.json()["rc"] for r in results if r.status_code == 400} == {"OperationKeyConflict"}


async def test_dry_run_quotes_without_queueing(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    user_id, key = await new_user(db)
    before = await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id)
    r = await post(client, chat_body(model, "quote me", max_tokens=1024, horde={"dry_run": True}), key)
    assert r.status_code == 200
    out = r.json()
    assert out["kudos"] == round(1024 * 3.4 / 100 + 1 + 1)
    assert out["estimated_prompt_tokens"] == 4
    assert out["resolved"] == {"max_length": 1024, "max_context_length": 2048, "context_fit": "grow"}
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == before
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 1000.0


async def test_max_kudos_cap(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    user_id, key = await new_user(db)
    for horde in ({"max_kudos": 1}, {"max_kudos": 1, "dry_run": True}):
        r = await post(client, chat_body(model, max_tokens=1024, horde=horde), key)
        assert err(r) == (
            400,
            "ChatKudosCapExceeded",
            "The request's kudos estimate at current pricing is 37, above its horde.max_kudos of 1. "
            "The estimate assumes the full max_tokens is generated.",
        )
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    assert (
        await post(client, chat_body(model, max_tokens=1024, horde={"max_kudos": 37}), key)
    ).status_code == 202


async def test_upfront_kudos_hold_and_refusal(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model, max_length=8192, max_context_length=16384, threads=1, speed=100)
    # Queue enough ahead that the wait passes the floor wait: 100 tok/s * 300 s = 30000 tokens.
    _, filler_key = await new_user(db, kudos=10_000)
    for _ in range(8):
        r = await post(
            client, chat_body(model, max_tokens=4096, horde={"max_context_length": 8192}), filler_key
        )
        assert r.status_code == 202, r.text
    # A rich user above the floor allowance gets a hold of round(max_length/21, 2).
    rich_id, rich_key = await new_user(db, kudos=1000)
    r = await post(client, chat_body(model, max_tokens=2100, horde={"max_context_length": 4096}), rich_key)
    assert r.status_code == 202, r.text
    hold = await db.fetchrow("SELECT * FROM kudos_holds WHERE wp_id = $1", uuid.UUID(r.json()["id"]))
    assert (hold["user_id"], hold["amount"]) == (rich_id, 100.0)
    # A poor user gets 403 KudosUpfront stating the allowance, and no row.
    poor_id, poor_key = await new_user(db, kudos=30)
    r = await post(client, chat_body(model, max_tokens=2100, horde={"max_context_length": 4096}), poor_key)
    assert err(r) == (
        403,
        "KudosUpfront",
        "Due to heavy demand, for requests over 512 tokens, the client needs to already have the required "
        "kudos. This request requires 100 kudos to fulfil.",
    )
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", poor_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", poor_id) == 30.0
    # Within the floor no hold is needed.
    r = await post(client, chat_body(model, max_tokens=512), poor_key)
    assert r.status_code == 202
    # Without slow workers the kudos are always held.
    r = await post(client, chat_body(model, max_tokens=100, horde={"slow_workers": False}), rich_key)
    assert r.status_code == 202
    assert await db.fetchval(
        "SELECT amount FROM kudos_holds WHERE wp_id = $1", uuid.UUID(r.json()["id"])
    ) == round(100 / 21, 2)


async def test_kudos_refusal_becomes_no_eligible_worker_with_gap(client: Any, db: Any) -> None:
    model = unique_model()
    # The only worker lacks the seed feature the request needs: served, but nobody eligible.
    await add_chat_worker(db, model, max_length=4096, max_context_length=8192, speed=100)
    poor_id, key = await new_user(db, kudos=0)
    r = await post(client, chat_body(model, max_tokens=2100, seed=7), key)
    code, rc, message = err(r)
    assert (code, rc) == (403, "NoEligibleWorker")
    assert (
        message
        == "No online worker can serve this request: no online worker serving the model declares seed."
    )
    assert r.json()["impossible_reason"] == {
        "kind": "declaration_gap",
        "missing_declarations": ["seed"],
        "exceeded_limits": [],
    }
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", poor_id) == 0
    # Within the floor the same request is queued, with the no-worker warning.
    r = await post(client, chat_body(model, max_tokens=256, seed=7), key)
    assert r.status_code == 202
    assert r.json()["message"].startswith("Warning: No available workers can fulfill this request.")


async def test_shared_key_is_charged_to_its_owner(client: Any, db: Any) -> None:
    from horde_store import users

    model = unique_model()
    await add_chat_worker(db, model)
    owner_id, _ = await new_user(db, kudos=300)
    owner = await users.get_user(db, user_id=owner_id)
    shared = await users.create_shared_key(db, owner.username, kudos=100, max_text_tokens=400)
    r = await post(client, chat_body(model, max_tokens=300), str(shared.id))
    assert r.status_code == 202, r.text
    row = await db.fetchrow(
        "SELECT user_id, shared_key_id FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"])
    )
    assert (row["user_id"], row["shared_key_id"]) == (owner_id, shared.id)
    key_row = await db.fetchrow("SELECT kudos, utilized FROM user_shared_keys WHERE id = $1", shared.id)
    assert (key_row["kudos"], key_row["utilized"]) == (99.0, 1.0)
    r = await post(client, chat_body(model, max_tokens=450), str(shared.id))
    assert err(r)[:2] == (400, "BadRequest")
    empty = await users.create_shared_key(db, owner.username, kudos=0)
    r = await post(client, chat_body(model), str(empty.id))
    assert err(r)[:2] == (403, "SharedKeyEmpty")


async def test_rate_limit_per_address(make_client: Any, db: Any) -> None:
    limited = await make_client(rate_limits_enabled=True, chat_request_2sec_limit_per_ip="2/minute")
    await limited.horde_app.state.admission.limiter.reset()
    model = unique_model()
    await add_chat_worker(db, model)
    _, key = await new_user(db)
    codes = [
        (await post(limited, chat_body(model, horde={"dry_run": True}), key)).status_code for _ in range(3)
    ]
    assert codes == [200, 200, 429]
    r = await post(limited, chat_body(model, horde={"dry_run": True}), key)
    assert r.json() == {"message": "Rate limit exceeded: 2 per 1 minute", "rc": "RateLimitExceeded"}
    # Retry-After: the seconds until the fixed window resets (an SDK retries then)
    assert 1 <= int(r.headers["retry-after"]) <= 60
    # the text route counts separately
    r = await limited.post(
        "/api/v2/generate/text/async", json={"prompt": "x", "dry_run": True}, headers={"apikey": key}
    )
    assert r.status_code == 200


async def test_native_paths_are_served_under_api_and_bare(client: Any, db: Any) -> None:
    model = unique_model()
    await add_chat_worker(db, model)
    _, key = await new_user(db)
    r = await client.post("/v2/generate/chat/async", json=chat_body(model), headers={"apikey": key})
    assert r.status_code == 202
    assert json.loads(r.text)["id"]
