"""Refusal builders, progress posts and lease rules (docs/native-api.md#routes, #operation-key, #images,
#progress, #job-lease; docs/openai-front.md#kudos-cap)."""

from __future__ import annotations

from typing import Any

import horde_contract as hc
import pytest


def test_route_refusals(refusal: Any) -> None:
    refusal(
        hc.request_too_large_error(),
        413,
        "RequestTooLarge",
        None,
        "The request body is larger than 37748736 bytes.",
    )
    refusal(
        hc.chat_admission_disabled_error(),
        503,
        "ChatAdmissionDisabled",
        None,
        "This horde is not accepting new chat requests at the moment.",
    )
    refusal(
        hc.operation_key_conflict_error(),
        400,
        "OperationKeyConflict",
        "horde.operation_key",
        "'horde.operation_key': this key already identifies a different request.",
    )
    refusal(
        hc.chat_model_mismatch_error("a", "b"),
        400,
        "ChatModelMismatch",
        "model_id",
        "'model_id': the reply names the model 'a', but the job was assigned 'b'.",
    )
    refusal(
        hc.chat_image_storage_unavailable_error(),
        503,
        "ChatImageStorageUnavailable",
        None,
        "The request's images could not be stored; try again later. Nothing was charged.",
    )


def test_kudos_cap_message_round_trips() -> None:
    err = hc.kudos_cap_exceeded_error(214.2, 1)
    assert (err.status, err.rc, err.param) == (400, "ChatKudosCapExceeded", "horde.max_kudos")
    assert err.message == (
        "The request's kudos estimate at current pricing is 215, above its horde.max_kudos of 1. "
        "The estimate assumes the full max_tokens is generated."
    )
    match = hc.KUDOS_CAP_EXCESS_PATTERN.search(err.message)
    assert match is not None and match.group("kudos_estimate") == "215" and match.group("max_kudos") == "1"


def test_image_refusals(refusal: Any) -> None:
    path = "messages[0].content[1].image_url"
    refusal(
        hc.source_image_size_error(path, 6_000_000),
        400,
        "SourceImageSizeExceeded",
        path,
        f"'{path}': the image takes 6000000 bytes; at most 5242880 are allowed.",
    )
    refusal(
        hc.source_image_resolution_error(path, 4000, 3000),
        400,
        "SourceImageResolutionExceeded",
        path,
        f"'{path}': the image is 4000x3000 pixels; at most 9437184 pixels (3072x3072) are allowed.",
    )
    # A decompression bomb reports only its pixel count.
    refusal(
        hc.source_image_resolution_error(path, pixels=225_000_000),
        400,
        "SourceImageResolutionExceeded",
        path,
        f"'{path}': the image is 225000000 pixels; at most 9437184 pixels (3072x3072) are allowed.",
    )
    refusal(
        hc.source_image_resolution_error(path),
        400,
        "SourceImageResolutionExceeded",
        path,
        f"'{path}': the image has too many pixels; at most 9437184 pixels (3072x3072) are allowed.",
    )
    refusal(
        hc.source_image_unreadable_error(path),
        400,
        "SourceImageUnreadable",
        path,
        f"'{path}': the image cannot be read.",
    )
    refusal(
        hc.source_image_url_refused_error(path),
        400,
        "SourceImageUrlRefused",
        path,
        f"'{path}': the image URL resolves to an address the Horde does not fetch from, or redirects too often.",
    )
    refusal(
        hc.source_image_url_invalid_error(path, 404),
        400,
        "SourceImageUrlInvalid",
        path,
        f"'{path}': the image URL answered with HTTP 404.",
    )
    assert (
        hc.source_image_url_invalid_error(path).openai_message
        == "the image URL answered with no usable answer."
    )
    refusal(
        hc.too_many_images_error(21),
        400,
        "TooManyExtraSourceImages",
        "messages",
        "'messages': the request carries 21 images; at most 20 are allowed.",
    )
    assert hc.chat_image_total_cap(trusted=True) == 25 * 1024 * 1024
    assert hc.chat_image_total_cap(trusted=False) == 5 * 1024 * 1024
    hc.check_image_total(5 * 1024 * 1024, trusted=False)
    with pytest.raises(hc.HordeError) as info:
        hc.check_image_total(5 * 1024 * 1024 + 1, trusted=False)
    refusal(
        info.value,
        400,
        "SourceImageSizeExceeded",
        "messages",
        "The request's images total 5242881 bytes, above the cap of 5242880 bytes.",
    )
    hc.check_image_total(25 * 1024 * 1024, trusted=True, encoded=True)


def test_fault_reason_and_adjustments() -> None:
    assert hc.cut_fault_reason("x" * 1500) == "x" * 1000
    assert hc.cut_fault_reason("short") == "short"
    assert hc.context_adjustment(2048, 4096, "grow") == {"from": 2048, "to": 4096, "reason": "grow"}
    assert hc.context_adjustment(4096, 2048, hc.ChatContextAdjustmentReason.worker_max_length) == {
        "from": 4096,
        "to": 2048,
        "reason": "worker_max_length",
    }
    assert (
        hc.context_adjustment(21000, 7900, "truncate_oldest", dropped_messages=10)["dropped_messages"] == 10
    )
    with pytest.raises(ValueError):
        hc.context_adjustment(1, 2, "shrink")


# The wire wording the submit service serves (upstream's validator style); no param, as served.
PROGRESS_REFUSALS = [
    ("not-object", [], None, "Input payload validation failed: body: must be an object"),
    ("id", {"seq": 1, "delta": {"content": "x"}}, None, "Input payload validation failed: id: has to be the generation id (a string)"),
    ("seq-zero", {"id": "g", "seq": 0, "delta": {"content": "x"}}, None, "Input payload validation failed: seq: has to be an integer of at least 1"),
    ("seq-bool", {"id": "g", "seq": True, "delta": {"content": "x"}}, None, "Input payload validation failed: seq: has to be an integer of at least 1"),
    ("delta-type", {"id": "g", "seq": 1, "delta": "x"}, None, "Input payload validation failed: delta: has to be an object"),
    ("content-type", {"id": "g", "seq": 1, "delta": {"content": 1}}, None, "Input payload validation failed: delta.content: has to be a string"),
    ("reasoning-type", {"id": "g", "seq": 1, "delta": {"content": "x", "reasoning_content": 1}}, None, "Input payload validation failed: delta.reasoning_content: has to be a string"),
    ("empty", {"id": "g", "seq": 1, "delta": {"content": "", "reasoning_content": ""}}, None, "The delta carries neither content nor reasoning_content."),
    ("absent", {"id": "g", "seq": 1, "delta": {}}, None, "The delta carries neither content nor reasoning_content."),
]  # fmt: skip


@pytest.mark.parametrize(
    ("case", "body", "param", "message"), PROGRESS_REFUSALS, ids=[c[0] for c in PROGRESS_REFUSALS]
)
def test_progress_refusals(case: str, body: Any, param: str | None, message: str, refusal: Any) -> None:
    with pytest.raises(hc.HordeError) as info:
        hc.parse_progress_body(body)
    refusal(info.value, 400, "BadRequest", param, message)


def test_progress_accepted_and_errors(refusal: Any) -> None:
    post = hc.parse_progress_body({"id": "g", "seq": 2, "delta": {"content": "hé"}})
    assert post == hc.ChatProgress(id="g", seq=2, content="hé") and post.delta_bytes == 3
    thinking = hc.parse_progress_body({"id": "g", "seq": 1, "delta": {"reasoning_content": "hmm"}})
    assert thinking.content == "" and thinking.reasoning_content == "hmm" and thinking.delta_bytes == 3
    assert hc.progress_byte_cap(512) == 8192
    err = hc.progress_out_of_sequence_error(5, 3)
    assert (err.status, err.rc, err.param) == (409, "ChatProgressOutOfSequence", "seq")
    assert err.to_body()["expected_seq"] == 3
    assert (hc.progress_cap_reached_error().status, hc.progress_cap_reached_error().rc) == (
        413,
        "ChatProgressCapReached",
    )
    assert (hc.progress_not_streaming_error("g").status, hc.progress_not_streaming_error("g").rc) == (
        404,
        "ChatProgressNotStreaming",
    )
    assert (hc.chat_job_aborted_error("g").status, hc.chat_job_aborted_error("g").rc) == (
        404,
        "ChatJobAborted",
    )
    assert (hc.progress_unavailable_error().status, hc.progress_unavailable_error().rc) == (
        503,
        "ChatProgressUnavailable",
    )


def test_lease_rules() -> None:
    assert hc.text_job_lease_cap(trusted=True) == 600 and hc.text_job_lease_cap(trusted=False) == 200
    assert hc.renewed_job_ttl(started=1000, now=1010.2, current_ttl=150, trusted=True) == 161
    assert hc.renewed_job_ttl(started=1000, now=1100, current_ttl=150, trusted=False) == 200
    assert hc.renewed_job_ttl(started=1000, now=1500, current_ttl=590, trusted=True) == 600
    assert hc.renewed_job_ttl(started=1000, now=1000, current_ttl=200, trusted=True) == 200
    assert hc.lease_capacity_tokens(None) == 1200 and hc.lease_capacity_tokens(0) == 1200
    assert hc.lease_capacity_tokens(20) == 2400
    assert hc.passes_speed_gate(1200, None) and not hc.passes_speed_gate(1201, None)
    assert hc.passes_speed_gate(4096, 40)
