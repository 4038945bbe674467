#!/usr/bin/env bash
# Creates (once) a demo client and a worker owner, waits for every service to be healthy, prints how to
# use the stack, then stays up (it has nothing more to do; under honcho any process exiting stops the stack).
# horde_testing/local_stack.py sets LOCAL_STACK_* for the replicas it starts (the defaults are one of each).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${LOCAL_STACK_DIR:-.local}
url=${LOCAL_STACK_URL:-http://127.0.0.1:7000}
admin() { uv run --no-sync horde-admin "$@"; }
[ -s "$dir/demo-user.json" ] || admin user create --username demo --kudos 5000 > "$dir/demo-user.json"
[ -s "$dir/worker-user.json" ] || admin user create --username worker-owner --kudos 0 --trusted > "$dir/worker-user.json"
key() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["api_key"])' "$1"; }
DEMO_KEY=$(key "$dir/demo-user.json")
# The model the local worker serves: the scripted echo model, or the real one under make run-llm.
if [ "${HORDE_WORKER_BACKEND:-scripted}" = llamacpp ]; then MODEL=${HORDE_WORKER_MODEL_ID:-gemma-3-270m}
else MODEL=${HORDE_WORKER_MODELS:-scripted/echo}; MODEL=${MODEL%%,*}; fi
printf 'export HORDE_WORKER_API_KEY=%s\n' "$(key "$dir/worker-user.json")" > "$dir/worker.env"
for port in ${LOCAL_STACK_HEALTH_PORTS:-7101 7102 7103 7104 7002}; do
  for _ in $(seq 1 300); do curl -fsS "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 && break; sleep 0.2; done
done
# The local proxy (one URL): any answer will do (its own paths are the services', checked above).
for _ in $(seq 1 300); do curl -sS -o /dev/null "$url/" 2>/dev/null && break; sleep 0.2; done
# The worker starts on this file: after the services answer, so its first pop does not fail to connect.
touch "$dir/ready"
# The snippet runs the checkout's own interpreter by its absolute path: it works as printed from any directory
# and without uv on PATH (tests/test_local_stack.py runs it so).
py=$(printf %q "$PWD/.venv/bin/python")
cat <<MSG

  Horde Chat is up. One URL for workers and clients:  $url
    OpenAI-compatible front   $url/v1      (docs: $url/docs)
    native API                $url/api/v2  (chat/text async, status, models, worker pop/submit)
    behind it, direct         ${LOCAL_STACK_DIRECT:-front :7002, admission :7101, dispatch :7102, submit :7103}
    janitor                   ${LOCAL_STACK_JANITOR:-http://127.0.0.1:7104/metrics}
  Demo API key: $DEMO_KEY    model: $MODEL

  curl $url/v1/chat/completions \\
    -H "Authorization: Bearer $DEMO_KEY" -H "Content-Type: application/json" \\
    -d '{"model": "$MODEL", "messages": [{"role": "user", "content": "Hello, horde!"}]}'

  $py -c 'from openai import OpenAI; c = OpenAI(base_url="$url/v1", api_key="$DEMO_KEY"); print(c.chat.completions.create(model="$MODEL", messages=[{"role": "user", "content": "Hello, horde!"}]).choices[0].message.content)'

MSG
exec sleep infinity
