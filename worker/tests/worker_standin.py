"""Minimal stand-ins for the worker's tests: a horde and an OpenAI-compatible backend, real HTTP servers on
loopback sockets.

:class:`StandInHorde` serves ``POST /api/v2/generate/text/pop``, ``/submit`` and ``/progress`` (and the
``/v2/...`` spellings) from a script:
queued jobs are handed out one per pop, every pop and submit is recorded, and submit answers can be scripted
per job (status and body in order; afterwards 200). Like the real submit service it refuses a chat reply whose
shape breaks docs/native-api.md#submit (400 ``ChatSubmitInvalid``), or whose model_id is not the assigned one (400
``ChatModelMismatch``), and answers a submit for a job it never handed out with 404. Progress posts follow the
real route's rules (docs/native-api.md#progress): seq from 1, a repeat of the last post answered again, 409
``ChatProgressOutOfSequence`` with ``expected_seq``, 413 at the entry/byte cap, 404 ``ChatProgressNotStreaming``
for a job without the hint or already submitted, 404 ``ChatJobAborted`` for an aborted job, ``cancelled: true``
once :meth:`StandInHorde.cancel` was called (and a later submit is 400 ``AbortedGen``). It is not the horde:
the lead's e2e tests run the worker against the real services.

:class:`StandInBackend` plays llama-server for the openai backend: discovery, the prompt count, and
``/v1/chat/completions`` answered whole or, with ``stream: true``, as server-sent events from a script, paced,
recording whether the client hung up before the end.
"""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

MAX_CHAT_TEXT_BYTES = 1024 * 1024
FINISH = {"stop", "length", "content_filter", "tool_calls"}
PROGRESS_BYTES_PER_TOKEN = 16


def chat_job(job_id: str, text: str, **payload: Any) -> dict[str, Any]:
    """A chat pop response for one user message, with every sampler field present (spec defaults)."""
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": text}],
        "temperature": 1.0,
        "top_p": 1.0,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "rep_pen": 1.0,
        "top_k": 0,
        "min_p": 0,
        "max_length": 64,
        "max_context_length": 1024,
        "n": 1,
    }
    body.update(payload)
    return {
        "id": job_id,
        "ids": [job_id],
        "payload": body,
        "model": None,
        "ttl": 150,
        "chat": True,
        "skipped": {},
    }


def text_job(job_id: str, prompt: str, **payload: Any) -> dict[str, Any]:
    """A legacy text pop response (no ``chat`` key)."""
    body = {"prompt": prompt, "n": 1, "temperature": 0.7, "max_length": 32}
    body.update(payload)
    return {"id": job_id, "ids": [job_id], "payload": body, "model": None, "ttl": 150, "skipped": {}}


def _refusal(body: dict[str, Any], assigned_model: str | None) -> tuple[str, str] | None:
    """``(rc, message)`` when the real submit would refuse this chat reply's shape, else ``None``."""
    msg = body.get("message")
    if not isinstance(msg, dict) or msg.get("role") != "assistant":
        return "ChatSubmitInvalid", "message must be an assistant message"
    if "generation" in body:
        return "ChatSubmitInvalid", "generation beside message"
    if body.get("finish_reason") not in FINISH:
        return "ChatSubmitInvalid", "finish_reason"
    calls = msg.get("tool_calls") or []
    if msg.get("content") is None and not calls:
        return "ChatSubmitInvalid", "content may be null only with tool_calls"
    if body["finish_reason"] == "tool_calls" and not calls:
        return "ChatSubmitInvalid", "tool_calls finish without calls"
    if len({c.get("id") for c in calls}) != len(calls):
        return "ChatSubmitInvalid", "duplicate tool call ids"
    if len(str(msg.get("reasoning_content") or "").encode()) > MAX_CHAT_TEXT_BYTES:
        return "ChatSubmitInvalid", "reasoning_content over 1 MiB"
    if len(str(body.get("native_finish_reason") or "")) > 32:
        return "ChatSubmitInvalid", "native_finish_reason over 32 characters"
    if assigned_model is not None and body.get("model_id") != assigned_model:
        return "ChatModelMismatch", "model_id is not the assigned model"
    return None


class StandInHorde:
    """The stand-in server; use as a context manager or call :meth:`start`/:meth:`stop`.

    ``jobs``: pop responses to hand out in order. ``submit_script[job_id]``: ``(status, body)`` answers for
    that job's submits, in order (a status of ``0`` closes the connection without an answer). ``pop_status``:
    answers for the next pops (same form). ``progress_script[job_id]``: answers for that job's progress posts
    (status ``0``: close without an answer and without recording the delta; ``-1``: accept by the rules, then
    close without an answer). ``progress_delay``: seconds each progress answer waits; ``progress_max_entries``:
    the entry cap; ``on_progress(horde, record)``: called after each progress post (under the lock). Records:
    ``pops`` (``{"body", "headers", "at"}``), ``submits`` (``{"body", "status", "at"}``), ``progress``
    (``{"body", "status", "answer", "at"}``).
    """

    def __init__(self) -> None:
        self.jobs: deque[dict[str, Any]] = deque()
        self.submit_script: dict[str, deque[tuple[int, dict[str, Any]]]] = {}
        self.pop_script: deque[tuple[int, dict[str, Any]]] = deque()
        self.pops: list[dict[str, Any]] = []
        self.submits: list[dict[str, Any]] = []
        self.assigned: dict[str, dict[str, Any]] = {}
        self.documents: dict[str, tuple[bytes, dict[str, str]]] = {}
        self.progress: list[dict[str, Any]] = []
        self.progress_script: dict[str, deque[tuple[int, dict[str, Any]]]] = {}
        self.progress_state: dict[str, dict[str, Any]] = {}
        self.progress_delay = 0.0
        self.progress_max_entries = 1000
        self.on_progress: Callable[[StandInHorde, dict[str, Any]], None] | None = None
        self.cancelled: set[str] = set()
        self.aborted: set[str] = set()
        self.lock = threading.RLock()  # predicates of wait_for read through the locked helpers
        self.changed = threading.Condition(self.lock)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                doc = outer.documents.get(self.path)
                if doc is None:
                    self._send(404, {"message": "not found", "rc": "NotFound"})
                    return
                data, headers = doc
                self.send_response(200)
                for key, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                try:
                    body = json.loads(self.rfile.read(length) or b"{}")
                except ValueError:
                    self._send(400, {"message": "body is not JSON", "rc": "BadRequest"})
                    return
                path = self.path.split("?", 1)[0].removeprefix("/api")
                if path == "/v2/generate/text/pop":
                    status, answer = outer._pop(body, dict(self.headers))
                elif path == "/v2/generate/text/submit":
                    status, answer = outer._submit(body)
                elif path == "/v2/generate/text/progress":
                    if outer.progress_delay:
                        time.sleep(outer.progress_delay)
                    status, answer = outer._progress(body)
                else:
                    status, answer = 404, {"message": "not found", "rc": "NotFound"}
                if status <= 0:  # drop the connection: the client sees no answer
                    self.close_connection = True
                    self.connection.close()
                    return
                self._send(status, answer)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> Self:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def add(self, *jobs: dict[str, Any]) -> None:
        with self.lock:
            self.jobs.extend(jobs)

    def serve(self, path: str, data: bytes, headers: dict[str, str] | None = None) -> str:
        """Serve ``data`` at ``GET path`` (e.g. an offloaded messages array); returns its URL."""
        self.documents[path] = (data, headers or {})
        return self.url + path

    def script_submit(self, job_id: str, *answers: tuple[int, dict[str, Any]]) -> None:
        with self.lock:
            self.submit_script.setdefault(job_id, deque()).extend(answers)

    def _pop(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        with self.changed:
            self.pops.append({"body": body, "headers": headers, "at": time.monotonic()})
            self.changed.notify_all()
            if self.pop_script:
                return self.pop_script.popleft()
            if not self.jobs:
                return 200, {"payload": {}, "id": None, "ids": [], "skipped": {}}
            job = dict(self.jobs.popleft())
            if job.get("chat"):
                job["model"] = body.get("model_id")
            payload = job.get("payload") or {}
            self.assigned[job["id"]] = {
                "model": body.get("model_id"),
                "chat": bool(job.get("chat")),
                "stream": payload.get("stream_progress") is True,
                "max_length": int(payload.get("max_length") or 512),
            }
            return 200, job

    def _submit(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.changed:
            job_id = str(body.get("id"))
            script = self.submit_script.get(job_id)
            if script:
                status, answer = script.popleft()
            elif job_id not in self.assigned:
                status, answer = 404, {"message": "no such job", "rc": "InvalidJobID"}
            elif job_id in self.cancelled or job_id in self.aborted:
                status, answer = 400, {"message": f"{job_id} was aborted", "rc": "AbortedGen"}
            elif body.get("state") == "faulted":
                status, answer = 200, {"reward": 0}
                self.assigned[job_id]["faulted"] = True
            elif self.assigned[job_id]["chat"]:
                refusal = _refusal(body, self.assigned[job_id]["model"])
                status, answer = (
                    (400, {"message": refusal[1], "rc": refusal[0]}) if refusal else (200, {"reward": 1})
                )
            else:
                ok = isinstance(body.get("generation"), str) and "message" not in body
                status, answer = (
                    (200, {"reward": 1}) if ok else (400, {"message": "bad text submit", "rc": "BadRequest"})
                )
            if status == 200 and job_id in self.assigned:
                self.assigned[job_id]["submitted"] = True
            self.submits.append({"body": body, "status": status, "at": time.monotonic()})
            self.changed.notify_all()
            return status, answer

    # -- progress -----------------------------------------------------------------------------------------

    def cancel(self, job_id: str) -> None:
        """The client cancelled the request: the next post answers ``cancelled: true``, a submit AbortedGen."""
        with self.changed:
            self.cancelled.add(job_id)

    def script_progress(self, job_id: str, *answers: tuple[int, dict[str, Any]]) -> None:
        with self.lock:
            self.progress_script.setdefault(job_id, deque()).extend(answers)

    def _progress(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.changed:
            job_id = str(body.get("id"))
            script = self.progress_script.get(job_id)
            if script:
                status, answer = script.popleft()
                if status == -1:  # accepted, then the answer is lost
                    answer = self._progress_rules(job_id, body)[1]
            else:
                status, answer = self._progress_rules(job_id, body)
            record = {"body": body, "status": status, "answer": answer, "at": time.monotonic()}
            self.progress.append(record)
            if self.on_progress is not None:
                self.on_progress(self, record)
            self.changed.notify_all()
            return status, answer

    def _progress_rules(self, job_id: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        info = self.assigned.get(job_id)
        if info is None or job_id in self.aborted or info.get("faulted"):
            return 404, {"message": f"Generation {job_id} was aborted.", "rc": "ChatJobAborted"}
        if not info.get("stream") or info.get("submitted"):
            return 404, {"message": f"{job_id} does not stream progress.", "rc": "ChatProgressNotStreaming"}
        delta: dict[str, Any] = body["delta"] if isinstance(body.get("delta"), dict) else {}
        content = str(delta.get("content") or "")
        reasoning = str(delta.get("reasoning_content") or "")
        if not content and not reasoning:
            return 400, {
                "message": "The delta carries neither content nor reasoning_content.",
                "rc": "BadRequest",
            }
        state = self.progress_state.setdefault(
            job_id,
            {"last_seq": 0, "last_content": "", "last_reasoning": "", "bytes": 0, "entries": []},
        )
        seq = body.get("seq")
        last = int(state["last_seq"])
        cancelled = job_id in self.cancelled
        if seq == last and last > 0:
            if content == state["last_content"] and reasoning == state["last_reasoning"]:
                return 200, {"accepted_seq": seq, "cancelled": cancelled}
            return self._out_of_sequence(seq, last + 1)
        if seq != last + 1:
            return self._out_of_sequence(seq, last + 1)
        size = len(content.encode()) + len(reasoning.encode())
        cap = PROGRESS_BYTES_PER_TOKEN * int(info["max_length"])
        if last >= self.progress_max_entries or state["bytes"] + size > cap:
            return 413, {"message": "progress cap reached", "rc": "ChatProgressCapReached"}
        state.update(
            last_seq=seq, last_content=content, last_reasoning=reasoning, bytes=state["bytes"] + size
        )
        if not cancelled:
            state["entries"].append({"seq": seq, "content": content, "reasoning": reasoning})
        return 200, {"accepted_seq": seq, "cancelled": cancelled}

    @staticmethod
    def _out_of_sequence(seq: Any, expected: int) -> tuple[int, dict[str, Any]]:
        return 409, {
            "message": f"seq {seq} is out of sequence; the next post is seq {expected}.",
            "rc": "ChatProgressOutOfSequence",
            "expected_seq": expected,
        }

    def streamed(self, job_id: str) -> tuple[str, str]:
        """``(content, reasoning)``: the accepted deltas of a job, joined in seq order."""
        with self.lock:
            entries = self.progress_state.get(job_id, {}).get("entries", [])
            return "".join(e["content"] for e in entries), "".join(e["reasoning"] for e in entries)

    def progress_for(self, job_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [p for p in self.progress if str(p["body"].get("id")) == job_id]

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> bool:
        """Block until ``predicate(self)`` holds (checked on every pop and submit); False on timeout."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not predicate(self):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(left)
            return True

    def submits_for(self, job_id: str) -> list[dict[str, Any]]:
        with self.lock:
            return [s for s in self.submits if str(s["body"].get("id")) == job_id]

    def final(self, job_id: str) -> dict[str, Any]:
        """The body of the last submit for a job."""
        return self.submits_for(job_id)[-1]["body"]


# -- the OpenAI-compatible backend ----------------------------------------------------------------------------------


def sse_chunk(
    content: str | None = None,
    reasoning: str | None = None,
    finish: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    reasoning_key: str = "reasoning_content",
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with the given delta fields."""
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta[reasoning_key] = reasoning
    if tool_calls is not None:
        delta["tool_calls"] = tool_calls
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "model": "standin",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(prompt: int, completion: int) -> dict[str, Any]:
    """The last chunk under ``stream_options.include_usage``: no choice, the counts."""
    return {
        "id": "chatcmpl-standin",
        "object": "chat.completion.chunk",
        "choices": [],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }


def text_events(text: str, size: int = 3, finish: str = "stop") -> list[Any]:
    """A reply's content streamed ``size`` characters a chunk, then the finish, usage and ``[DONE]``."""
    events: list[Any] = [sse_chunk(content=text[i : i + size]) for i in range(0, len(text), size)]
    return [*events, sse_chunk(finish=finish), usage_chunk(5, len(events)), "data: [DONE]"]


class StandInBackend:
    """A llama-server stand-in (flavor ``llama-server``; the prompt counts ``prompt_tokens`` tokens).

    ``events``: what ``/v1/chat/completions`` streams when asked with ``stream: true``: dicts are sent as
    ``data: <json>``, strings as they are (a raw line such as ``"data: [DONE]"`` or ``"error: {...}"``), each
    ``delay`` seconds after the previous one. ``answer``: ``(status, body)`` for the non-streamed request or an
    error answer to a streamed one (``None``: stream, or a plain reply). Records: ``requests`` (bodies),
    ``hung_up`` (set when a write failed because the client closed the connection), ``completed`` (streams
    sent to the end), ``sent`` (events written before the end or the hang-up).
    """

    def __init__(self, events: list[Any] | None = None, delay: float = 0.0, prompt_tokens: int = 10) -> None:
        self.events: list[Any] = events if events is not None else text_events("Hello there, streamed.")
        self.delay = delay
        self.prompt_tokens = prompt_tokens
        self.answer: tuple[int, Any] | None = None
        self.requests: list[dict[str, Any]] = []
        self.hung_up = threading.Event()
        self.completed = 0
        self.sent = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: object) -> None:
                pass

            def _json(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path == "/v1/models":
                    self._json(200, {"data": [{"id": "standin-model", "owned_by": "llamacpp"}]})
                elif self.path == "/props":
                    self._json(200, {"default_generation_settings": {"n_ctx": 4096}, "total_slots": 1})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
                if self.path == "/apply-template":
                    self._json(200, {"prompt": json.dumps(body.get("messages"))})
                elif self.path == "/tokenize":
                    self._json(200, {"tokens": list(range(outer.prompt_tokens))})
                elif self.path == "/v1/chat/completions":
                    outer.requests.append(body)
                    if outer.answer is not None:
                        self._json(*outer.answer)
                    elif body.get("stream"):
                        self._stream()
                    else:
                        self._json(200, outer.whole_reply())
                else:
                    self._json(404, {"error": "not found"})

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                outer.send_events(self.wfile)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def send_events(self, wfile: io.BufferedIOBase) -> None:
        """Write the scripted events to a streamed answer, ``delay`` apart, counting them; stops when the
        client hangs up."""
        try:
            for event in self.events:
                if self.delay:
                    time.sleep(self.delay)
                line = event if isinstance(event, str) else "data: " + json.dumps(event)
                wfile.write((line + "\n\n").encode())
                wfile.flush()
                self.sent += 1
        except (BrokenPipeError, ConnectionResetError):
            self.hung_up.set()
            return
        self.completed += 1

    def whole_reply(self) -> dict[str, Any]:
        """The events' content as one ``chat.completion`` body."""
        content = "".join(
            str(((e.get("choices") or [{}])[0].get("delta") or {}).get("content") or "")
            for e in self.events
            if isinstance(e, dict)
        )
        return {
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}
            ],
            "usage": {"prompt_tokens": self.prompt_tokens, "completion_tokens": 1},
        }

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> StandInBackend:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


async def serve(worker: Any, horde: StandInHorde, until: Any, within: float = 10.0) -> None:
    """Run ``worker`` until ``until(horde)`` holds, then stop it and wait for it to end."""
    task = asyncio.create_task(worker.run())
    try:
        ok = await asyncio.to_thread(horde.wait_for, until, within)
    finally:
        worker.request_stop()
        await asyncio.wait_for(task, 10)
    assert ok, f"condition not reached; submits: {[s['body'] for s in horde.submits]}"


async def collect(backend: Any, job: Any) -> tuple[list[Any], Any]:
    """A backend's ``stream_chat`` for ``job``: ``(deltas, final output)``."""
    from horde_worker.jobs import ChatOutput

    deltas: list[Any] = []
    async for item in backend.stream_chat(job):
        if isinstance(item, ChatOutput):
            return deltas, item
        deltas.append(item)
    raise AssertionError("no output")
