#!/usr/bin/env bash
# Runs the upstream anchor's load matrix (../shared/bench/anchor, or $HORDE_ANCHOR_DIR) against a running
# `make run` stack started with the limiter off and this folder's model reference:
#   HORDE_RATE_LIMITS_ENABLED=false HORDE_TEXT_MODEL_REFERENCE=bench/anchor/models.json make run
# then: bench/anchor/run.sh [--only async_c8,pop_q10000_w8,...] [--reps N]
# With replicas (make run REPLICAS=2, or REPLICAS_DISPATCH=2 ...), ANCHOR_VIA_PROXY=1 sends the load through the
# one URL (:7000), whose proxy balances over the replicas, and watches every replica's process.
# Writes one JSON per run into .local/anchor-out/<timestamp>/ and prints the summary table.
set -euo pipefail
cd "$(dirname "$0")/../.."
ANCHOR=${HORDE_ANCHOR_DIR:-$(cd .. && pwd)/shared/bench/anchor}
[ -f "$ANCHOR/run_matrix.py" ] || { echo "no anchor scripts at $ANCHOR (set HORDE_ANCHOR_DIR)" >&2; exit 1; }
[ -f .local/stores.env ] || { echo "start the stack first (make run)" >&2; exit 1; }
# shellcheck disable=SC1091
set -a; source .local/stores.env; set +a
admin() { .venv/bin/horde-admin "$@"; }
key() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["api_key"])' "$1"; }
# A key that starts with "-" would read as an option to the anchor's argument parser: rotate until none does.
user() {  # user FILE USERNAME ARGS...
  local file=$1 name=$2; shift 2
  until [ -s "$file" ] && [ "$(key "$file" | cut -c1)" != - ]; do
    admin user create --username "$name" --rotate-if-exists "$@" > "$file"
  done
}
user .local/bench-req.json bench-req --kudos 50000000 --trusted --concurrency 100000
user .local/bench-wrk.json bench-wrk --kudos 0 --trusted
REQ=$(key .local/bench-req.json); WRK=$(key .local/bench-wrk.json)
# The pop cells never submit: the janitor counts their lapsed jobs as dropped, and a worker that drops too many
# within an hour is put into maintenance, which would refuse every later pop of the benchmark's workers.
cat > .local/anchor-reset.sh <<RESET
#!/usr/bin/env bash
psql -q "$HORDE_DATABASE_URL" -c "DELETE FROM processing_gens" -c "DELETE FROM waiting_prompts" -c "VACUUM ANALYZE waiting_prompts" \
  -c "UPDATE workers SET maintenance = false, maintenance_msg = NULL, aborted_jobs = 0 WHERE name LIKE 'bench-worker-%'"
RESET
chmod +x .local/anchor-reset.sh
pid_on() { ss -Hltnp "sport = :$1" | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1; }
PG=$(pid_on "$(python3 -c 'import sys,urllib.parse; print(urllib.parse.urlsplit(sys.argv[1]).port or 5432)' "$HORDE_DATABASE_URL")")
OUT=.local/anchor-out/$(date +%Y%m%dT%H%M%S)
mkdir -p "$OUT"
BASE=http://127.0.0.1:7101,http://127.0.0.1:7102,http://127.0.0.1:7103
WATCH=(--watch "app1:$(pid_on 7101)" --watch "app2:$(pid_on 7102)" --watch "app3:$(pid_on 7103)")
if [ "${ANCHOR_VIA_PROXY:-0}" = 1 ]; then
  BASE=http://127.0.0.1:7000,http://127.0.0.1:7000,http://127.0.0.1:7000
  WATCH=()
  for port in 7101 7102 7103 7111 7112 7113 7121 7122 7123; do
    pid=$(pid_on "$port"); [ -n "$pid" ] && WATCH+=(--watch "app-$port:$pid")
  done
  proxy=$(pid_on 7000); [ -n "$proxy" ] && WATCH+=(--watch "proxy:$proxy")
fi
.venv/bin/python "$ANCHOR/run_matrix.py" --out "$OUT" --split-services \
  --base-url "$BASE" --prefix /api/v2 \
  --apikey "$REQ" --worker-apikey "$WRK" --model koboldcpp/L3-Super-Nova-RP-8B \
  --reset-cmd .local/anchor-reset.sh "${WATCH[@]}" ${PG:+--watch "pg:$PG:tree"} "$@"
.venv/bin/python "$ANCHOR/summarize.py" --matrix "$OUT"
