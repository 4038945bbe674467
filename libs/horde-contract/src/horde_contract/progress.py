"""Progress posts and the job lease as pure rules.

See docs/native-api.md#progress (body, refusals, caps) and #job-lease (renewal, caps, the
speed gate).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ._json_values import utf8_len
from .errors import RC, HordeError
from .limits import (
    CHAT_PROGRESS_BYTES_PER_TOKEN,
    TEXT_JOB_LEASE_SECONDS,
    TEXT_JOB_PREPARATION_SECONDS,
    TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
    UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND,
    UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS,
)


@dataclass(frozen=True, slots=True)
class ChatProgress:
    """A progress post: generation ``id``, ``seq`` (1, 2, ...), the delta's ``content`` and optional
    ``reasoning_content``; ``delta_bytes`` is their UTF-8 size, which counts toward the byte cap."""

    id: str
    seq: int
    content: str
    reasoning_content: str | None = None

    @property
    def delta_bytes(self) -> int:
        """UTF-8 bytes of content and reasoning together."""
        return utf8_len(self.content) + utf8_len(self.reasoning_content or "")


def _invalid(field: str, text: str) -> HordeError:
    # Upstream's validator wording ("Input payload validation failed: <field>: ..."), no param: the wire as served.
    return HordeError(400, RC.BadRequest, f"Input payload validation failed: {field}: {text}")


def parse_progress_body(body: Any) -> ChatProgress:
    """Validate ``POST /v2/generate/text/progress``: ``{id, seq, delta: {content?, reasoning_content?}}``.

    Raises 400 BadRequest for a wrong type, a seq below 1, and a delta whose content and reasoning_content
    are both empty or absent ("The delta carries neither content nor reasoning_content."). NUL characters are
    kept: the caller stores them as U+FFFD. See docs/native-api.md#progress.
    """
    if not isinstance(body, dict):
        raise _invalid("body", "must be an object")
    job_id = body.get("id")
    if not isinstance(job_id, str) or not job_id:
        raise _invalid("id", "has to be the generation id (a string)")
    seq = body.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        raise _invalid("seq", "has to be an integer of at least 1")
    delta = body.get("delta")
    if not isinstance(delta, dict):
        raise _invalid("delta", "has to be an object")
    content = delta.get("content")
    reasoning = delta.get("reasoning_content")
    for name, value in (("content", content), ("reasoning_content", reasoning)):
        if value is not None and not isinstance(value, str):
            raise _invalid(f"delta.{name}", "has to be a string")
    if not content and not reasoning:
        raise HordeError(400, RC.BadRequest, "The delta carries neither content nor reasoning_content.")
    return ChatProgress(id=job_id, seq=seq, content=content or "", reasoning_content=reasoning or None)


def progress_byte_cap(max_length: int) -> int:
    """The bytes a generation may post: CHAT_PROGRESS_BYTES_PER_TOKEN (16) per max_length token."""
    return CHAT_PROGRESS_BYTES_PER_TOKEN * max_length


def progress_out_of_sequence_error(seq: int, expected_seq: int | None) -> HordeError:
    """409 ChatProgressOutOfSequence for the post ``seq``; the body adds ``expected_seq``."""
    return HordeError(
        409,
        RC.ChatProgressOutOfSequence,
        f"seq {seq} is out of sequence; the next post of this generation is seq {expected_seq}.",
        "seq",
        {"expected_seq": expected_seq},
    )


def progress_cap_reached_error(*, post_too_large: bool = False) -> HordeError:
    """413 ChatProgressCapReached: stop posting, still submit. ``post_too_large``: the post alone is larger than
    any generation's cap (refused while its body is read)."""
    what = (
        "This post is larger than any generation's progress cap"
        if post_too_large
        else ("This generation reached its progress cap")
    )
    return HordeError(
        413, RC.ChatProgressCapReached, f"{what}. Stop posting progress; still submit the reply.", None
    )


def progress_not_streaming_error(gen_id: str) -> HordeError:
    """404 ChatProgressNotStreaming: no lease, stored and not aborted. Stop posting; still submit."""
    return HordeError(
        404,
        RC.ChatProgressNotStreaming,
        f"Generation {gen_id} does not stream progress. Stop posting progress; still submit the reply.",
        None,
    )


def chat_job_aborted_error(gen_id: str) -> HordeError:
    """404 ChatJobAborted: the generation is faulted, gone, or its request expired. Stop generating; do not
    submit."""
    return HordeError(
        404,
        RC.ChatJobAborted,
        f"Generation {gen_id} was aborted. Stop generating and do not submit it.",
        None,
    )


def progress_unavailable_error() -> HordeError:
    """503 ChatProgressUnavailable: the progress store cannot be reached."""
    return HordeError(503, RC.ChatProgressUnavailable, "The progress store cannot be reached.", None)


def text_job_lease_cap(*, trusted: bool) -> int:
    """Seconds from the pop a job's lease may reach: 600 for a trusted owner, 200 otherwise."""
    return TRUSTED_TEXT_JOB_LEASE_CAP_SECONDS if trusted else UNTRUSTED_TEXT_JOB_LEASE_CAP_SECONDS


def renewed_job_ttl(*, started: float, now: float, current_ttl: int, trusted: bool) -> int:
    """The job_ttl (seconds from ``started``, the pop) after an appended post at ``now``: the lease ends
    TEXT_JOB_LEASE_SECONDS after the post, rounded up to whole seconds, never before it ended already and
    never past the owner's cap. See docs/native-api.md#job-lease.
    """
    wanted = math.ceil(now - started + TEXT_JOB_LEASE_SECONDS)
    return max(current_ttl, min(wanted, text_job_lease_cap(trusted=trusted)))


def lease_capacity_tokens(speed: float | None) -> float:
    """The max_length a worker finishes inside the base lease after the preparation allowance:
    speed * (150 - 30), with an unmeasured (None or 0) speed counted as 10 tokens per second."""
    tokens_per_second = speed if speed else UNMEASURED_TEXT_WORKER_TOKENS_PER_SECOND
    return tokens_per_second * (TEXT_JOB_LEASE_SECONDS - TEXT_JOB_PREPARATION_SECONDS)


def passes_speed_gate(max_length: int, speed: float | None) -> bool:
    """Whether the pop may offer a chat job of ``max_length`` tokens to a worker of ``speed`` tokens/s."""
    return lease_capacity_tokens(speed) >= max_length
