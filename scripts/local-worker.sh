#!/usr/bin/env bash
# The reference worker of the local stack: the scripted backend unless HORDE_WORKER_BACKEND says otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source "${LOCAL_STACK_DIR:-.local}/worker.env"
# The one horde URL (the local proxy), as any AI Horde worker takes it; HORDE_WORKER_DISPATCH_URL and
# HORDE_WORKER_SUBMIT_URL, when set, still win.
export HORDE_WORKER_HORDE_URL=${HORDE_WORKER_HORDE_URL:-${LOCAL_STACK_URL:-http://127.0.0.1:7000}}
export HORDE_WORKER_NAME=${HORDE_WORKER_NAME:-local-reference-worker}
export HORDE_WORKER_BACKEND=${HORDE_WORKER_BACKEND:-scripted}
if [ "$HORDE_WORKER_BACKEND" = scripted ]; then export HORDE_WORKER_MODELS=${HORDE_WORKER_MODELS:-scripted/echo}; fi
exec .venv/bin/horde-worker
