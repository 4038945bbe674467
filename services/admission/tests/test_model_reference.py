"""The text model reference at admission (HORDE_TEXT_MODEL_REFERENCE): known models, the quote and the holds.

See docs/native-api.md#known-models (403 NoEligibleWorker for a reference model without an online chat
worker, 404 UnknownChatModel for a model unknown to both), #pricing (the quote at the first listed model,
the upfront hold and the shared key check at the highest multiplier); docs/native-api.md#submit, #kudos, #model-reference.

The reference is ``text_model_reference.json`` beside this file: ``horde-test/unserved-13b`` (13B) and
``horde-test/unserved-70b`` (70B), which no worker serves, and ``horde-test/served-13b`` (13B), which the tests
serve under its derived name ``koboldcpp/served-13b``.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from admission_helpers import add_chat_worker, chat_body, new_user, unique_model
from horde_core.redis_keys import models_cache_key

pytestmark = pytest.mark.asyncio(loop_scope="session")

REFERENCE_FILE = Path(__file__).parent / "text_model_reference.json"
UNSERVED_13B = "horde-test/unserved-13b"
UNSERVED_70B = "horde-test/unserved-70b"
SERVED_13B = "koboldcpp/served-13b"  # derived from the horde-test/served-13b row
CTX_2048 = 1.2 + 2.2  # the quote's context factor at max_context_length 2048


def quote(p: float, max_length: int, ctx: float = CTX_2048) -> float:
    """One generation's quote at multiplier ``p`` (docs/native-api.md#submit)."""
    return round(max_length * (max(p, 13) / 13) ** 0.2 * p * ctx / 100, 2)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def ref_client(make_client: Any) -> Any:
    """An admission client whose process loaded the test reference."""
    return await make_client(text_model_reference=str(REFERENCE_FILE))


async def post(client: Any, body: Any, key: str) -> Any:
    return await client.post("/api/v2/generate/chat/async", json=body, headers={"apikey": key})


def err(r: Any) -> tuple[int, str, str]:
    body = r.json()
    return r.status_code, body["rc"], body["message"]


def models_body(models: list[str], **extra: Any) -> dict[str, Any]:
    return {"models": models, "messages": [{"role": "user", "content": "hello"}], **extra}


async def test_reference_model_without_a_worker_is_403(ref_client: Any, db: Any) -> None:
    user_id, key = await new_user(db)
    single = f"No worker is currently serving the model '{UNSERVED_13B}'."
    # model, a one-entry models list, a dry run and the reference's other names: all 403, same message
    for body in (
        chat_body(UNSERVED_13B),
        models_body([UNSERVED_13B]),
        chat_body(UNSERVED_13B, horde={"dry_run": True}),
    ):
        assert err(await post(ref_client, body, key)) == (403, "NoEligibleWorker", single)
    for name in (f"aphrodite/{UNSERVED_13B}", "koboldcpp/unserved-13b", f"{UNSERVED_13B}::someone#7"):
        r = await post(ref_client, chat_body(name), key)
        assert err(r) == (403, "NoEligibleWorker", f"No worker is currently serving the model '{name}'.")
    # several reference models, none served
    r = await post(ref_client, models_body([UNSERVED_13B, UNSERVED_70B]), key)
    assert err(r) == (
        403,
        "NoEligibleWorker",
        f"No worker is currently serving any of the models '{UNSERVED_13B}', '{UNSERVED_70B}'.",
    )
    assert "impossible_reason" not in r.json()
    # before any row and the horde tax
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", user_id) == 0
    assert await db.fetchval("SELECT kudos FROM users WHERE id = $1", user_id) == 1000.0


async def test_without_the_reference_the_same_model_is_unknown(client: Any, db: Any) -> None:
    _, key = await new_user(db)
    r = await post(client, chat_body(UNSERVED_13B), key)
    assert err(r)[:2] == (404, "UnknownChatModel")


async def test_model_unknown_to_both_is_still_404(ref_client: Any, db: Any) -> None:
    _, key = await new_user(db)
    missing = unique_model()
    r = await post(ref_client, chat_body(missing), key)
    assert err(r) == (
        404,
        "UnknownChatModel",
        f"The model '{missing}' is not known: no text model reference entry or online chat worker lists it.",
    )
    # under models the first unknown entry is named, even beside reference models
    r = await post(ref_client, models_body([UNSERVED_13B, missing, UNSERVED_70B]), key)
    code, rc, message = err(r)
    assert (code, rc) == (404, "UnknownChatModel") and message.startswith("'models[1]': ")
    # a served model listed beside an unknown one
    served = unique_model()
    await add_chat_worker(db, served)
    r = await post(ref_client, models_body([served, UNSERVED_70B, missing]), key)
    code, rc, message = err(r)
    assert (code, rc) == (404, "UnknownChatModel") and message.startswith("'models[2]': ")


async def test_served_reference_model_is_accepted(ref_client: Any, db: Any) -> None:
    await add_chat_worker(db, SERVED_13B, speed=100)
    _, key = await new_user(db)
    # an unserved reference model beside a served one: known, and the request is served
    r = await post(ref_client, models_body([SERVED_13B, UNSERVED_70B], max_tokens=100), key)
    assert r.status_code == 202, r.text
    row = await db.fetchrow("SELECT models FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"]))
    assert row["models"] == [SERVED_13B, UNSERVED_70B]


async def test_quote_is_priced_at_the_first_listed_model(ref_client: Any, db: Any) -> None:
    await add_chat_worker(db, SERVED_13B, speed=100)
    _, key = await new_user(db)
    dry = {"dry_run": True}
    r = await post(ref_client, models_body([SERVED_13B, UNSERVED_70B], max_tokens=210, horde=dry), key)
    assert r.status_code == 200, r.text
    # 13B: bonus 1, round(210 * 13 * 3.4 / 100, 2) = 92.82; round(92.82 + 1 + 1) = 95
    assert quote(13, 210) == 92.82 and r.json()["kudos"] == 95
    r = await post(ref_client, models_body([UNSERVED_70B, SERVED_13B], max_tokens=210, horde=dry), key)
    assert r.status_code == 200, r.text
    assert r.json()["kudos"] == round(quote(70, 210) + 1 + 1) == 702
    # horde.max_kudos is checked against the same quote
    r = await post(
        ref_client,
        models_body([UNSERVED_70B, SERVED_13B], max_tokens=210, horde={"max_kudos": 701}),
        key,
    )
    assert err(r)[:2] == (400, "ChatKudosCapExceeded") and "estimate at current pricing is 702" in err(r)[2]
    # the stored estimate of an accepted request is the same number
    r = await post(ref_client, models_body([SERVED_13B, UNSERVED_70B], max_tokens=210), key)
    assert r.status_code == 202 and r.json()["kudos"] == 95
    assert (
        await db.fetchval("SELECT kudos FROM waiting_prompts WHERE id = $1", uuid.UUID(r.json()["id"]))
        == 95.0
    )


async def test_hold_uses_the_highest_multiplier(ref_client: Any, db: Any) -> None:
    await add_chat_worker(db, SERVED_13B, speed=100)
    # Without slow workers the kudos are always held: round(210 * 70 / 21, 2) = 700, the 70B listed second.
    rich_id, rich_key = await new_user(db, kudos=5000)
    body = models_body([SERVED_13B, UNSERVED_70B], max_tokens=210, horde={"slow_workers": False})
    r = await post(ref_client, body, rich_key)
    assert r.status_code == 202, r.text
    assert r.json()["kudos"] == 95  # the quote stays at the first listed model
    hold = await db.fetchrow("SELECT * FROM kudos_holds WHERE wp_id = $1", uuid.UUID(r.json()["id"]))
    assert (hold["user_id"], hold["amount"]) == (rich_id, 700.0)
    # the 13B alone: round(210 * 13 / 21, 2) = 130
    alone = models_body([SERVED_13B], max_tokens=210, horde={"slow_workers": False})
    r = await post(ref_client, alone, rich_key)
    assert r.status_code == 202, r.text
    assert (
        await db.fetchval("SELECT amount FROM kudos_holds WHERE wp_id = $1", uuid.UUID(r.json()["id"]))
        == 130.0
    )
    # a requester who cannot cover the 700 is refused, stating it
    poor_id, poor_key = await new_user(db, kudos=300)
    code, rc, message = err(await post(ref_client, body, poor_key))
    assert (code, rc) == (403, "KudosUpfront")
    assert message.endswith("This request requires 700 kudos to fulfil.")
    assert await db.fetchval("SELECT count(*) FROM waiting_prompts WHERE user_id = $1", poor_id) == 0


async def test_shared_key_check_uses_the_highest_multiplier(ref_client: Any, db: Any) -> None:
    from horde_store import users

    await add_chat_worker(db, SERVED_13B, speed=100)
    owner_id, _ = await new_user(db, kudos=5000)
    owner = await users.get_user(db, user_id=owner_id)
    shared = await users.create_shared_key(db, owner.username, kudos=100)
    # The quote (first listed, 13B) is 95, within the key; priced at the 70B listed second it is 702.
    body = models_body([SERVED_13B, UNSERVED_70B], max_tokens=210)
    r = await post(ref_client, body, str(shared.id))
    assert err(r) == (
        403,
        "SharedKeyInsufficientKudos",
        "This shared key has 100 kudos left; the request needs 702.",
    )
    r = await post(ref_client, models_body([SERVED_13B], max_tokens=210), str(shared.id))
    assert r.status_code == 202 and r.json()["kudos"] == 95


async def test_text_route_prices_with_the_reference(ref_client: Any, db: Any) -> None:
    _, key = await new_user(db)
    base = {"prompt": "Once upon a time", "params": {"max_length": 100}}
    r = await ref_client.post(
        "/api/v2/generate/text/async",
        json={**base, "models": [UNSERVED_70B, UNSERVED_13B], "dry_run": True},
        headers={"apikey": key},
    )
    assert r.status_code == 200 and r.json() == {"kudos": round(quote(70, 100) + 1 + 1)}
    # a text request for a known model no worker serves is accepted and waits (no 403 on the text route)
    r = await ref_client.post(
        "/api/v2/generate/text/async", json={**base, "models": [UNSERVED_13B]}, headers={"apikey": key}
    )
    assert r.status_code == 202, r.text
    assert r.json()["kudos"] == round(quote(13, 100) + 1 + 1)


async def test_models_route_model_state_reads_the_reference(ref_client: Any, db: Any) -> None:
    custom = unique_model()
    await add_chat_worker(db, SERVED_13B)
    await add_chat_worker(db, custom)
    # the route caches the list for 2 s across clients, whatever the query string: start from no cache
    await ref_client.horde_app.state.admission.redis.delete(models_cache_key(False))
    params = {"type": "text", "min_count": 0}
    known = {
        e["name"]
        for e in (
            await ref_client.get("/api/v2/status/models", params={**params, "model_state": "known"})
        ).json()
    }
    other = {
        e["name"]
        for e in (
            await ref_client.get("/api/v2/status/models", params={**params, "model_state": "custom"})
        ).json()
    }
    assert SERVED_13B in known and custom not in known
    assert custom in other and SERVED_13B not in other


async def test_missing_reference_file_stops_the_app(tmp_path: Path) -> None:
    from horde_admission.app import create_app
    from horde_admission.settings import AdmissionSettings
    from horde_store.model_reference import TextModelReferenceError

    missing = tmp_path / "absent.json"
    with pytest.raises(TextModelReferenceError, match="HORDE_TEXT_MODEL_REFERENCE: cannot read"):
        create_app(AdmissionSettings(text_model_reference=str(missing)))
