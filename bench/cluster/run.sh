#!/usr/bin/env bash
# bench/cluster - thousands of simulated agents against one real server
# (`make bench-cluster`).
#
# For each N in AGENTS (default "1000 5000"): a fresh `trainyard server`
# (optimized build, its own data directory and join token) and
# bench/cluster/simagents.c: N agents speaking executor/agent.c's protocol
# over HTTP on loopback (register, heartbeat every 5 s, long-poll
# assignments, report each task's start and its exit after a seeded run
# time), and a submitter posting RATE jobs/s for DUR seconds from a seeded
# mix of gangs (1, 2, 4 or 8 GPUs x 1-4 workers; 8 GPUs a node). Measured
# over the DUR window: submit -> every task of the gang in its agents'
# hands (p50/p99), the scheduler's pass time (from /metrics), heartbeats
# answered per second, the server's CPU (cores, /proc/PID/stat) and RSS;
# then every acknowledged job is looked up in GET /api/v1/jobs (nothing
# lost, a queued one states its reason) and every agent in GET /cluster.
#
# COMPARE=1 (default) runs the largest N again with the server's old paths,
# for the before/after in one run:
#   N_old:    all three below at once (the server before this benchmark);
#   N_hbwrite: TRAINYARD_HEARTBEAT_WRITE=1, a write transaction per heartbeat;
#   N_pollq:   TRAINYARD_POLL_RECHECK=query, two queries per parked poll
#              every 150 ms;
#   N_capq:    TRAINYARD_CAPACITY_KEEP=0, the cluster's capacity queried on
#              every submission.
# COMPARE=2 runs N_old only.
#
# USER_GET=1 (default): a user's GET of one job while the agents run: wrk
# with GET_CONNS (4) keep-alive connections, each pausing GET_DELAY_MS (20)
# between GETs of /api/v1/jobs/1, over the window less 2 s (about 200
# requests a second); its latency goes under "user_get_job".
#
# BENCH_DIR: where the servers' data directories go (default /tmp); BENCH_DIR=/dev/shm
# takes the disk out of the picture (a diagnostic: a server's data belongs on a disk).
#
# SIM_ARGS: more simagents flags (--agent-rest stops: agents that rest
# after an answer with stops only, not after one with tasks to start).
#
#   AGENTS="200" DUR=10 bench/cluster/run.sh          # a quick look
#   AGENTS="1000 5000" RATE=100 DUR=30 bench/cluster/run.sh
#
# Ends with one JSON object. The peer, Slurm's slurmctld, is not run here:
# docs/measurements.md ("The peer: Slurm's slurmctld") compares in prose.
set -euo pipefail
cd "$(dirname "$0")/../.."
# SMOKE=1 (make test): 50 agents for 3 s, no before/after
if [ "${SMOKE:-0}" = 1 ]; then AGENTS=50 RATE=10 DUR=3 WARMUP=1 DRAIN=3 COMPARE=0; fi
AGENTS=${AGENTS:-"1000 5000"}
RATE=${RATE:-100}
DUR=${DUR:-30}
WARMUP=${WARMUP:-10}
DRAIN=${DRAIN:-30}
SEED=${SEED:-1}
RUN_MS=${RUN_MS:-2000-10000}
COMPARE=${COMPARE:-1}
USER_GET=${USER_GET:-1}
GET_CONNS=${GET_CONNS:-4}
GET_DELAY_MS=${GET_DELAY_MS:-20}
if [ "$USER_GET" = 1 ] && ! command -v wrk >/dev/null; then TRAINYARD_EXTRA_PKGS=wrk scripts/deps.sh; fi
if [ -z "${BIN:-}" ]; then make -s -j2 all >/dev/null; BIN=$PWD/build/trainyard; fi
SIM=build/bench/simagents   # built by the Makefile (the tree's one link list)
make --no-print-directory -s -j2 "$SIM"
# a descriptor per connection, on both sides: N parked polls and what is in flight
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
out=$(mktemp -d "${BENCH_DIR:-/tmp}/ty_bench_cluster.XXXXXX")
pid=
cleanup() { [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; } || true; [ -n "${KEEP:-}" ] || rm -rf "$out"; }
trap cleanup EXIT

# one LABEL N [ENV=VALUE...]: a server, the agents, their JSON in $out/LABEL.json
one() {
  local label=$1 n=$2; shift 2
  local dir="$out/$label"
  mkdir -p "$dir"
  env "$@" "$BIN" server --listen 127.0.0.1:0 --data "$dir" --quiet 2>"$dir/server.log" &
  pid=$!
  for _ in $(seq 100); do [ -s "$dir/server.url" ] && break; sleep 0.1; done
  [ -s "$dir/server.url" ] || { echo "bench/cluster: the server did not start" >&2; cat "$dir/server.log" >&2; exit 1; }
  echo "== $label: $n agents, $RATE jobs/s for ${DUR}s ($*), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
  local rc=0 gp=
  : >"$dir/sim.err"
  if [ "$USER_GET" = 1 ]; then
    # a user's GET of one job beside the agents: from 1 s into the window, GET_CONNS
    # keep-alive connections each pausing GET_DELAY_MS between GETs of job 1 (the
    # window's first submission), wrk's latency per request
    local url tok gdur=$(( ${DUR%.*} > 3 ? ${DUR%.*} - 2 : 1 ))
    url=$(cat "$dir/server.url"); tok=$(cat "$dir/token")
    ( for _ in $(seq 1200); do grep -q 'the window begins' "$dir/sim.err" && break; sleep 0.1; done
      sleep 1
      GET_DELAY_MS=$GET_DELAY_MS wrk -t1 -c"$GET_CONNS" -d"${gdur}s" --latency -s bench/load/get_paced.lua \
          -H "Authorization: Bearer $tok" "$url/api/v1/jobs/1" >"$out/$label.get.txt" 2>&1 ) &
    gp=$!
  fi
  # the machine's stall time over the phase (Linux PSI, "full": every task waiting at once)
  psi() { awk '/^full/ {sub("total=", "", $5); print $5}' "/proc/pressure/$1" 2>/dev/null || echo 0; }
  local io0 cpu0 t0; io0=$(psi io); cpu0=$(awk '/^some/ {sub("total=", "", $5); print $5}' /proc/pressure/cpu 2>/dev/null || echo 0); t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$SIM" --data "$dir" --agents "$n" --rate "$RATE" --duration "$DUR" --warmup "$WARMUP" --drain "$DRAIN" \
         --seed "$SEED" --run-ms "$RUN_MS" --server-pid "$pid" ${SIM_ARGS:-} >"$out/$label.json" \
         2> >(tee -a "$dir/sim.err" >&2) || rc=$?
  [ -n "$gp" ] && wait "$gp"
  local io1 cpu1 t1; io1=$(psi io); cpu1=$(awk '/^some/ {sub("total=", "", $5); print $5}' /proc/pressure/cpu 2>/dev/null || echo 0); t1=$(date +%s.%N)
  echo "{\"seconds\": $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}'), \"io_full_stall_ms\": $(( (io1 - io0) / 1000 )), \"cpu_some_stall_ms\": $(( (cpu1 - cpu0) / 1000 )), \"load_after\": \"$(cut -d' ' -f1-3 /proc/loadavg)\"}" >"$out/$label.psi.json"
  kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true; pid=
  cat "$out/$label.json" >&2
  [ -s "$out/$label.get.txt" ] && grep -E 'Requests/sec|Latency  |  (50|99)%|Non-2xx' "$out/$label.get.txt" >&2
  [ "$rc" = 0 ] || echo "bench/cluster: $label: errors, lost jobs or agents not ready (see above)" >&2
  return 0
}

labels=()
for n in $AGENTS; do one "n$n" "$n"; labels+=("n$n"); done
if [ "$COMPARE" = 1 ] || [ "$COMPARE" = 2 ]; then
  big=$(for n in $AGENTS; do echo "$n"; done | sort -n | tail -1)
  one "n${big}_old" "$big" TRAINYARD_HEARTBEAT_WRITE=1 TRAINYARD_POLL_RECHECK=query TRAINYARD_CAPACITY_KEEP=0
  labels+=("n${big}_old")
  if [ "$COMPARE" = 1 ]; then
    one "n${big}_hbwrite" "$big" TRAINYARD_HEARTBEAT_WRITE=1; labels+=("n${big}_hbwrite")
    one "n${big}_pollq" "$big" TRAINYARD_POLL_RECHECK=query; labels+=("n${big}_pollq")
    one "n${big}_capq" "$big" TRAINYARD_CAPACITY_KEEP=0; labels+=("n${big}_capq")
  fi
fi

python3 - "$out" "$RATE" "$DUR" "$SEED" "$(nproc)" "${labels[@]}" <<'PY'
import json, sys
out, rate, dur, seed, cores = sys.argv[1:6]
import re
def wrk_get(path):
    # wrk's text: requests/s, the latency percentiles, errors (non-2xx, socket errors)
    try:
        t = open(path).read()
    except OSError:
        return None
    def ms(v, u): return round(float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[u], 3)
    m = re.search(r"Requests/sec:\s+([\d.]+)", t)
    lat = {p: ms(v, u) for p, v, u in re.findall(r"\s(50|90|99)%\s+([\d.]+)(us|ms|s)", t)}
    mx = re.search(r"Latency\s+\S+\s+\S+\s+([\d.]+)(us|ms|s)", t)
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", t)
    sock = re.search(r"Socket errors:.*", t)
    return {"rps": float(m.group(1)) if m else None, "p50_ms": lat.get("50"), "p90_ms": lat.get("90"),
            "p99_ms": lat.get("99"), "max_ms": ms(*mx.groups()) if mx else None,
            "non_2xx": int(bad.group(1)) if bad else 0, "socket_errors": sock.group(0) if sock else ""}
runs = {}
for label in sys.argv[6:]:
    try:
        runs[label] = json.load(open(f"{out}/{label}.json"))
    except Exception as e:
        runs[label] = {"error": f"no result: {e}"}
        continue
    g = wrk_get(f"{out}/{label}.get.txt")
    if g is not None:
        runs[label]["user_get_job"] = g
    try:
        runs[label]["machine"] = json.load(open(f"{out}/{label}.psi.json"))
    except Exception:
        pass
def ok(r):
    return (r.get("errors", 1) == 0 and r.get("jobs", {}).get("lost", 1) == 0
            and r.get("ready_in_cluster") == r.get("agents") and r.get("jobs", {}).get("queued_without_reason", 1) == 0)
print(json.dumps({
    "bench": "cluster", "rate": float(rate), "duration_s": float(dur), "seed": int(seed), "cores": int(cores),
    "runs": runs,
    "all_ok": all(ok(r) for r in runs.values()),
    "peer": "slurmctld not run here (docs/measurements.md compares with its documented scale)",
}))
PY
