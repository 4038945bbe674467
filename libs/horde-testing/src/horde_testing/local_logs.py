"""The local stack's console: every process's output on supervisord's standard output, one line at a time,
prefixed as honcho did (``17:44:33 dispatch-1 | …``), so the replicas of a service can be told apart.

A supervisor event listener (``[eventlistener:logs]`` of :mod:`horde_testing.local_stack`, command
``python -m horde_testing.local_logs``) for ``PROCESS_LOG_STDOUT`` events: supervisor hands it each chunk a
process wrote (the programs have ``stdout_events_enabled``); it keeps a partial line per process until its
newline and writes whole lines to its standard error, which supervisord sends to its own standard output. The
protocol (supervisor's "Event Listener Notification Protocol"): ``READY`` on stdout, a header line with
``len:N`` on stdin, N characters of payload (supervisor counts the payload's characters, not its UTF-8
bytes: a line with an emoji would otherwise cut the stream out of step) (``processname:… groupname:… pid:… channel:…`` then the data), then
``RESULT 2\\nOK`` on stdout.
"""

from __future__ import annotations

import io
import sys
import time
from typing import TextIO

#: Width of the name column (``admission-1`` and the like line up).
NAME_WIDTH = 12


def parse_header(line: str) -> dict[str, str]:
    """``"ver:3.0 … len:54"`` as ``{"ver": "3.0", …, "len": "54"}``."""
    return dict(token.split(":", 1) for token in line.split() if ":" in token)


def prefixed(name: str, text: str, stamp: str) -> str:
    """``text`` (whole lines) with ``<stamp> <name> | `` before each line."""
    head = f"{stamp} {name:<{NAME_WIDTH}} | "
    return "".join(head + line + "\n" for line in text.split("\n"))


def serve(stdin: TextIO, stdout: TextIO, out: TextIO) -> None:
    """Answer supervisor's events from ``stdin``/``stdout`` until ``stdin`` ends, writing lines to ``out``."""
    partial: dict[str, str] = {}
    while True:
        stdout.write("READY\n")
        stdout.flush()
        header = stdin.readline()
        if not header:
            break
        fields = parse_header(header)
        payload = stdin.read(int(fields.get("len", "0")))
        meta, _, data = payload.partition("\n")
        if fields.get("eventname", "").startswith("PROCESS_LOG"):
            name = parse_header(meta).get("processname", "?")
            text = partial.pop(name, "") + data
            whole, _, rest = text.rpartition("\n")
            if rest:
                partial[name] = rest
            if "\n" in text:
                out.write(prefixed(name, whole, time.strftime("%H:%M:%S")))
                out.flush()
        stdout.write("RESULT 2\nOK")
        stdout.flush()


def main() -> int:
    """Entry point: serve supervisor on this process's stdin/stdout, lines to stderr."""
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace")
    serve(stdin, sys.stdout, sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
