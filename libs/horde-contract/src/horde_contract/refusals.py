"""Builders for the refusals the services raise around the contract, so each message is written in one place.

The API key refusals (InvalidAPIKey, DeletedUser, WrongCredentials) and WorkerNotFound are the ones every
native service's authentication and worker lookups raise.

See docs/native-api.md#routes (413 RequestTooLarge, 503 ChatAdmissionDisabled), #operation-key,
#images (per-image and total caps, fetch refusals, storage), #request-body (horde.max_kudos),
#submit (ChatModelMismatch), #refusal-record (MAX_CHAT_FAULT_REASON_LENGTH),
#context-adjustments (entries); docs/openai-front.md#kudos-cap (KUDOS_CAP_EXCESS_PATTERN).
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import RC, HordeError, path_error
from .limits import (
    MAX_CHAT_BODY_BYTES,
    MAX_CHAT_FAULT_REASON_LENGTH,
    MAX_CHAT_IMAGE_BYTES,
    MAX_CHAT_IMAGE_COUNT,
    MAX_CHAT_IMAGE_PIXELS,
    MAX_CHAT_IMAGE_TOTAL_BYTES,
    MAX_CHAT_IMAGE_TOTAL_BYTES_UNTRUSTED,
)
from .vocab import ChatContextAdjustmentReason

# The front reads both numbers back from the native message (docs/openai-front.md#kudos-cap).
KUDOS_CAP_EXCESS_PATTERN = re.compile(
    r"kudos estimate at current pricing is (?P<kudos_estimate>\d+), above its horde\.max_kudos of (?P<max_kudos>\d+)\."
)


# The API key refusals every native route shares; the submit and progress routes' InvalidAPIKey names the
# register page, as upstream's does.
INVALID_API_KEY_MESSAGE = "No user matching sent API Key. Have you remembered to register?"
WORKER_INVALID_API_KEY_MESSAGE = (
    "No user matching sent API Key. Have you remembered to register at https://stablehorde.net/register ?"
)
WRONG_CREDENTIALS_MESSAGE = "Wrong credentials to submit as this worker."


def invalid_api_key_error(*, register_page: bool = False) -> HordeError:
    """401 InvalidAPIKey: a missing or unknown key (``register_page``: the worker submit's wording)."""
    return HordeError(
        401, RC.InvalidAPIKey, WORKER_INVALID_API_KEY_MESSAGE if register_page else INVALID_API_KEY_MESSAGE
    )


def deleted_user_error() -> HordeError:
    """403 DeletedUser: the key's user was deleted."""
    return HordeError(403, RC.DeletedUser, "This user has been deleted.")


def wrong_credentials_error() -> HordeError:
    """403 WrongCredentials: the key is not the key of the worker's owner."""
    return HordeError(403, RC.WrongCredentials, WRONG_CREDENTIALS_MESSAGE)


def worker_not_found_error(worker: str) -> HordeError:
    """404 WorkerNotFound for ``worker`` (an id or a name, quoted in upstream's message)."""
    return HordeError(404, RC.WorkerNotFound, f"Worker with ID '{worker}' not found.")


def request_too_large_error() -> HordeError:
    """413 RequestTooLarge: the body is above MAX_CHAT_BODY_BYTES (checked before parsing)."""
    return HordeError(
        413, RC.RequestTooLarge, f"The request body is larger than {MAX_CHAT_BODY_BYTES} bytes.", None
    )


def chat_admission_disabled_error() -> HordeError:
    """503 ChatAdmissionDisabled: HORDE_CHAT_ADMISSION_ENABLED is false."""
    return HordeError(
        503, RC.ChatAdmissionDisabled, "This horde is not accepting new chat requests at the moment.", None
    )


def operation_key_conflict_error() -> HordeError:
    """400 OperationKeyConflict: the operation key was claimed by a request with another fingerprint."""
    return HordeError(
        400,
        RC.OperationKeyConflict,
        "'horde.operation_key': this key already identifies a different request.",
        "horde.operation_key",
        openai_message="This operation key already identifies a different request.",
    )


def kudos_cap_exceeded_error(estimate: float, cap: int) -> HordeError:
    """400 ChatKudosCapExceeded: the kudos estimate (rounded up) is above horde.max_kudos; the message
    matches KUDOS_CAP_EXCESS_PATTERN."""
    return HordeError(
        400,
        RC.ChatKudosCapExceeded,
        f"The request's kudos estimate at current pricing is {math.ceil(estimate)}, above its horde.max_kudos of "
        f"{cap}. The estimate assumes the full max_tokens is generated.",
        "horde.max_kudos",
    )


def too_many_images_error(count: int) -> HordeError:
    """400 TooManyExtraSourceImages: more than MAX_CHAT_IMAGE_COUNT image parts."""
    return path_error(
        400,
        RC.TooManyExtraSourceImages,
        "messages",
        f"the request carries {count} images; at most {MAX_CHAT_IMAGE_COUNT} are allowed.",
    )


def source_image_size_error(path: str, size: int) -> HordeError:
    """400 SourceImageSizeExceeded for one image over MAX_CHAT_IMAGE_BYTES (decoded or fetched bytes)."""
    return path_error(
        400,
        RC.SourceImageSizeExceeded,
        path,
        f"the image takes {size} bytes; at most {MAX_CHAT_IMAGE_BYTES} are allowed.",
    )


def source_image_total_error(total: int, cap: int, *, encoded: bool = False) -> HordeError:
    """400 SourceImageSizeExceeded for the images' total; the message states the total reached and the cap
    (``encoded``: the stored JPEGs passed it). See docs/native-api.md#images.
    """
    what = "The request's images encode to" if encoded else "The request's images total"
    return HordeError(
        400,
        RC.SourceImageSizeExceeded,
        f"{what} {total} bytes, above the cap of {cap} bytes.",
        "messages",
    )


def chat_image_total_cap(*, trusted: bool) -> int:
    """The user's image total cap: 25 MiB for trusted users and patrons, 5 MiB for anyone else."""
    return MAX_CHAT_IMAGE_TOTAL_BYTES if trusted else MAX_CHAT_IMAGE_TOTAL_BYTES_UNTRUSTED


def check_image_total(total: int, *, trusted: bool, encoded: bool = False) -> None:
    """Raise :func:`source_image_total_error` when ``total`` bytes pass the user's cap."""
    cap = chat_image_total_cap(trusted=trusted)
    if total > cap:
        raise source_image_total_error(total, cap, encoded=encoded)


def source_image_resolution_error(
    path: str, width: int | None = None, height: int | None = None, *, pixels: int | None = None
) -> HordeError:
    """400 SourceImageResolutionExceeded: more than MAX_CHAT_IMAGE_PIXELS, read from the header.

    The message states ``width``x``height`` when both are known; otherwise the pixel count ``pixels`` (as
    from a decoder's decompression-bomb guard, which reports only the count) or that the image is larger than
    the cap. See docs/native-api.md#images.
    """
    cap = f"at most {MAX_CHAT_IMAGE_PIXELS} pixels (3072x3072) are allowed."
    if width is not None and height is not None:
        size = f"the image is {width}x{height} pixels"
    elif pixels is not None:
        size = f"the image is {pixels} pixels"
    else:
        size = "the image has too many pixels"
    return path_error(400, RC.SourceImageResolutionExceeded, path, f"{size}; {cap}")


def source_image_unreadable_error(path: str) -> HordeError:
    """400 SourceImageUnreadable: the bytes are not a readable image."""
    return path_error(400, RC.SourceImageUnreadable, path, "the image cannot be read.")


def source_image_url_refused_error(path: str, reason: str | None = None) -> HordeError:
    """400 SourceImageUrlRefused: the URL (or a redirect) resolves to an address the Horde does not fetch, or
    names a port other than the standard web ports (CHAT_IMAGE_FETCH_PORTS); ``reason`` replaces the default
    text (the port refusal says so)."""
    return path_error(
        400,
        RC.SourceImageUrlRefused,
        path,
        reason
        or "the image URL resolves to an address the Horde does not fetch from, or redirects too often.",
    )


def source_image_url_invalid_error(
    path: str, status: int | None = None, reason: str | None = None
) -> HordeError:
    """400 SourceImageUrlInvalid: the URL did not answer 200; with ``reason``, the URL is malformed, cannot be
    encoded as ASCII, sent a compressed body or did not answer in time, and ``reason`` says which."""
    if reason is not None:
        return path_error(400, RC.SourceImageUrlInvalid, path, reason)
    answer = f"HTTP {status}" if status is not None else "no usable answer"
    return path_error(400, RC.SourceImageUrlInvalid, path, f"the image URL answered with {answer}.")


def chat_image_storage_unavailable_error() -> HordeError:
    """503 ChatImageStorageUnavailable: storing the images or messages failed; nothing was charged."""
    return HordeError(
        503,
        RC.ChatImageStorageUnavailable,
        "The request's images could not be stored; try again later. Nothing was charged.",
        None,
    )


def chat_model_mismatch_error(model_id: str, assigned: str | None) -> HordeError:
    """400 ChatModelMismatch: a submit's model_id is not the generation's assigned model."""
    return path_error(
        400,
        RC.ChatModelMismatch,
        "model_id",
        f"the reply names the model {model_id!r}, but the job was assigned {assigned!r}.",
    )


def cut_fault_reason(message: str) -> str:
    """``chat_fault_reason`` as stored: the message cut to MAX_CHAT_FAULT_REASON_LENGTH characters."""
    return message[:MAX_CHAT_FAULT_REASON_LENGTH]


def context_adjustment(
    from_: int, to: int, reason: str, *, dropped_messages: int | None = None
) -> dict[str, Any]:
    """One ``context_adjustments`` entry: ``{"from", "to", "reason"}``, plus ``dropped_messages`` on a
    truncate_oldest entry. ``reason`` is a :class:`ChatContextAdjustmentReason` value."""
    entry: dict[str, Any] = {"from": from_, "to": to, "reason": ChatContextAdjustmentReason(reason).value}
    if dropped_messages is not None:
        entry["dropped_messages"] = dropped_messages
    return entry
