"""A minimal stand-in horde for the worker's tests: a real HTTP server on a loopback socket.

It serves ``POST /api/v2/generate/text/pop`` and ``/submit`` (and the ``/v2/...`` spellings) from a script:
queued jobs are handed out one per pop, every pop and submit is recorded, and submit answers can be scripted
per job (status and body in order; afterwards 200). Like the real submit service it refuses a chat reply whose
shape breaks **Structured submit** (400 ``ChatSubmitInvalid``), or whose model_id is not the assigned one (400
``ChatModelMismatch``), and answers a submit for a job it never handed out with 404. It is not the horde: the
lead's e2e tests run the worker against the real services.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_CHAT_TEXT_BYTES = 1024 * 1024
FINISH = {"stop", "length", "content_filter", "tool_calls"}


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
    answers for the next pops (same form). Records: ``pops`` (``{"body", "headers"}``), ``submits``
    (``{"body", "status", "at"}``).
    """

    def __init__(self) -> None:
        self.jobs: deque[dict[str, Any]] = deque()
        self.submit_script: dict[str, deque[tuple[int, dict[str, Any]]]] = {}
        self.pop_script: deque[tuple[int, dict[str, Any]]] = deque()
        self.pops: list[dict[str, Any]] = []
        self.submits: list[dict[str, Any]] = []
        self.assigned: dict[str, dict[str, Any]] = {}
        self.documents: dict[str, tuple[bytes, dict[str, str]]] = {}
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
                else:
                    status, answer = 404, {"message": "not found", "rc": "NotFound"}
                if status == 0:  # drop the connection: the client sees no answer
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

    def start(self) -> StandInHorde:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> StandInHorde:
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
            self.pops.append({"body": body, "headers": headers})
            self.changed.notify_all()
            if self.pop_script:
                return self.pop_script.popleft()
            if not self.jobs:
                return 200, {"id": None, "ids": [], "skipped": {}}
            job = dict(self.jobs.popleft())
            if job.get("chat"):
                job["model"] = body.get("model_id")
            self.assigned[job["id"]] = {"model": body.get("model_id"), "chat": bool(job.get("chat"))}
            return 200, job

    def _submit(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self.changed:
            job_id = str(body.get("id"))
            script = self.submit_script.get(job_id)
            if script:
                status, answer = script.popleft()
            elif job_id not in self.assigned:
                status, answer = 404, {"message": "no such job", "rc": "InvalidJobID"}
            elif body.get("state") == "faulted":
                status, answer = 200, {"reward": 0}
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
            self.submits.append({"body": body, "status": status, "at": time.monotonic()})
            self.changed.notify_all()
            return status, answer

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
