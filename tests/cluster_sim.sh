#!/usr/bin/env bash
# cluster_sim.sh [BUILD] - the quick form of bench/cluster: 200 simulated
# agents (bench/cluster/simagents.c, the protocol of executor/agent.c over
# real HTTP on loopback) against the build's server (the sanitized one under
# `make test`), seeded, about 30 s.
#
# The server declares a node lost after 6 s without a heartbeat and the
# agents beat every 2 s, so a heartbeat answered but not recorded (or not
# written before the lost-node check) shows as nodes lost within the run.
# Asserts: every agent registered and ready in GET /cluster, no request
# failed, every acknowledged job in GET /jobs (placed, or queued with a
# reason), tasks started and succeeded, heartbeats answered at the agents'
# rate, and the server's console warns of no lost node.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/asan}
BIN=${TRAINYARD_BIN:-$PWD/$build/trainyard}
[ -x "$BIN" ] || { echo "cluster_sim: no server binary at $BIN" >&2; exit 1; }
# the simulator is the benchmark's, optimized, built by the Makefile (the server under test is $BIN)
SIM=build/bench/simagents
make --no-print-directory -s -j2 "$SIM"
AGENTS=${CLUSTER_SIM_AGENTS:-200}
dir=$(mktemp -d /tmp/ty_cluster_sim.XXXXXX)
pid=
cleanup() { [ -n "$pid" ] && { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; } || true; rm -rf "$dir"; }
trap cleanup EXIT
"$BIN" server --listen 127.0.0.1:0 --data "$dir" --heartbeat-timeout 6 2>"$dir/server.log" &
pid=$!
for _ in $(seq 200); do [ -s "$dir/server.url" ] && break; sleep 0.1; done
[ -s "$dir/server.url" ] || { echo "cluster_sim: the server did not start" >&2; cat "$dir/server.log" >&2; exit 1; }
rc=0
"$SIM" --data "$dir" --agents "$AGENTS" --heartbeat-s 2 --poll-wait 5 --register-rate 400 --warmup 8 \
       --duration 12 --rate 10 --run-ms 1000-4000 --drain 15 --seed 7 --server-pid "$pid" >"$dir/out.json" || rc=$?
cat "$dir/out.json"
python3 - "$dir/out.json" "$AGENTS" "$rc" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); n = int(sys.argv[2]); rc = int(sys.argv[3])
bad = []
def need(cond, what):
    if not cond: bad.append(what)
j = r["jobs"]
need(r["registered"] == n, f"registered {r['registered']} of {n}")
need(r["nodes_in_cluster"] == n and r["ready_in_cluster"] == n,
     f"GET /cluster: {r['ready_in_cluster']} ready of {r['nodes_in_cluster']} (want {n})")
need(r["errors"] == 0, f"{r['errors']} requests failed: {r['first_error']}")
need(r["acknowledged"] > 0 and j["found"] == r["acknowledged"] and j["lost"] == 0,
     f"acknowledged {r['acknowledged']}, found {j['found']}, lost {j['lost']}")
need(j["failed"] == 0 and j["cancelled"] == 0 and j["other"] == 0, f"jobs failed: {r['first_failed_job']}")
need(j["queued_without_reason"] == 0, f"{j['queued_without_reason']} queued jobs without a reason")
need(j["succeeded"] > 0 and r["tasks_started"] > 0, f"succeeded {j['succeeded']}, tasks started {r['tasks_started']}")
need(r["submit_to_assignment_ms"]["gangs"] > 0, "no gang reached its agents")
# every agent beats every 2 s: about n/2 a second, seen by the agents and by the server's /metrics
need(r["heartbeats_per_s"] > 0.4 * n, f"heartbeats answered {r['heartbeats_per_s']}/s, want about {n / 2}")
need(r["server_heartbeat_ms"]["per_s"] > 0.4 * n, f"server's heartbeat count {r['server_heartbeat_ms']['per_s']}/s")
need(rc == 0, f"simagents exited {rc}")
if bad:
    print("cluster_sim: FAILED:\n  " + "\n  ".join(bad), file=sys.stderr); sys.exit(1)
print(f"cluster_sim: ok: {n} agents ready, {r['acknowledged']} jobs acknowledged and found "
      f"({j['succeeded']} succeeded), {r['heartbeats_per_s']:.0f} heartbeats/s, no error")
PY
if grep -q "lost (no heartbeat" "$dir/server.log"; then
  echo "cluster_sim: FAILED: the server declared nodes lost:" >&2
  grep "lost (no heartbeat" "$dir/server.log" | head -5 >&2
  exit 1
fi
