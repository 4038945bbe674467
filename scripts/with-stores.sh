#!/usr/bin/env bash
# Waits for the local stores (and, with --ready, for the demo users) before exec'ing the command, so the
# Procfile's processes start in order. Sources .local/stores.env for the HORDE_* store URLs (.local:
# $LOCAL_STACK_DIR when set, as horde_testing/local_stack.py sets it).
set -euo pipefail
cd "$(dirname "$0")/.."
local_dir=${LOCAL_STACK_DIR:-.local}
wait_for=$local_dir/stores.env
if [ "${1:-}" = "--ready" ]; then wait_for=$local_dir/ready; shift; fi
for _ in $(seq 1 600); do [ -f "$wait_for" ] && break; sleep 0.2; done
[ -f "$wait_for" ] || { echo "timed out waiting for $wait_for" >&2; exit 1; }
# shellcheck disable=SC1091
source "$local_dir/stores.env"
# The front forwards each client's address to admission with this passkey, so the per-address rate limits
# count the front's clients one by one (spec: Rate limits).
if [ -s "$local_dir/proxy-passkey" ]; then
  passkey=$(cat "$local_dir/proxy-passkey")
  export HORDE_OAI_PROXY_PASSKEY=${HORDE_OAI_PROXY_PASSKEY:-$passkey}
  export HORDE_PROXY_PASSKEYS=${HORDE_PROXY_PASSKEYS:-[\"$passkey\"]}
fi
exec "$@"
