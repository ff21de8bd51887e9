#!/usr/bin/env bash
# bench/proxy/api_load.sh - the server's own API while its proxy is busy
# (`make bench-proxy-load`; docs/measurements.md, "The API beside the proxy").
# A real `trainyard up` (server and agent) runs a job whose web port is
# tests/proxy_upstream.py. wrk measures GET /api/v1/jobs/ID with one
# connection (a request's own latency, not a queue's) twice in one run:
# idle, then while bench/proxy/api_load.py holds INFLIGHT proxied requests
# (event streams through /proxy/jobs/ID/web/stream, each re-issued as it
# ends) and WS open WebSockets (echoing a frame every 100 ms each) through
# the server. Ends with one JSON line: the medians, p99s and their ratio.
# It fails when the load fell short (fewer streams or WebSockets open than
# asked) or any request failed. SMOKE=1 (make test): one second a phase.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v wrk >/dev/null || TRAINYARD_EXTRA_PKGS=wrk scripts/deps.sh
BUILD=${BUILD:-build}
make -s -j2 "$BUILD/trainyard" >/dev/null
BIN=$PWD/$BUILD/trainyard
[ "${SMOKE:-0}" = 1 ] && DUR=1
DUR=${DUR:-10}
INFLIGHT=${INFLIGHT:-100}
WS=${WS:-20}
dir=$(mktemp -d /tmp/ty_bench_pload.XXXXXX)
chmod 755 "$dir"
up=""; load=""
cleanup() {
  [ -n "$load" ] && kill -TERM "$load" 2>/dev/null
  [ -n "$up" ] && { kill -TERM "$up" 2>/dev/null; wait "$up" 2>/dev/null; }
  [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT
"$BIN" up --listen 127.0.0.1:0 --data "$dir" --cpu-slots 2 >"$dir/up.log" 2>&1 & up=$!
for _ in $(seq 300); do [ -s "$dir/server.url" ] && [ -s "$dir/token" ] && break; sleep 0.1; done
URL=$(cat "$dir/server.url"); TOKEN=$(cat "$dir/token")
spec=$(printf '{"name":"app","command":{"argv":["/usr/bin/python3","%s/tests/proxy_upstream.py","--env","TRAINYARD_PORT_WEB"]},"ports":[{"name":"web","port":8000}],"resources":{"workers":1,"device":"cpu"},"max_restarts":0}' "$PWD")
id=$(curl -sf -X POST "$URL/api/v1/jobs" -H "Authorization: Bearer $TOKEN" --data "$spec" |
     python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
for _ in $(seq 600); do
  curl -sf -o /dev/null -H "Authorization: Bearer $TOKEN" "$URL/proxy/jobs/$id/web/echo" && break
  sleep 0.1
done
curl -sf -o /dev/null -H "Authorization: Bearer $TOKEN" "$URL/proxy/jobs/$id/web/echo" ||
  { echo "bench/proxy/api_load: the job's port is not served" >&2; tail -20 "$dir/up.log" >&2; exit 1; }

parse() { python3 bench/wrk_parse.py "$1"; } # wrk output -> "rps p50_ms p99_ms errors"
api() { wrk -t1 -c1 -d"${DUR}s" --latency -H "Authorization: Bearer $TOKEN" "$URL/api/v1/jobs/$id" > "$dir/$1.txt"; parse "$dir/$1.txt"; }
idle=$(api idle)
echo "idle: rps p50_ms p99_ms errors = $idle"
/usr/bin/python3 bench/proxy/api_load.py "$URL" "$TOKEN" "$id" "$INFLIGHT" "$WS" "$dir/load.json" & load=$!
for _ in $(seq 600); do [ -s "$dir/load.ready" ] || [ -s "$dir/load.json.ready" ] && break; sleep 0.1; done
[ -s "$dir/load.json.ready" ] || { echo "bench/proxy/api_load: the load did not start" >&2; exit 1; }
busy=$(api busy)
echo "busy: rps p50_ms p99_ms errors = $busy"
kill -TERM "$load"; wait "$load" || true; load=""
python3 - "$idle" "$busy" "$dir/load.json" "$DUR" "$INFLIGHT" "$WS" <<'PY'
import json, sys
f = lambda s: [round(float(x), 3) for x in s.split()]
i, b = f(sys.argv[1]), f(sys.argv[2])
load = json.load(open(sys.argv[3]))
print(json.dumps({"bench": "proxy-load", "dur_s": int(sys.argv[4]), "proxied_in_flight": load["in_flight"],
                  "websockets_open": load["websockets"], "ws_echoes": load["echoes"], "load_errors": load["errors"],
                  "api_p50_ms": {"idle": i[1], "busy": b[1]}, "api_p99_ms": {"idle": i[2], "busy": b[2]},
                  "p50_ratio_busy_over_idle": round(b[1] / i[1], 2) if i[1] else None,
                  "api_errors": int(i[3] + b[3])}))
# the load must have been what it says, and nothing may have failed under it
ok = load["in_flight"] >= int(sys.argv[5]) and load["websockets"] >= int(sys.argv[6]) and load["errors"] == 0 \
    and i[3] + b[3] == 0 and load["echoes"] > 0
if not ok:
    print("bench/proxy/api_load: the load fell short or something failed (see the line above)", file=sys.stderr)
sys.exit(0 if ok else 1)
PY
