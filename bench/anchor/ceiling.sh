#!/usr/bin/env bash
# The anchor load generator's own ceiling on this machine: its cells against a server that costs almost nothing
# (Caddy answering every route with a fixed body of the right shape), so no system under test can do better here.
#   bench/anchor/ceiling.sh [--reps N]   (prints one line per cell and repetition; JSON in .local/anchor-ceiling/)
set -euo pipefail
cd "$(dirname "$0")/../.."
ANCHOR=${HORDE_ANCHOR_DIR:-$(cd .. && pwd)/shared/bench/anchor}
[ -f "$ANCHOR/hordebench.py" ] || { echo "no anchor scripts at $ANCHOR (set HORDE_ANCHOR_DIR)" >&2; exit 1; }
REPS=1; [ "${1:-}" = --reps ] && REPS=$2
PORT=${CEILING_PORT:-7998}
OUT=.local/anchor-ceiling/$(date +%Y%m%dT%H%M%S); mkdir -p "$OUT"
ID=5f0a3a34-4d2c-4b7e-9d1c-0c1f2e3d4a5b
POP='{"payload":{"prompt":"You are a helpful storyteller. Continue the story in two short sentences.\nOnce upon a time, in a small village by the sea, there lived an old fisherman who","n":1,"max_context_length":4096,"max_length":80},"id":"'$ID'","ids":["'$ID'"],"skipped":{},"softprompt":null,"model":"koboldcpp/L3-Super-Nova-RP-8B","ttl":150,"extra_source_images":null}'
STATUS='{"finished":0,"processing":0,"restarted":0,"waiting":1,"done":false,"faulted":false,"wait_time":0,"queue_position":999,"kudos":0.0,"is_possible":true,"generations":[]}'
cat > "$OUT/Caddyfile" <<CADDY
{
	admin off
	auto_https off
	persist_config off
}
http://127.0.0.1:$PORT {
	header Content-Type application/json
	@async path /api/v2/generate/text/async
	respond @async \`{"id":"$ID","kudos":11.0}\` 202
	@pop path /api/v2/generate/text/pop
	respond @pop \`$POP\` 200
	@submit path /api/v2/generate/text/submit
	respond @submit \`{"reward":10.0}\` 200
	respond \`$STATUS\` 200
}
CADDY
.venv/bin/caddy run --config "$OUT/Caddyfile" --adapter caddyfile > "$OUT/caddy.log" 2>&1 &
CADDY=$!; trap 'kill $CADDY 2>/dev/null' EXIT
for _ in $(seq 50); do curl -fs -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
for _ in $(seq 20); do echo "$ID"; done > "$OUT/ids.txt"
B=http://127.0.0.1:$PORT
run() {  # run NAME ARGS...
  local name=$1; shift
  for rep in $(seq "$REPS"); do
    .venv/bin/python "$ANCHOR/hordebench.py" "$@" --base-url "$B" --watch "server:$CADDY" --json-out "$OUT/$name-$rep.json" > /dev/null
    .venv/bin/python - "$OUT/$name-$rep.json" "$name" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); p = d["procs"]; kind = next(iter(d["latency"]))
lat = d["latency"].get("pop", d["latency"][kind])
rate = d.get("jobs_per_s") or d.get("pops_per_s") or d.get("ok_per_s") or round(lat["n"] / d["elapsed_s"], 1)
print(f'{sys.argv[2]:16} {rate:>8}/s  p50 {lat["p50_ms"]} ms  p99 {lat["p99_ms"]} ms  '
      f'load generator {p["loadgen"]["cores_used"]} cores, server {p["server"]["cores_used"]}, machine {p["machine"]["cores_busy"]}')
PY
  done
}
run async_c1 async -c 1 -n 20000 -d 15 --model koboldcpp/L3-Super-Nova-RP-8B
run async_c8 async -c 8 -n 40000 -d 15 --model koboldcpp/L3-Super-Nova-RP-8B
run async_c32 async -c 32 -n 40000 -d 15 --model koboldcpp/L3-Super-Nova-RP-8B
run pop_w8 pop -w 8 -n 40000 -d 15 --worker-apikey k --model koboldcpp/L3-Super-Nova-RP-8B
run cycle_w8 cycle -w 8 -n 40000 -d 15 --worker-apikey k --model koboldcpp/L3-Super-Nova-RP-8B
run status_c8 status -c 8 -n 40000 -d 15 --ids-file "$OUT/ids.txt"
