"""The ``openai`` backend: any OpenAI-compatible server (llama-server, koboldcpp, vLLM, Ollama, llama-cpp-python).

Facts and quirks: worker/README.md (each backend, and what the worker declares for it). The server's *flavor* is detected at start-up (or set with
``--openai-flavor``) and decides the declaration and the request/response mapping:

- ``koboldcpp``: ``json_object`` is sent as ``json_schema {"type": "object"}`` (its json grammar's root is an
  array); ``frequency_penalty`` is not sent (it is only a fallback for presence_penalty there); temperature
  with tools is clamped to 1.0 by the server, so ``tools_max_temperature`` 1.0; ``<think>`` stays in content.
- ``llama-server``: ``parallel_tool_calls`` sent as the job asks, ``true`` otherwise (its default is false);
  400 ``exceed_context_size_error`` → ``prompt_overflow``, 400 "failed to parse grammar" →
  ``unbuildable_grammar``; the prompt is rendered with ``/apply-template`` and counted with ``/tokenize``
  before generating, since a fail-open grammar or context shift would otherwise go unnoticed.
- ``vllm``: reads ``reasoning`` (and the pre-0.11 ``reasoning_content``); 400 over ``max_model_len`` →
  ``prompt_overflow``.
- ``ollama``: reads ``reasoning``; tool_choice is ignored by the server and the prompt is silently truncated,
  so no ``tool_choice_enforced`` and no ``prompt_overflow_refused``.
- ``llama-cpp-python`` (``python -m llama_cpp.server``): ``response_format`` only in its
  ``{"type": "json_object", "schema": …}`` form, and a forced tool only in the object form, so
  ``"required"`` with one tool is sent as ``{"type": "function", "function": {"name": …}}``.
- ``generic``: standard fields only; declares the sampler features and nothing it cannot verify.

Streaming (:meth:`OpenAIBackend.stream_chat`, for jobs carrying the stream hint): the request is sent with
``stream: true`` (and ``stream_options.include_usage`` except to koboldcpp), the SSE ``data:`` events are
parsed by :class:`ChatStreamAccumulator` (``delta.content``, ``delta.reasoning_content``/``delta.reasoning``,
tool call fragments accumulated by index, ``finish_reason``, ``usage`` from the last chunk) and each text piece
is yielded as it arrives. Closing the stream (the job cancelled, its lease lapsed) closes the HTTP response,
which drops the connection and makes the server stop generating. A server that answers a streamed request
with a plain JSON body is read as a whole reply.

The mapping functions (:func:`build_chat_request`, :func:`parse_chat_response`, :func:`fault_for_error`,
:func:`capabilities_for`, :class:`ChatStreamAccumulator`, …) are pure and unit-tested; :class:`OpenAIBackend`
does the HTTP.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

import httpx
from horde_contract import TEXT_JOB_LEASE_SECONDS, ChatFaultReason, ChatFeature, ChatGuarantee

from horde_worker.backends.base import Backend
from horde_worker.declaration import Capabilities
from horde_worker.jobs import BackendFault, ChatDelta, ChatJob, ChatOutput, TextJob, message_text

log = logging.getLogger(__name__)

KOBOLDCPP = "koboldcpp"
LLAMA_SERVER = "llama-server"
VLLM = "vllm"
OLLAMA = "ollama"
LLAMA_CPP_PYTHON = "llama-cpp-python"
GENERIC = "generic"
FLAVORS = (KOBOLDCPP, LLAMA_SERVER, VLLM, OLLAMA, LLAMA_CPP_PYTHON, GENERIC)

F = ChatFeature
G = ChatGuarantee
_SAMPLERS = {F.seed.value, F.presence_penalty.value, F.frequency_penalty.value}
_FORMATS = {F.json_object.value, F.json_schema.value}
# What llama-server and vLLM enforce themselves (grammar-constrained tools and schemas, a context check).
_SERVER_ENFORCED = frozenset(
    {
        G.tool_choice_enforced.value,
        G.single_tool_call_enforced.value,
        G.prompt_overflow_refused.value,
        G.structured_output_enforced.value,
    }
)


@dataclass
class Discovery:
    """What the server told about itself at start-up (all optional)."""

    flavor: str = GENERIC
    model_name: str | None = None
    max_context_length: int | None = None
    max_length: int | None = None
    ollama_capabilities: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def root_url(base_url: str) -> str:
    """The server root for a base URL given with or without ``/v1`` (``http://h:8080/v1`` → ``http://h:8080``)."""
    url = base_url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def friendly_model_name(name: str | None) -> str | None:
    """A model name usable as ``model_id``: a path's file name without ``.gguf`` (llama-server reports paths)."""
    if not name:
        return None
    if "/" in name and (name.startswith("/") or name.endswith(".gguf")):
        name = PurePosixPath(name).name
    return re.sub(r"\.gguf$", "", name, flags=re.IGNORECASE) or None


def capabilities_for(discovery: Discovery) -> Capabilities:
    """The declaration inputs for a flavor (worker/README.md#what-the-worker-declares).

    Guarantees are declared only where the worker checks them itself: tool names and ids always, the first
    call kept under ``parallel_tool_calls: false``, strict schemas validated locally, and the prompt counted or
    the server's overflow 400 mapped.
    """
    flavor = discovery.flavor
    feats: set[str]
    guars: set[str]
    tools_max_temperature = None
    if flavor == KOBOLDCPP:
        feats = {F.seed.value, F.presence_penalty.value, F.tools.value} | _FORMATS
        # structured_output_enforced left out: its json_schema silently runs unconstrained when discarded
        guars = {
            G.tool_choice_enforced.value,
            G.single_tool_call_enforced.value,
            G.prompt_overflow_refused.value,
        }
        tools_max_temperature = 1.0
    elif flavor == LLAMA_SERVER:
        feats = _SAMPLERS | {F.reasoning_effort.value, F.tools.value} | _FORMATS
        guars = set(_SERVER_ENFORCED)
    elif flavor == VLLM:
        feats = _SAMPLERS | {F.tools.value, F.tools_with_response_format.value} | _FORMATS
        guars = set(_SERVER_ENFORCED)
    elif flavor == OLLAMA:
        feats = _SAMPLERS | _FORMATS
        caps = set(discovery.ollama_capabilities)
        if not caps or "tools" in caps:
            feats.add(F.tools.value)
        if "thinking" in caps:
            feats.add(F.reasoning_effort.value)
        guars = {G.single_tool_call_enforced.value, G.structured_output_enforced.value}
    elif flavor == LLAMA_CPP_PYTHON:
        # tools: applied under a forced function (grammar); tool_choice auto gets plain text from it
        feats = _SAMPLERS | {F.tools.value} | _FORMATS
        guars = set(_SERVER_ENFORCED)
    else:
        feats = set(_SAMPLERS)
        guars = set()
    return Capabilities(
        features=frozenset(feats),
        guarantees=frozenset(guars),
        max_context_length=discovery.max_context_length,
        max_length=discovery.max_length,
        tools_max_temperature=tools_max_temperature,
        model_name=friendly_model_name(discovery.model_name),
        notes=list(discovery.notes),
    )


def map_response_format(flavor: str, response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The ``response_format`` to send for a flavor (koboldcpp and llama-cpp-python quirks)."""
    if not response_format:
        return None
    typ = response_format.get("type")
    if flavor == KOBOLDCPP and typ == "json_object":
        return {"type": "json_schema", "json_schema": {"name": "object", "schema": {"type": "object"}}}
    if flavor == LLAMA_CPP_PYTHON:
        if typ == "json_schema":
            schema = (response_format.get("json_schema") or {}).get("schema")
            return {"type": "json_object", "schema": schema} if schema else {"type": "json_object"}
        if typ == "json_object":
            return {"type": "json_object"}
    return response_format


def map_tool_choice(flavor: str, job: ChatJob) -> Any:
    """The ``tool_choice`` to send; ``None`` to leave it out.

    llama-cpp-python forces a tool only in the object form, so the narrowed ``"required"`` with one tool is
    sent as that object. llama-server turns the object form into auto (llama.cpp#26535), which the Horde's
    narrowing already avoids, so it gets the choice as received.
    """
    choice = job.tool_choice
    if choice is None:
        return None
    if flavor == LLAMA_CPP_PYTHON and job.forced_function:
        return {"type": "function", "function": {"name": job.forced_function}}
    return choice


def build_chat_request(flavor: str, job: ChatJob, model: str | None, stream: bool = False) -> dict[str, Any]:
    """The ``POST /v1/chat/completions`` body for a job.

    Carries every sampler the payload holds, mapped to the server's names (``repeat_penalty`` for llama.cpp,
    ``repetition_penalty`` for vLLM, ``rep_pen`` for koboldcpp); ``max_tokens`` is the job's ``max_length``.
    With ``stream``, ``stream: true`` and, except for koboldcpp, ``stream_options: {include_usage: true}`` (so
    the last chunk carries the counts; llama-cpp-python ignores it).
    """
    body: dict[str, Any] = {
        "model": model or "default",
        "messages": job.messages,
        "max_tokens": job.max_length,
        "temperature": job.temperature,
        "top_p": job.top_p,
        "presence_penalty": job.presence_penalty,
        "stream": stream,
    }
    if stream and flavor != KOBOLDCPP:
        body["stream_options"] = {"include_usage": True}
    if flavor != KOBOLDCPP:
        body["frequency_penalty"] = job.frequency_penalty
    if flavor in (LLAMA_SERVER, LLAMA_CPP_PYTHON):
        body.update(top_k=job.top_k, min_p=job.min_p, repeat_penalty=job.rep_pen)
    elif flavor == VLLM:
        body.update(top_k=job.top_k if job.top_k > 0 else -1, min_p=job.min_p, repetition_penalty=job.rep_pen)
    elif flavor == KOBOLDCPP:
        body.update(top_k=job.top_k, min_p=job.min_p, rep_pen=job.rep_pen)
    if job.seed is not None:
        body["seed"] = job.seed
    if job.stop:
        body["stop"] = job.stop
    if job.reasoning_effort is not None:
        body["reasoning_effort"] = job.reasoning_effort
    if job.tools:
        body["tools"] = job.tools
        choice = map_tool_choice(flavor, job)
        if choice is not None:
            body["tool_choice"] = choice
        if flavor == LLAMA_SERVER:
            body["parallel_tool_calls"] = job.parallel_tool_calls is not False
        elif flavor in (VLLM, GENERIC) and job.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = job.parallel_tool_calls
    rf = map_response_format(flavor, job.response_format)
    if rf is not None:
        body["response_format"] = rf
    return body


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def parse_chat_response(data: dict[str, Any]) -> ChatOutput:
    """A ``chat.completion`` body → :class:`ChatOutput`.

    Reasoning comes from ``reasoning_content`` (llama-server, vLLM < 0.11) or ``reasoning`` (vLLM ≥ 0.11,
    Ollama); ``<think>`` left in content is split later. Counts come from ``usage`` (``reasoning_tokens`` from
    ``completion_tokens_details``) and are ``None`` when absent. Raises :class:`BackendFault`
    ``generation_error`` on a body without a choice.
    """
    choices = data.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        raise BackendFault(ChatFaultReason.generation_error.value, "response without choices")
    choice = choices[0]
    msg = choice.get("message") or {}
    reasoning = msg.get("reasoning_content") or msg.get("reasoning") or None
    calls = msg.get("tool_calls") or []
    usage = data.get("usage") or {}
    details = usage.get("completion_tokens_details") or {}
    return ChatOutput(
        content=msg.get("content"),
        tool_calls=[c for c in calls if isinstance(c, dict)],
        reasoning=reasoning if isinstance(reasoning, str) else None,
        native_finish_reason=choice.get("finish_reason"),
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        reasoning_tokens=_int_or_none(details.get("reasoning_tokens")) if isinstance(details, dict) else None,
    )


class ChatStreamAccumulator:
    """Reads the ``chat.completion.chunk`` events of a streamed reply and builds the same
    :class:`ChatOutput` :func:`parse_chat_response` builds from a whole one.

    :meth:`feed` takes one decoded event and returns the text it carries as a :class:`ChatDelta` (``None``
    without text). Tool call fragments are accumulated by ``index`` (a fragment without one continues the
    call with its ``id``, or the last call): the name is taken from the first fragment that has one, the
    arguments are concatenated. ``usage`` is read from whichever chunk carries it (the last one, with
    ``stream_options.include_usage``). :meth:`output` raises :class:`BackendFault` ``generation_error`` when the
    stream carried no choice.
    """

    def __init__(self) -> None:
        self.content: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}
        self.chunks = 0
        self.saw_choice = False

    def feed(self, event: dict[str, Any]) -> ChatDelta | None:
        self.chunks += 1
        error = event.get("error")
        if error:
            raise stream_error_fault(error)
        usage = event.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        choices = event.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        self.saw_choice = True
        choice = choices[0]
        delta = choice.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        if choice.get("finish_reason"):
            self.finish_reason = str(choice["finish_reason"])
        content = delta.get("content")
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        for fragment in delta.get("tool_calls") or []:
            if isinstance(fragment, dict):
                self._add_call(fragment)
        out = ChatDelta(
            content=content if isinstance(content, str) else "",
            reasoning=reasoning if isinstance(reasoning, str) else "",
        )
        if out.content:
            self.content.append(out.content)
        if out.reasoning:
            self.reasoning.append(out.reasoning)
        return out if out.content or out.reasoning else None

    def _add_call(self, fragment: dict[str, Any]) -> None:
        index = fragment.get("index")
        call_id = fragment.get("id")
        if not isinstance(index, int) or isinstance(index, bool):
            known = [i for i, c in self.calls.items() if call_id and c["id"] == call_id]
            if known:
                index = known[0]
            elif call_id or not self.calls:
                index = max(self.calls, default=-1) + 1
            else:
                index = max(self.calls)
        call = self.calls.setdefault(index, {"id": None, "type": "function", "name": None, "arguments": []})
        if isinstance(call_id, str) and call_id and not call["id"]:
            call["id"] = call_id
        fn = fragment.get("function")
        if not isinstance(fn, dict):
            return
        name = fn.get("name")
        if isinstance(name, str) and name and not call["name"]:
            call["name"] = name
        args = fn.get("arguments")
        if isinstance(args, str):
            call["arguments"].append(args)
        elif args is not None:
            call["arguments"].append(json.dumps(args, ensure_ascii=False, separators=(",", ":")))

    def tool_calls(self) -> list[dict[str, Any]]:
        """The accumulated calls in index order, OpenAI-shaped (``arguments`` a string)."""
        calls = []
        for index in sorted(self.calls):
            c = self.calls[index]
            call: dict[str, Any] = {
                "type": "function",
                "function": {"name": c["name"], "arguments": "".join(c["arguments"])},
            }
            if c["id"]:
                call["id"] = c["id"]
            calls.append(call)
        return calls

    def output(self) -> ChatOutput:
        if not self.saw_choice:
            raise BackendFault(ChatFaultReason.generation_error.value, "stream without choices")
        calls = self.tool_calls()
        content = "".join(self.content) if self.content or not calls else None
        details = self.usage.get("completion_tokens_details") or {}
        return ChatOutput(
            content=content,
            tool_calls=calls,
            reasoning="".join(self.reasoning) or None,
            native_finish_reason=self.finish_reason,
            prompt_tokens=_int_or_none(self.usage.get("prompt_tokens")),
            completion_tokens=_int_or_none(self.usage.get("completion_tokens")),
            reasoning_tokens=_int_or_none(details.get("reasoning_tokens"))
            if isinstance(details, dict)
            else None,
        )


#: The data of the event that ends an OpenAI stream.
SSE_DONE = "[DONE]"


async def iter_sse(lines: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """The data of each server-sent event in ``lines`` (multi-line data joined by newlines); an ``error:``
    line (llama-server's older in-stream errors) is passed on as ``{"error": ...}``. The ``[DONE]`` event is
    yielded as :data:`SSE_DONE`, and nothing after it."""
    data: list[str] = []
    async for raw in lines:
        line = raw.rstrip("\r")
        if not line:
            if data:
                event = "\n".join(data)
                data.clear()
                if event.strip() == SSE_DONE:
                    yield SSE_DONE
                    return
                yield event
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            data.append(value)
        elif field == "error":
            yield json.dumps({"error": _loads_or_text(value)})
    if data:
        event = "\n".join(data)
        yield SSE_DONE if event.strip() == SSE_DONE else event


def _loads_or_text(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def stream_error_fault(error: Any) -> BackendFault:
    """The fault for an error event inside a stream (mapped as :func:`fault_for_error` maps an answer)."""
    code = error.get("code") if isinstance(error, dict) else None
    status = code if isinstance(code, int) and 400 <= code < 600 else 500
    text = json.dumps(error) if not isinstance(error, str) else error
    return fault_for_error(status, text)


_OVERFLOW = re.compile(
    r"exceed_context_size|context_length_exceeded|maximum context length|max_model_len|exceeds? (the )?"
    r"(available )?context|context window|prompt is too long|too many tokens",
    re.IGNORECASE,
)
_GRAMMAR = re.compile(r"grammar|json.?schema|xgrammar|guided|outlines|response_format", re.IGNORECASE)


def fault_for_error(status: int, body: str) -> BackendFault:
    """Map a server error answer to a fault: an over-long prompt → ``prompt_overflow``; a grammar or schema
    the server cannot build → ``unbuildable_grammar``; anything else → ``generation_error``."""
    if status in (400, 413, 422, 500) and _OVERFLOW.search(body):
        return BackendFault(ChatFaultReason.prompt_overflow.value, f"{status}: {body[:200]}")
    if status in (400, 422, 500) and _GRAMMAR.search(body):
        return BackendFault(ChatFaultReason.unbuildable_grammar.value, f"{status}: {body[:200]}")
    return BackendFault(ChatFaultReason.generation_error.value, f"{status}: {body[:200]}")


def build_text_request(flavor: str, job: TextJob, model: str | None, max_length: int) -> dict[str, Any]:
    """The ``POST /v1/completions`` body for a legacy text job, mapped from its KoboldAI sampler fields."""
    body: dict[str, Any] = {
        "model": model or "default",
        "prompt": job.prompt,
        "max_tokens": max_length,
        "temperature": float(job.param("temperature", 0.7)),
        "top_p": float(job.param("top_p", 1.0)),
        "stream": False,
    }
    stop = job.param("stop_sequence", [])
    if isinstance(stop, list) and stop:
        body["stop"] = [s for s in stop if isinstance(s, str) and s][: 4 if flavor == VLLM else 16]
    seed = job.payload.get("sampler_seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        body["seed"] = seed
    top_k = int(job.param("top_k", 0))
    rep_pen = float(job.param("rep_pen", 1.0))
    min_p = float(job.param("min_p", 0.0))
    if flavor in (LLAMA_SERVER, LLAMA_CPP_PYTHON):
        body.update(top_k=top_k, min_p=min_p, repeat_penalty=rep_pen)
    elif flavor == VLLM:
        body.update(top_k=top_k if top_k > 0 else -1, min_p=min_p, repetition_penalty=rep_pen)
    elif flavor == KOBOLDCPP:
        body.update(top_k=top_k, min_p=min_p, rep_pen=rep_pen)
    return body


def flatten_for_count(job: ChatJob) -> str:
    """The messages as ``role: text`` lines plus the tools' JSON: what koboldcpp's token counter reads."""
    lines = [f"{m.get('role', '')}: {message_text(m)}" for m in job.messages]
    if job.tools:
        lines.append(json.dumps(job.tools, separators=(",", ":")))
    return "\n".join(lines)


#: Tokens added per message to koboldcpp's count of the flattened text, for the template's turn markers.
KCPP_TURN_OVERHEAD = 8


class OpenAIBackend(Backend):
    """Drives an OpenAI-compatible server at ``base_url`` (with or without ``/v1``).

    ``flavor`` is one of :data:`FLAVORS` or ``"auto"`` (probe the server). ``model`` is the name sent in the
    ``model`` field (discovered when ``None``). ``api_key`` is sent as a bearer token when set.
    """

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        flavor: str = "auto",
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = TEXT_JOB_LEASE_SECONDS + 30,
        retries: int = 3,
        retry_delay: float = 2.0,
    ) -> None:
        self.root = root_url(base_url)
        self.flavor = flavor
        self.model = model
        self.retries = retries
        self.retry_delay = retry_delay
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), headers=headers)
        self.discovery = Discovery()

    async def _get_json(self, path: str) -> Any:
        return await self._json("GET", path, None, 10.0)

    async def _post_json(self, path: str, body: dict[str, Any]) -> Any:
        return await self._json("POST", path, body, 30.0)

    async def _json(self, method: str, path: str, body: dict[str, Any] | None, seconds: float) -> Any:
        """The JSON answer of a discovery call, or None for any failure (discovery only probes)."""
        try:
            resp = await self.client.request(method, self.root + path, json=body, timeout=seconds)
        except httpx.HTTPError:
            return None
        if resp.status_code != 200:
            return None
        try:
            return resp.json()
        except ValueError:
            return None

    async def discover(self) -> Discovery:
        """Probe the server: flavor, model name, context and output limits (worker/README.md)."""
        d = Discovery(flavor=self.flavor if self.flavor != "auto" else GENERIC)
        kcpp = await self._get_json("/api/extra/version")
        props = await self._get_json("/props")
        models = await self._get_json("/v1/models")
        first = (models or {}).get("data", [{}])[0] if isinstance(models, dict) and models.get("data") else {}
        if self.flavor == "auto":
            if isinstance(kcpp, dict) and str(kcpp.get("result", "")).lower().startswith("koboldcpp"):
                d.flavor = KOBOLDCPP
            elif isinstance(props, dict) and "default_generation_settings" in props:
                d.flavor = LLAMA_SERVER
            elif isinstance(await self._get_json("/api/version"), dict):
                d.flavor = OLLAMA
            elif first.get("owned_by") == "vllm":
                d.flavor = VLLM
            elif first.get("owned_by") == "me":  # llama-cpp-python's server
                d.flavor = LLAMA_CPP_PYTHON
        d.model_name = first.get("id") or None
        if d.flavor == KOBOLDCPP:
            model = await self._get_json("/api/v1/model")
            ctx = await self._get_json("/api/extra/true_max_context_length")
            length = await self._get_json("/api/v1/config/max_length")
            d.model_name = (model or {}).get("result") or d.model_name
            d.max_context_length = _int_or_none((ctx or {}).get("value"))
            d.max_length = _int_or_none((length or {}).get("value"))
        elif d.flavor == LLAMA_SERVER and isinstance(props, dict):
            settings = props.get("default_generation_settings") or {}
            d.max_context_length = _int_or_none(settings.get("n_ctx"))
            if props.get("model_alias"):
                d.model_name = props["model_alias"]
        elif d.flavor == VLLM:
            d.max_context_length = _int_or_none(first.get("max_model_len"))
        elif d.flavor == OLLAMA and d.model_name:
            show = await self._post_json("/api/show", {"model": self.model or d.model_name})
            if isinstance(show, dict):
                info = show.get("model_info") or {}
                ctx = next((v for k, v in info.items() if k.endswith(".context_length")), None)
                d.max_context_length = _int_or_none(ctx)
                d.ollama_capabilities = list(show.get("capabilities") or [])
        return d

    async def start(self) -> Capabilities:
        """Wait for the server to answer ``/v1/models``, discover it and return its capabilities.

        Raises ``RuntimeError`` when the server does not answer within about a minute.
        """
        for _ in range(60):
            if await self._get_json("/v1/models") is not None:
                break
            await asyncio.sleep(1.0)
        else:
            raise RuntimeError(f"no OpenAI-compatible server answers at {self.root}/v1/models")
        self.discovery = await self.discover()
        self.flavor = self.discovery.flavor
        if self.model is None:
            self.model = self.discovery.model_name
        log.info(
            "openai backend: flavor %s, model %s, ctx %s",
            self.flavor,
            self.model,
            self.discovery.max_context_length,
        )
        return capabilities_for(self.discovery)

    async def count_prompt_tokens(self, job: ChatJob) -> int | None:
        """Tokens of the rendered prompt where the server can count them, else ``None``.

        llama-server: ``/apply-template`` then ``/tokenize`` (exact). koboldcpp: ``/api/extra/tokencount`` on
        the flattened messages plus a per-turn allowance (its template is not exposed).
        """
        if self.flavor == LLAMA_SERVER:
            rendered = await self._post_json(
                "/apply-template", {"messages": job.messages, "tools": job.tools or []}
            )
            if not isinstance(rendered, dict) or not isinstance(rendered.get("prompt"), str):
                return None
            tokens = await self._post_json("/tokenize", {"content": rendered["prompt"], "add_special": True})
            if isinstance(tokens, dict) and isinstance(tokens.get("tokens"), list):
                return len(tokens["tokens"])
            return None
        if self.flavor == KOBOLDCPP:
            count = await self._post_json("/api/extra/tokencount", {"prompt": flatten_for_count(job)})
            if isinstance(count, dict) and _int_or_none(count.get("value")) is not None:
                return int(count["value"]) + KCPP_TURN_OVERHEAD * len(job.messages)
        return None

    async def _post_generation(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        last: BackendFault | None = None
        for attempt in range(self.retries):
            try:
                resp = await self.client.post(self.root + path, json=body)
            except httpx.HTTPError as exc:
                last = BackendFault(ChatFaultReason.generation_error.value, f"backend unreachable: {exc!r}")
            else:
                if resp.status_code == 200:
                    try:
                        return dict(resp.json())
                    except ValueError:
                        last = BackendFault(
                            ChatFaultReason.generation_error.value, "backend answered non-JSON"
                        )
                elif resp.status_code in (502, 503, 504):  # loading or busy: worth another try
                    last = BackendFault(
                        ChatFaultReason.generation_error.value, f"backend busy {resp.status_code}"
                    )
                else:
                    raise fault_for_error(resp.status_code, resp.text)
            if attempt + 1 < self.retries:
                await asyncio.sleep(self.retry_delay)
        assert last is not None
        raise last

    async def _check_prompt(self, job: ChatJob) -> None:
        count = await self.count_prompt_tokens(job)
        if count is not None and count > job.max_context_length - job.max_length:
            raise BackendFault(
                ChatFaultReason.prompt_overflow.value,
                f"{count} prompt tokens do not fit {job.max_context_length} - {job.max_length}",
            )

    async def generate_chat(self, job: ChatJob) -> ChatOutput:
        """Count the prompt where possible (``prompt_overflow`` before generating), then ask the server."""
        await self._check_prompt(job)
        data = await self._post_generation(
            "/v1/chat/completions", build_chat_request(self.flavor, job, self.model)
        )
        return parse_chat_response(data)

    @asynccontextmanager
    async def _open_stream(self, path: str, body: dict[str, Any]) -> AsyncGenerator[httpx.Response, None]:
        """POST a streamed request and yield the open 200 response (closed on exit, which aborts the
        generation). Retried like :meth:`_post_generation` until the server answers 200."""
        last: BackendFault | None = None
        for attempt in range(self.retries):
            request = self.client.build_request("POST", self.root + path, json=body)
            try:
                resp = await self.client.send(request, stream=True)
            except httpx.HTTPError as exc:
                last = BackendFault(ChatFaultReason.generation_error.value, f"backend unreachable: {exc!r}")
            else:
                if resp.status_code == 200:
                    try:
                        yield resp
                    finally:
                        await resp.aclose()
                    return
                try:
                    text = (await resp.aread()).decode("utf-8", "replace")
                except httpx.HTTPError:
                    text = ""
                finally:
                    await resp.aclose()
                if resp.status_code in (502, 503, 504):
                    last = BackendFault(
                        ChatFaultReason.generation_error.value, f"backend busy {resp.status_code}"
                    )
                else:
                    raise fault_for_error(resp.status_code, text)
            if attempt + 1 < self.retries:
                await asyncio.sleep(self.retry_delay)
        assert last is not None
        raise last

    async def stream_chat(self, job: ChatJob) -> AsyncGenerator[ChatDelta | ChatOutput, None]:
        """Count the prompt as :meth:`generate_chat` does, then stream the reply (module docstring)."""
        await self._check_prompt(job)
        body = build_chat_request(self.flavor, job, self.model, stream=True)
        acc = ChatStreamAccumulator()
        async with self._open_stream("/v1/chat/completions", body) as resp:
            if "text/event-stream" not in resp.headers.get("content-type", ""):
                try:
                    data = json.loads(await resp.aread())
                except (ValueError, httpx.HTTPError) as exc:
                    raise BackendFault(
                        ChatFaultReason.generation_error.value,
                        f"backend answered neither SSE nor JSON: {exc!r}",
                    ) from None
                if not isinstance(data, dict):
                    raise BackendFault(ChatFaultReason.generation_error.value, "backend answered non-JSON")
                yield parse_chat_response(data)
                return
            done = False
            try:
                async for event in iter_sse(resp.aiter_lines()):
                    if event == SSE_DONE:
                        done = True
                        break
                    try:
                        chunk = json.loads(event)
                    except ValueError:
                        log.warning("openai backend: skipped a stream event that is not JSON: %.200s", event)
                        continue
                    if not isinstance(chunk, dict):
                        continue
                    delta = acc.feed(chunk)
                    if delta is not None:
                        yield delta
            except httpx.HTTPError as exc:
                raise BackendFault(
                    ChatFaultReason.generation_error.value, f"backend stream broke: {exc!r}"
                ) from None
        if not done and acc.finish_reason is None:  # neither [DONE] nor a finish: the server broke off
            raise BackendFault(ChatFaultReason.generation_error.value, "backend stream ended early")
        yield acc.output()

    async def generate_text(self, job: TextJob, max_length: int) -> str:
        """``POST /v1/completions`` with the job's prompt; returns ``choices[0].text``."""
        body = build_text_request(self.flavor, job, self.model, max_length)
        data = await self._post_generation("/v1/completions", body)
        choices = data.get("choices") or []
        if not choices:
            raise BackendFault(ChatFaultReason.generation_error.value, "completion without choices")
        return str(choices[0].get("text") or "")

    async def close(self) -> None:
        await self.client.aclose()
