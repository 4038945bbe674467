"""The operation fingerprint of a chat request.

See docs/native-api.md#operation-key.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .limits import CHAT_SAMPLING_DEFAULTS, OPERATION_FINGERPRINT_EXCLUDED_HORDE_KEYS
from .request import ChatRequest

# Sampling params whose default the job carries anyway, so sent-at-default equals left out.
_DEFAULTED_PARAMS = ("temperature", "top_p", "frequency_penalty", "presence_penalty")


def canonical_json(value: Any) -> bytes:
    """Canonical JSON: sorted keys, no insignificant whitespace, UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode(
        "utf-8", "surrogatepass"
    )


def operation_fingerprint_inputs(request: ChatRequest) -> dict[str, Any]:
    """The document the fingerprint hashes: stored messages, mapped text params (sampling defaults filled,
    floats as floats), the sorted model list, every horde option with defaults filled except
    OPERATION_FINGERPRINT_EXCLUDED_HORDE_KEYS (worker lists sorted), and the answer extras when there are any
    (the stream hint is not in it; nor are stream, stream_options, user and metadata).
    """
    params = dict(request.text_params)
    for key in _DEFAULTED_PARAMS:
        params[key] = float(params.get(key, CHAT_SAMPLING_DEFAULTS[key]))
    horde: dict[str, Any] = {}
    for key, value in request.horde.model_dump(mode="json").items():
        if key in OPERATION_FINGERPRINT_EXCLUDED_HORDE_KEYS:
            continue
        if key in ("only", "ignore") and value is not None:
            value = sorted(set(value))
        horde[key] = value
    doc: dict[str, Any] = {
        "messages": request.messages,
        "params": params,
        "models": sorted(request.models),
        "horde": horde,
    }
    extras = request.answer_extras
    if extras:
        doc["chat_extras"] = extras
    return doc


def build_operation_fingerprint(request: ChatRequest) -> str:
    """SHA-256 hex digest (64 characters) of the canonical JSON of :func:`operation_fingerprint_inputs`.

    Equal for max_tokens and max_completion_tokens with one value, an option sent at its default and one
    left out, ``model: "a"`` and ``models: ["a"]``, and models in another order.
    See docs/native-api.md#operation-key.
    """
    return hashlib.sha256(canonical_json(operation_fingerprint_inputs(request))).hexdigest()
