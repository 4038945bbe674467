"""Pure admission rules: quote, allowance, sizing, status counts (no stores needed)."""

from __future__ import annotations

import pytest
from horde_admission import kudos
from horde_admission.settings import AdmissionSettings
from horde_admission.sizing import lower_max_length, size_context
from horde_admission.status import counts
from horde_contract import TextModelReference, no_eligible_worker_error
from horde_contract.errors import HordeError
from horde_core.metrics import size_bucket

EMPTY = TextModelReference()
REFERENCE = TextModelReference.from_mapping(
    {"org/small-7b": {"parameters": 7_000_000_000}, "org/big-70b": {"parameters": 70_000_000_000}}
)


def test_quote_matches_text_formula() -> None:
    # ctx(2048) = 1.2 + 2.2^1 = 3.4; unknown model prices at P = 1 (no 500).
    assert kudos.quote_generation(["x"], 1024, 2048, reference=EMPTY) == round(1024 * 3.4 / 100, 2)
    assert kudos.quote_generation([], 100, 2048, reference=EMPTY) == round(100 * 13 * 3.4 / 100, 2)
    assert kudos.quote_request(["x"], 1024, 2048, reference=EMPTY) == round(34.82 + 1 + 1)


def test_quote_reads_the_first_listed_model() -> None:
    big = round(1024 * (70 / 13) ** 0.2 * 70 * 3.4 / 100, 2)
    assert kudos.quote_generation(["org/big-70b", "org/small-7b"], 1024, 2048, reference=REFERENCE) == big
    assert kudos.quote_generation(["koboldcpp/small-7b", "org/big-70b"], 1024, 2048, reference=REFERENCE) == (
        round(1024 * 7 * 3.4 / 100, 2)
    )
    assert kudos.quote_request(["org/big-70b"], 1024, 2048, n=2, tax=1, reference=REFERENCE) == round(
        (big + 1) * 2 + 1
    )
    # the shared key amount is priced at the highest multiplier: the big model wherever it is listed
    for models in (["org/small-7b", "org/big-70b"], ["org/big-70b", "org/small-7b"]):
        assert kudos.shared_key_amount(models, 1024, 2048, reference=REFERENCE) == round(big + 1 + 1)
    assert kudos.shared_key_amount(["x"], 1024, 2048, reference=EMPTY) == kudos.quote_request(
        ["x"], 1024, 2048, reference=EMPTY
    )
    assert kudos.shared_key_amount([], 100, 2048, reference=EMPTY) == round(44.2 + 1 + 1)


def test_context_multiplier_is_clamped() -> None:
    assert kudos.context_multiplier(1) == pytest.approx(1.2 + 2.2**-10, rel=1e-6)
    assert kudos.context_multiplier(1_048_576) == 30.0


def test_free_output_allowance_interpolates() -> None:
    s = AdmissionSettings()
    assert kudos.free_output_allowance(s, None) == 512
    assert kudos.free_output_allowance(s, 0) == 4096
    assert kudos.free_output_allowance(s, 60) == 4096
    assert kudos.free_output_allowance(s, 300) == 512
    assert kudos.free_output_allowance(s, 180) == round(4096 - (4096 - 512) * 120 / 240)


def test_estimated_wait() -> None:
    assert kudos.estimated_wait_seconds(1000, 1, 0, 10) is None
    assert kudos.estimated_wait_seconds(0, 0, 2, 10) == 0.0
    # one job on two threads: only half the throughput is usable
    assert kudos.estimated_wait_seconds(1000, 1, 2, 20) == pytest.approx(100.0)


def test_hold_amount_uses_highest_multiplier() -> None:
    assert kudos.hold_amount(["a", "b"], 2100, reference=EMPTY) == 100.0
    assert kudos.hold_amount([], 2100, n=2, reference=EMPTY) == 40.0
    assert kudos.hold_amount(["org/small-7b", "org/big-70b"], 2100, reference=REFERENCE) == 7000.0
    assert kudos.hold_amount(["org/small-7b", "unknown"], 2100, n=2, reference=REFERENCE) == 1400.0


def test_no_eligible_worker_with_gap() -> None:
    gap = {"kind": "declaration_gap", "missing_declarations": ["vision"], "exceeded_limits": []}
    err = no_eligible_worker_error(gap)
    assert (
        err.message
        == "No online worker can serve this request: no online worker serving the model declares vision."
    )
    assert err.to_body()["impossible_reason"] == gap
    assert no_eligible_worker_error(None).message == "No online worker can serve this request."


def test_lower_max_length() -> None:
    assert lower_max_length(4096, 2048, False) == (
        2048,
        {"from": 4096, "to": 2048, "reason": "worker_max_length"},
    )
    assert lower_max_length(512, 2048, False) == (512, None)
    assert lower_max_length(512, 0, False) == (512, None)


def _msgs(n: int, size: int = 400) -> list[dict[str, str]]:
    out = []
    for i in range(n):
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": "x" * size})
    return out


def test_size_context_fits_without_change() -> None:
    sized = size_context([{"role": "user", "content": "hi"}], None, 512, 2048, 8192, "truncate_oldest")
    assert (sized.max_context_length, sized.adjustments) == (2048, [])


def test_size_context_grows_to_need() -> None:
    msgs = _msgs(1, 8000)  # ~2000 tokens
    sized = size_context(msgs, None, 512, 2048, 8192, "grow")
    assert sized.max_context_length == sized.prompt_tokens + 512
    assert sized.adjustments == [{"from": 2048, "to": sized.prompt_tokens + 512, "reason": "grow"}]


def test_size_context_reject_and_grow_refusals() -> None:
    msgs = _msgs(1, 8000)
    with pytest.raises(HordeError) as exc:
        size_context(msgs, None, 512, 2048, 8192, "reject")
    assert (exc.value.status, exc.value.rc, exc.value.param) == (400, "PromptExceedsContext", "messages")
    with pytest.raises(HordeError) as exc:
        size_context(msgs, None, 512, 2048, 1024, "grow")
    assert exc.value.rc == "PromptExceedsContext"


def test_size_context_truncates_oldest() -> None:
    msgs = [*_msgs(9, 4000), {"role": "user", "content": "latest"}]
    sized = size_context(msgs, None, 512, 2048, 4096, "truncate_oldest")
    assert sized.max_context_length == 4096
    assert sized.messages[-1] == {"role": "user", "content": "latest"}
    assert sized.adjustments[0] == {"from": 2048, "to": 4096, "reason": "grow"}
    trunc = sized.adjustments[1]
    assert trunc["reason"] == "truncate_oldest" and trunc["dropped_messages"] == len(msgs) - len(
        sized.messages
    )
    assert sized.prompt_tokens + 512 <= 4096


def test_size_buckets() -> None:
    assert [size_bucket(v) for v in (512, 513, 2048, 4096, 4097)] == [
        "<=512",
        "513-1024",
        "1025-2048",
        "2049-4096",
        ">4096",
    ]


def _head(**kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "finished": 0,
        "processing": 0,
        "restarted": 0,
        "jobs": 1,
        "n": 1,
        "faulted": False,
        "cancelled": False,
    }
    base.update(kw)
    return base


def test_done_rule() -> None:
    assert counts(_head())["done"] is False
    assert counts(_head(n=0, processing=1))["done"] is False
    assert counts(_head(n=0, finished=1))["done"] is True
    # a cancelled request with nothing in flight is done, with no generation
    assert counts(_head(n=0, cancelled=True))["done"] is True
    assert counts(_head(n=0, cancelled=True, processing=1))["done"] is False
    assert counts(_head(faulted=True))["done"] is True
    assert counts(_head(n=1, restarted=2))["waiting"] == 1
