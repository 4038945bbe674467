"""Submits priced at the served model's multiplier from the text model reference (HORDE_TEXT_MODEL_REFERENCE).

See docs/native-api.md#pricing (the generation is charged at the model that served it); docs/native-api.md#submit (a
known model earns ``round(T(gen) * bonus * P / 125 * (0.3 if the bridge is unvalidated) * ctx, 2)``), §10.

The reference is ``text_model_reference.json`` beside this file: ``horde-test/model-13b`` (13B) and
``horde-test/model-70b`` (70B).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from horde_submit import pricing
from horde_submit.settings import SubmitSettings
from horde_testing._proc import free_port
from horde_testing.pytest_plugin import TEST_SECRET_KEY

SUBMIT = "/v2/generate/text/submit"
REFERENCE_FILE = Path(__file__).parent / "text_model_reference.json"


@pytest.fixture(scope="module")
def submit_settings(horde_settings_env: dict[str, str]) -> SubmitSettings:
    """The conftest's settings with the test reference loaded (the module's app_client uses them)."""
    return SubmitSettings(
        database_url=horde_settings_env["HORDE_DATABASE_URL"],
        redis_url=horde_settings_env["HORDE_REDIS_URL"],
        secret_key=TEST_SECRET_KEY,
        submit_grpc_port=free_port(),
        text_model_reference=str(REFERENCE_FILE),
    )


def ctx_for(prompt_characters: int, max_context_length: int) -> float:
    """The context factor: a prompt under 80 characters is estimated at the 20-token floor."""
    tokens = min(max(math.ceil(prompt_characters / 4), 20), max_context_length)
    return min(max(1.2 + 2.2 ** math.log2(tokens / 1024), 0.1), 30.0)


async def test_chat_submit_is_priced_at_the_served_models_size(app_client, factory) -> None:
    # The derived koboldcpp/ name of the 70B row, on a validated bridge.
    job = await factory.job(
        model="koboldcpp/model-70b",
        bridge_agent="TabbyAPI:1:x",
        prompt="user: Hello there",
        max_length=512,
        max_context_length=4096,
    )
    content = "a" * 400  # T = 100 tokens
    r = await app_client.post(
        SUBMIT,
        json={
            "id": str(job.gen_id),
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
            "model_id": job.model,
        },
        headers={"apikey": job.owner.api_key},
    )
    assert r.status_code == 200, r.text
    ctx = ctx_for(len("user: Hello there"), 4096)
    expected = round(100 * (70 / 13) ** 0.2 * 70 / 125 * ctx, 2)
    assert expected == 94.99 and r.json() == {"reward": 94.99}
    gen = await factory.row("SELECT kudos FROM processing_gens WHERE id = $1", job.gen_id)
    assert gen["kudos"] == pytest.approx(94.99)
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert requester["kudos"] == pytest.approx(1000 - 94.99 - 1)
    owner = await factory.row("SELECT kudos, evaluating_kudos FROM users WHERE id = $1", job.owner.id)
    # an untrusted owner gets half into escrow
    spendable, escrow = pricing.escrow_split(94.99, owner_trusted=False, owner_anonymous=False)
    assert spendable + escrow == pytest.approx(94.99) and abs(spendable - escrow) <= 0.011
    assert (owner["kudos"], owner["evaluating_kudos"]) == (pytest.approx(spendable), pytest.approx(escrow))
    worker = await factory.row("SELECT kudos FROM workers WHERE id = $1", job.worker_id)
    assert worker["kudos"] == pytest.approx(94.99)


async def test_text_submit_on_an_unvalidated_bridge_earns_a_third(app_client, factory) -> None:
    # A quantization suffix is retried without: the 13B row. The default bridge is not validated: x 0.3.
    job = await factory.job(
        is_chat=False,
        model="horde-test/model-13b-GGUF-Q4_K_M",
        max_length=80,
        max_context_length=2048,
        prompt="Once upon a time",
    )
    r = await app_client.post(
        SUBMIT, json={"id": str(job.gen_id), "generation": "b" * 200}, headers={"apikey": job.owner.api_key}
    )
    assert r.status_code == 200, r.text
    expected = round(50 * 1.0 * 13 / 125 * 0.3 * ctx_for(16, 2048), 2)
    assert expected == 1.89 and r.json() == {"reward": 1.89}
    requester = await factory.row("SELECT kudos FROM users WHERE id = $1", job.requester.id)
    assert requester["kudos"] == pytest.approx(1000 - 1.89 - 1)


async def test_the_served_model_is_charged_not_the_listed_ones(app_client, factory) -> None:
    # The request lists the 13B; the worker popped it with the 70B: the 70B prices it.
    owner = await factory.user(kudos=0)
    requester = await factory.user()
    worker = await factory.worker(owner, "horde-test/model-70b")
    wp = await factory.request(
        requester, is_chat=False, model="horde-test/model-13b", max_length=512, max_context_length=4096
    )
    gen = await factory.generation(wp, worker, owner, "horde-test/model-70b", chat=False)
    r = await app_client.post(
        SUBMIT, json={"id": str(gen), "generation": "c" * 400}, headers={"apikey": owner.api_key}
    )
    assert r.status_code == 200, r.text
    expected = pricing.generation_kudos(
        pricing.PricingInputs(
            reply_characters=400,
            prompt_characters=len("user: Hello there"),
            max_length=512,
            max_context_length=4096,
            parameters_billion=70.0,
            bridge_agent="horde-worker:0.1:test",
            owner_trusted=False,
        )
    )
    assert expected == round(100 * (70 / 13) ** 0.2 * 70 / 125 * 0.3 * ctx_for(17, 4096), 2) == 28.5
    assert r.json() == {"reward": 28.5}


async def test_a_model_the_reference_does_not_list_is_priced_as_unknown(app_client, factory) -> None:
    job = await factory.job(
        is_chat=False,
        model="horde-test/model-8b",
        max_length=80,
        max_context_length=2048,
        prompt="Once upon a time",
    )
    r = await app_client.post(
        SUBMIT, json={"id": str(job.gen_id), "generation": "d" * 200}, headers={"apikey": job.owner.api_key}
    )
    assert r.status_code == 200, r.text
    assert r.json() == {"reward": round(ctx_for(16, 2048), 2)}  # untrusted owner: ctx


async def test_missing_reference_file_stops_the_app(tmp_path: Path) -> None:
    from horde_store.model_reference import TextModelReferenceError
    from horde_submit.app import create_app

    with pytest.raises(TextModelReferenceError, match="HORDE_TEXT_MODEL_REFERENCE: cannot read"):
        create_app(SubmitSettings(text_model_reference=str(tmp_path / "absent.json")))
