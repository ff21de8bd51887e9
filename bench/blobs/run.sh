#!/usr/bin/env bash
# bench/blobs - what a checkpoint costs the server when its bytes go through
# it (--blob-store DATA: PUT /jobs/{id}/checkpoints) against when they go
# straight to an S3 store (the worker's presigned multipart upload,
# client/blobxfer.c), on one machine (`make bench-blobs`). The store: a
# one-node Ceph radosgw (scripts/s3-dev.sh, memstore: in RAM). Phases, each
# one JSON line from build/bench/blobput (bench/blobs/blobput.c), which plays
# the tasks and samples the server's utime+stime (/proc/PID/stat) around the
# uploads alone:
#   via_server    one 1 GiB checkpoint PUT through a server on DATA
#   via_store     one 1 GiB checkpoint through a server on s3:// (16 x 64 MiB parts, 4 in flight)
#   burst_server  16 uploads of 64 MiB at once through the server on DATA
#   burst_store   the same 16 through the store
# each store phase with its ratios to the server phase before it (server
# CPU seconds and time, through the server over through the store). Ends
# with one JSON line: the ratios again and the burst's server cores against
# the target (< 0.10 of one core; the run fails past it, except SMOKE=1).
# SMOKE=1 (make test): 64 MiB instead of 1 GiB, a burst of 4.
# Needs root and radosgw (scripts/deps.sh); else it prints a "skipped" line.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
skip() { printf '{"bench":"blobs","skipped":"%s"}\n' "$1"; exit 0; }
[ "$(id -u)" = 0 ] || skip "needs root (the Ceph daemons of scripts/s3-dev.sh)"
command -v radosgw >/dev/null || skip "radosgw is not installed (scripts/deps.sh)"
make -s -j2 "$BUILD/trainyard" "$BUILD/bench/blobput" >/dev/null
if [ "${SMOKE:-0}" = 1 ]; then
  BIG=${BIG:-$((64 << 20))}; BURST=${BURST:-4}; EACH=${EACH:-$((64 << 20))}; MB=${S3_DEV_MB:-1024}
else
  BIG=${BIG:-$((1 << 30))}; BURST=${BURST:-16}; EACH=${EACH:-$((64 << 20))}; MB=${S3_DEV_MB:-3072}
fi
TARGET=0.10
dir=$(mktemp -d /tmp/ty_bench_blobs.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -d "$dir/s3" ] && scripts/s3-dev.sh stop "$dir/s3" >/dev/null 2>&1 || true
  [ -n "${KEEP:-}" ] || rm -rf "$dir"
}
trap cleanup EXIT

S3_DEV_MB=$MB scripts/s3-dev.sh start "$dir/s3" >"$dir/s3.env"
# shellcheck disable=SC1091
. "$dir/s3.env"
RGW=$(awk '$1 == "radosgw" { print $2 }' "$dir/s3/pids")

# server NAME [flags...]: a server on a fresh data directory; sets URL_<NAME>, PID_<NAME>
server() {
  local name=$1 d=$dir/$1
  shift
  mkdir -p "$d"
  "$BUILD/trainyard" server --listen 127.0.0.1:0 --data "$d" --heartbeat-timeout 3600 "$@" 2>"$d/server.log" &
  local pid=$!
  pids+=("$pid")
  for _ in $(seq 300); do [ -s "$d/server.url" ] && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  [ -s "$d/server.url" ] || { echo "bench/blobs: the server $name did not start:" >&2; tail -5 "$d/server.log" >&2; exit 1; }
  printf -v "URL_$name" '%s' "$(cat "$d/server.url")"
  printf -v "PID_$name" '%s' "$pid"
}

server local
server s3 --blob-store "s3://$S3_BUCKET?endpoint=$S3_ENDPOINT&region=$S3_REGION" --blob-credentials "$dir/s3/credentials"

# put PHASE SERVER MODE BYTES COUNT [AGAINST]: one blobput run, its JSON line
# kept and printed; with AGAINST (the same uploads through the server, run
# before) the line also has the ratios, through the server over through the store
put() {
  local url pid
  url=URL_$2; pid=PID_$2
  "$BUILD/bench/blobput" --server "${!url}" --data "$dir/$2" --server-pid "${!pid}" --rgw-pid "$RGW" \
      --mode "$3" --bytes "$4" --count "$5" --phase "$1" >"$dir/$1.json"
  python3 - "$dir/$1.json" "${6:+$dir/$6.json}" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
if sys.argv[2]:
    a = json.load(open(sys.argv[2]))
    tick = 0.01  # /proc/PID/stat counts CPU in clock ticks (getconf CLK_TCK: 100)
    p["server_cpu_ratio"] = round(a["server_cpu_s"] / max(p["server_cpu_s"], tick), 1)
    p["time_ratio"] = round(a["seconds"] / p["seconds"], 2)
print(json.dumps(p))
PY
}

put via_server local server "$BIG" 1
put via_store s3 store "$BIG" 1 via_server
put burst_server local server "$EACH" "$BURST"
put burst_store s3 store "$EACH" "$BURST" burst_server

python3 - "$dir" "$TARGET" "${SMOKE:-0}" <<'PY'
import json, sys
d, target, smoke = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
p = {n: json.load(open(f"{d}/{n}.json")) for n in ("via_server", "via_store", "burst_store", "burst_server")}
tick = 0.01  # /proc/PID/stat counts CPU in clock ticks (getconf CLK_TCK: 100)
ratio = lambda a, b: round(a / b, 1) if b > 0 else None
out = {"bench": "blobs", "smoke": smoke,
       "checkpoint_bytes": int(p["via_server"]["bytes"]),
       "server_cpu_s": {"via_server": p["via_server"]["server_cpu_s"], "via_store": p["via_store"]["server_cpu_s"]},
       "seconds": {"via_server": p["via_server"]["seconds"], "via_store": p["via_store"]["seconds"]},
       # below one tick the store's side is counted as one: the ratio is then a lower bound
       "server_cpu_ratio": ratio(p["via_server"]["server_cpu_s"], max(p["via_store"]["server_cpu_s"], tick)),
       "server_cpu_ratio_is_lower_bound": p["via_store"]["server_cpu_s"] < tick,
       "time_ratio": ratio(p["via_server"]["seconds"], p["via_store"]["seconds"]),
       "burst": {"uploads": p["burst_store"]["uploads"], "bytes_each": int(p["burst_store"]["bytes"] / p["burst_store"]["uploads"]),
                 "server_cores_store": p["burst_store"]["server_cores"],
                 "server_cores_server": p["burst_server"]["server_cores"],
                 "rgw_cores_store": p["burst_store"]["rgw_cores"]},
       "target_burst_server_cores": target,
       "target_met": p["burst_store"]["server_cores"] < target}
print(json.dumps(out))
sys.exit(0 if out["target_met"] or smoke else 1)
PY
