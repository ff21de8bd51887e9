#!/usr/bin/env bash
# bench/api - requests/s and latency of the REST API under wrk, on loopback.
#   GET /api/v1/jobs/{id}:   wrk -t2 -c32 -d10s --latency  (the peer table's setting)
#   POST /api/v1/jobs:       wrk -t2 -c8  -d10s --latency  (8 keep-alive clients submitting)
#   the GET over HTTPS (--tls auto), keep-alive; and a new connection per GET
#   (Connection: close) over HTTPS and over HTTP: what TLS costs a request and a handshake
# Then the server is killed with SIGKILL and restarted: every job wrk saw
# acknowledged (201) must still be there. Ends with one JSON line.
# Then the peer, slurmrestd on a one-node Slurm cluster, measured the same way by
# bench/api/slurm_peer.sh (installs slurm if missing; needs root), unless PEER=0;
# the JSON line gets its figures under "slurm" and ratios trainyard/slurm under "ratio",
# and the line before it says the submission and GET ratios in words.
# SMOKE=1: the same steps in seconds (every wrk run 1 s, the peer's curl part 40
# jobs), for tests/bench_smoke.sh; the peer is still measured when it can run (as
# root; slurm_peer.sh installs it), else skipped with the reason in the JSON line.
# DB=postgres or DB=both (`make bench-api DB=both`): the GET and submission load on
# a server on SQLite and on PostgreSQL in one run, one table: bench/api/stores.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
case "${DB:-sqlite}" in
  sqlite) ;;
  postgres | both) exec bench/api/stores.sh ;;
  *) echo "bench/api: DB=$DB: sqlite (default), postgres or both" >&2; exit 2 ;;
esac
command -v wrk >/dev/null || TRAINYARD_EXTRA_PKGS=wrk scripts/deps.sh   # the load generator, as bench/cluster
make -s all >/dev/null
BIN=$PWD/build/trainyard
if [ "${SMOKE:-0}" = 1 ]; then
  DUR=${DUR:-1}; N300=${N300:-40}
else
  DUR=${DUR:-10}; N300=${N300:-300}
fi
dir=$(mktemp -d /tmp/ty_bench_api.XXXXXX)
trap 'kill -9 $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
start() {
  rm -f "$dir/server.url"
  "$BIN" server --listen 127.0.0.1:0 --data "$dir" 2>>"$dir/server.log" &
  pid=$!
  for _ in $(seq 100); do [ -s "$dir/server.url" ] && break; sleep 0.1; done
  URL=$(cat "$dir/server.url")
}
start
TOKEN=$(cat "$dir/token")
id=$(curl -sf -X POST "$URL/api/v1/jobs" -H "Authorization: Bearer $TOKEN" --data @examples/synthetic_binary.json |
     python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')

parse() { # wrk output -> "rps p50_ms p99_ms"
  python3 - "$1" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
def ms(v, u): return float(v) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[u]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", t).group(1))
lat = dict((p, ms(v, u)) for p, v, u in re.findall(r"\s(50|99)%\s+([\d.]+)(us|ms|s)", t))
print(rps, lat.get("50"), lat.get("99"))
PY
}

echo "== GET /api/v1/jobs/$id  (wrk -t2 -c32 -d${DUR}s)"
wrk -t2 -c32 -d"${DUR}s" --latency -H "Authorization: Bearer $TOKEN" "$URL/api/v1/jobs/$id" | tee "$dir/get.txt"
read -r get_rps get_p50 get_p99 < <(parse "$dir/get.txt")

before=$(sqlite3 "$dir/trainyard.db" 'select count(*) from jobs')
echo "== POST /api/v1/jobs  (wrk -t2 -c8 -d${DUR}s)"
SPEC=examples/synthetic_binary.json wrk -t2 -c8 -d"${DUR}s" --latency -s bench/api/submit.lua \
    -H "Authorization: Bearer $TOKEN" "$URL/api/v1/jobs" | tee "$dir/post.txt"
read -r post_rps post_p50 post_p99 < <(parse "$dir/post.txt")
non2xx=$(grep -o 'Non-2xx or 3xx responses: [0-9]*' "$dir/post.txt" | grep -o '[0-9]*$' || echo 0)
# what they were (submit.lua's last line: "non-201: 503 x3; first: ...")
export SUBMIT_OTHERS=$(grep -o '^non-201: [^;]*' "$dir/post.txt" | cut -d' ' -f2- || true)

# HTTPS: the same GET on a server with --tls auto (ECDHE-ECDSA P-256, as it
# makes), keep-alive as above; then new connections: every request on a
# connection of its own (Connection: close), over TLS (a full handshake each)
# and in the clear, for what a handshake costs
tdir=$(mktemp -d /tmp/ty_bench_api_tls.XXXXXX)
"$BIN" server --listen 127.0.0.1:0 --data "$tdir" --tls auto 2>>"$tdir/server.log" &
tpid=$!
for _ in $(seq 100); do [ -s "$tdir/server.url" ] && break; sleep 0.1; done
TURL=$(cat "$tdir/server.url"); TTOKEN=$(cat "$tdir/token")
tid=$(curl -sf --cacert "$tdir/tls/ca.crt" -X POST "$TURL/api/v1/jobs" -H "Authorization: Bearer $TTOKEN" \
      --data @examples/synthetic_binary.json | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
echo "== HTTPS GET /api/v1/jobs/$tid  (wrk -t2 -c32 -d${DUR}s)"
wrk -t2 -c32 -d"${DUR}s" --latency -H "Authorization: Bearer $TTOKEN" "$TURL/api/v1/jobs/$tid" | tee "$dir/tget.txt"
read -r tget_rps tget_p50 tget_p99 < <(parse "$dir/tget.txt")
echo "== HTTPS GET, a new connection each (Connection: close; wrk -t2 -c32 -d${DUR}s)"
wrk -t2 -c32 -d"${DUR}s" --latency -H "Connection: close" -H "Authorization: Bearer $TTOKEN" \
    "$TURL/api/v1/jobs/$tid" | tee "$dir/tnew.txt"
read -r tnew_rps tnew_p50 tnew_p99 < <(parse "$dir/tnew.txt")
kill -9 "$tpid"; wait "$tpid" 2>/dev/null || true; rm -rf "$tdir"
echo "== HTTP GET, a new connection each (Connection: close; wrk -t2 -c32 -d${DUR}s)"
wrk -t2 -c32 -d"${DUR}s" --latency -H "Connection: close" -H "Authorization: Bearer $TOKEN" \
    "$URL/api/v1/jobs/$id" | tee "$dir/pnew.txt"
read -r pnew_rps pnew_p50 pnew_p99 < <(parse "$dir/pnew.txt")

kill -9 "$pid"; wait "$pid" 2>/dev/null || true
start
after=$(curl -sf "$URL/api/v1/health" >/dev/null && sqlite3 "$dir/trainyard.db" 'select count(*) from jobs')
acked=$(python3 -c "print(int($after) - int($before))")
echo "jobs stored after kill -9 and restart: $acked new (wrk's 201 answers in the window: see post.txt; non-2xx: $non2xx)"
kill -9 "$pid"; wait "$pid" 2>/dev/null || true; pid=   # trainyard is done: leave the 2 cores to the peer
ours=$(printf '{"get_rps":%s,"get_p50_ms":%s,"get_p99_ms":%s,"submit_rps":%s,"submit_p50_ms":%s,"submit_p99_ms":%s,"submit_non2xx":%s,"jobs_after_kill9":%s,"tls_get_rps":%s,"tls_get_p50_ms":%s,"tls_get_p99_ms":%s,"tls_new_conn_rps":%s,"tls_new_conn_p99_ms":%s,"http_new_conn_rps":%s,"http_new_conn_p99_ms":%s}' \
  "$get_rps" "$get_p50" "$get_p99" "$post_rps" "$post_p50" "$post_p99" "$non2xx" "$acked" \
  "$tget_rps" "$tget_p50" "$tget_p99" "$tnew_rps" "$tnew_p99" "$pnew_rps" "$pnew_p99")

# Peer in the same run: slurmrestd (bench/api/slurm_peer.sh), unless PEER=0.
peer='null'
if [ "${PEER:-1}" != 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    why="not root: slurm_peer.sh installs Slurm and starts munged, slurmctld and slurmd"
    echo "bench/api: peer skipped: $why" >&2
    peer=$(python3 -c 'import json,sys; print(json.dumps({"peer":"slurmrestd","skipped":sys.argv[1]}))' "$why")
  else
    echo "== peer: bench/api/slurm_peer.sh (DUR=$DUR N300=$N300)"
    if DUR=$DUR N300=$N300 bench/api/slurm_peer.sh | tee "$dir/peer.txt"; then
      peer=$(tail -n 1 "$dir/peer.txt")
    else
      echo "bench/api: slurm_peer.sh could not run (installing or starting Slurm failed, see above); no ratios" >&2
      peer='{"peer":"slurmrestd","error":"slurm_peer.sh failed"}'
    fi
  fi
fi
# one JSON line: our figures as before, the peer's under "slurm", and ratios trainyard/slurm
# (rps ratios: higher is better for us; p99 ratios: lower is better for us)
python3 - "$ours" "$peer" <<'PY'
import json, os, sys
out = {k: round(v, 3) if isinstance(v, float) else v for k, v in json.loads(sys.argv[1]).items()}
out["submit_non2xx_statuses"] = os.environ.get("SUBMIT_OTHERS") or None
peer = json.loads(sys.argv[2])
if peer is not None:
    out["slurm"] = peer
    def ratio(a, b):
        return round(a / b, 3) if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None
    if "get_rps" in peer:
        out["ratio"] = {k: ratio(out[k], peer[k]) for k in ("get_rps", "get_p99_ms", "submit_rps", "submit_p99_ms")}
        # ours over HTTPS against the peer's plain HTTP
        out["ratio"]["tls_get_rps"] = ratio(out["tls_get_rps"], peer["get_rps"])
        out["ratio"]["tls_get_p99_ms"] = ratio(out["tls_get_p99_ms"], peer["get_p99_ms"])
out["tls_cost"] = {"get_rps": round(out["tls_get_rps"] / out["get_rps"], 3) if out["get_rps"] else None,
                   "new_conn_rps": round(out["tls_new_conn_rps"] / out["http_new_conn_rps"], 3)
                   if out["http_new_conn_rps"] else None}
r = out.get("ratio")
if r and r.get("submit_rps") is not None:
    print("bench/api: submissions %.0f/s against slurmrestd's %.0f/s: %.2fx (goal >= 5x); GET %.1fx"
          % (out["submit_rps"], peer["submit_rps"], r["submit_rps"], r["get_rps"] or 0))
else:
    print("bench/api: no ratio: the peer was %s" % ("not run (PEER=0)" if peer is None else
          peer.get("skipped") or peer.get("error") or "incomplete"))
print(json.dumps(out, separators=(",", ":")))
PY
