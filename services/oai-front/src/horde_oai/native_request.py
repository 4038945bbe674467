"""Request → native body: the ``POST /v2/generate/chat/async`` body of a screened OpenAI request, and the
digests a resumed stream or a retried call is matched by. No I/O. See docs/openai-front.md#requests,
#streaming.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from typing import Any

from horde_contract import TOP_LEVEL_KEYS

# Request keys the native route does not apply (stream is a hint the front sets itself; horde is rebuilt
# with the operation key), so they are never forwarded.
NOT_FORWARDED_KEYS = frozenset({"n", "stream", "stream_options", "user", "metadata", "horde"})

# The keys forwarded to the native route: the contract's request keys less the ones above. Sorted, so the
# native body's key order does not depend on the process's string hashing.
FORWARDED_KEYS = tuple(sorted(TOP_LEVEL_KEYS - NOT_FORWARDED_KEYS))


def new_operation_key() -> str:
    """A fresh ``horde.operation_key``: one per client call, so a retried native POST is idempotent."""
    return str(uuid.uuid4())


def requested_models(body: Mapping[str, Any]) -> list[str]:
    """The request's models: ``[model]`` or ``models``."""
    if isinstance(body.get("models"), list):
        return [str(m) for m in body["models"]]
    model = body.get("model")
    return [str(model)] if model is not None else []


def include_reasoning(body: Mapping[str, Any]) -> bool:
    """``horde.include_reasoning`` (default true)."""
    horde = body.get("horde")
    return not (isinstance(horde, dict) and horde.get("include_reasoning") is False)


def build_native_body(
    screened: Mapping[str, Any], operation_key: str, *, stream_hint: bool = False
) -> dict[str, Any]:
    """The ``POST /v2/generate/chat/async`` body for a screened request.

    Forwards the keys the native route applies, unchanged (``models`` included), with
    ``horde.operation_key`` set. ``stream`` is forwarded only when the front relays deltas.
    """
    native: dict[str, Any] = {k: screened[k] for k in FORWARDED_KEYS if screened.get(k) is not None}
    horde = {k: v for k, v in (screened.get("horde") or {}).items() if v is not None}
    horde["operation_key"] = horde.get("operation_key") or operation_key
    native["horde"] = horde
    if stream_hint:
        native["stream"] = True
    return native


def relays_deltas(body: Mapping[str, Any]) -> bool:
    """True for a request whose progress the front relays (docs/openai-front.md#streaming): ``stream: true``, no tools,
    and no response_format other than text. Tool calls and structured output are verified only once the reply
    is complete, so they are never relayed before verification."""
    if body.get("stream") is not True or body.get("tools"):
        return False
    response_format = body.get("response_format")
    return response_format is None or (
        isinstance(response_format, Mapping) and response_format.get("type") == "text"
    )


def request_digest(native_body: Mapping[str, Any]) -> str:
    """SHA-256 of a native body without its ``horde.operation_key``: a resumed stream must carry the request
    it resumes."""
    horde = {k: v for k, v in (native_body.get("horde") or {}).items() if k != "operation_key"}
    canonical = {**native_body, "horde": horde}
    canonical.pop("stream", None)
    text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def key_digest(apikey: str) -> str:
    """SHA-256 of an API key, as the front stores it (never the key itself)."""
    return hashlib.sha256(apikey.encode("utf-8", "surrogatepass")).hexdigest()
