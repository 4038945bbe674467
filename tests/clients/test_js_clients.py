"""The JS clients (tests/clients/js, run with node's built-in test runner) against the local stack.

``openai-sdk.test.mjs``: the OpenAI Node SDK (create, streaming, tools, ``chat.completions.parse`` with
``zodResponseFormat`` and ``zodFunction``, models, errors); ``ai-sdk.test.mjs``: the Vercel AI SDK through
``@ai-sdk/openai-compatible`` (generateText, streamText, tools, structured output) and ``@ai-sdk/openai``'s
``.chat(model)`` (its default model call goes to ``/v1/responses``, which the horde does not serve: asserted).
The packages are pinned by tests/clients/js/package-lock.json and installed by tests/clients/js/setup.sh.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from .conftest import Horde

JS = Path(__file__).resolve().parent / "js"


def node() -> str:
    found = shutil.which("node")
    assert found, "node is not on PATH (Node 20 or later; tests/clients/js/setup.sh)"
    return found


def test_js_clients_pass_against_the_horde(horde: Horde) -> None:
    assert (JS / "node_modules" / "openai").is_dir(), "run tests/clients/js/setup.sh (make test-clients does)"
    env = {
        **os.environ,
        "HORDE_FRONT_URL": horde.front,
        "HORDE_API_KEY": horde.api_key,
        "HORDE_MODEL": horde.model,
        "NO_COLOR": "1",
    }
    # One file at a time: each file paces its requests under the horde's 2 chat requests a second per address
    # and key (tests/clients/js/horde.mjs), so the files pass against make run's stack too, limits on.
    run = subprocess.run(
        [node(), "--test", "--test-concurrency=1", "--test-reporter=spec"],
        cwd=JS,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    output = f"{run.stdout}\n{run.stderr}"
    print(output)
    assert run.returncode == 0, f"node --test failed ({run.returncode}):\n{output}"
    # Both files ran and every test passed (the runner's summary, not just its exit code).
    assert "ℹ fail 0" in run.stdout, output
    assert "ℹ skipped 0" in run.stdout and "ℹ todo 0" in run.stdout, output
    passed = next(int(line.split()[-1]) for line in run.stdout.splitlines() if line.startswith("ℹ pass "))
    assert passed >= 16, output
