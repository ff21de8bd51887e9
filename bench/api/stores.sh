#!/usr/bin/env bash
# bench/api/stores.sh - the REST API's GET and submission load on each store,
# in one run: the same wrk settings as bench/api/run.sh against a server on
# SQLite and a server on PostgreSQL 15 (a real one, started here with
# scripts/pg-dev.sh: durable, fsync on; on loopback, on the same cores as the
# server and wrk). `make bench-api DB=both` (or DB=postgres) runs it.
#   GET /api/v1/jobs/{id}:   wrk -t2 -c32 -d${DUR}s --latency
#   POST /api/v1/jobs:       wrk -t2 -c8  -d${DUR}s --latency (bench/api/submit.lua)
# Rows, one server each, one after another (each stopped before the next):
#   sqlite             the default: WAL, synchronous=NORMAL (a commit is in the
#                      WAL file when acknowledged, survives kill -9; a power
#                      loss may lose the last ones: no fsync per commit)
#   sqlite-full        --durability full: synchronous=FULL, an fsync per commit
#   postgres           synchronous_commit=on (PostgreSQL's default): the
#                      commit's WAL is fsynced before it is acknowledged; the
#                      peer of sqlite-full
#   postgres-async     synchronous_commit=off for the server's sessions only
#                      (libpq's options=-c in the URL): the commit is
#                      acknowledged before its WAL is flushed (the WAL writer
#                      flushes within 3 x wal_writer_delay, 600 ms); survives a
#                      kill -9 of the server, a crash of PostgreSQL or of the
#                      machine may lose the last commits: the peer of sqlite
# DB=postgres runs the two postgres rows, DB=both all four. Ratios: each
# postgres row over its peer and over the default sqlite.
# SMOKE=1: every wrk run 1 s (tests/bench_smoke.sh). Ends with one JSON line.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v wrk >/dev/null || TRAINYARD_EXTRA_PKGS=wrk scripts/deps.sh
make -s all >/dev/null
BIN=$PWD/build/trainyard
DB=${DB:-both}
case "$DB" in
  postgres) rows="postgres postgres-async" ;;
  both) rows="sqlite sqlite-full postgres postgres-async" ;;
  *) echo "bench/api/stores.sh: DB=$DB: postgres or both" >&2; exit 2 ;;
esac
if [ "${SMOKE:-0}" = 1 ]; then DUR=${DUR:-1}; else DUR=${DUR:-10}; fi

dir=$(mktemp -d /tmp/ty_bench_stores.XXXXXX)
chmod 711 "$dir" # pg-dev.sh: postgres (as root) reaches its own folders in it
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
  [ -d "$dir/pg" ] && scripts/pg-dev.sh stop "$dir/pg" >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

case " $rows " in
  *" postgres "*)
    scripts/pg-dev.sh start "$dir/pg" >"$dir/pg.env" # durable: PG_DEV_FAST unset
    # shellcheck disable=SC1091
    . "$dir/pg.env"
    export PGPASSFILE
    ASYNC_URL="$DATABASE_URL&options=-c%20synchronous_commit%3Doff"
    # libpq gives the option to the session: what the server's sessions get
    got=$("${PG_DEV_BIN:-/usr/lib/postgresql/15/bin}/psql" -X -Atc 'SHOW synchronous_commit' "$ASYNC_URL")
    [ "$got" = off ] || { echo "bench/api/stores.sh: synchronous_commit is '$got' through $ASYNC_URL" >&2; exit 1; }
    ;;
esac

# start ROW: a server on that row's store, URL and TOKEN set
start() {
  local data=$dir/data-$1 args=()
  # the PostgreSQL rows share one data directory: the database's tokens are
  # in the files of the server that set it up (a later server makes none)
  case "$1" in postgres*) data=$dir/data-postgres ;; esac
  rm -f "$data/server.url"
  case "$1" in
    sqlite) ;;
    sqlite-full) args=(--durability full) ;;
    postgres) args=(--db "$DATABASE_URL") ;;
    postgres-async) args=(--db "$ASYNC_URL") ;;
  esac
  mkdir -p "$data"
  "$BIN" server --listen 127.0.0.1:0 --data "$data" "${args[@]}" 2>>"$dir/server-$1.log" &
  pid=$!
  # a server on PostgreSQL listens (server.url) before it leads; its tokens
  # are made once it leads (the previous row's server gave the lease back)
  for _ in $(seq 300); do
    [ -s "$data/server.url" ] && [ -s "$data/token" ] && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if ! [ -s "$data/server.url" ] || ! [ -s "$data/token" ]; then
    echo "bench/api/stores.sh: the server on $1 did not start:" >&2
    tail -20 "$dir/server-$1.log" >&2
    exit 1
  fi
  URL=$(cat "$data/server.url")
  TOKEN=$(cat "$data/token")
}

stop() {
  kill -TERM "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
}

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

: >"$dir/results"
for row in $rows; do
  start "$row"
  id=$(curl -sf -X POST "$URL/api/v1/jobs" -H "Authorization: Bearer $TOKEN" --data @examples/synthetic_binary.json |
       python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
  echo "== $row: GET /api/v1/jobs/$id  (wrk -t2 -c32 -d${DUR}s)"
  wrk -t2 -c32 -d"${DUR}s" --latency -H "Authorization: Bearer $TOKEN" "$URL/api/v1/jobs/$id" >"$dir/get-$row.txt"
  grep -E 'Requests/sec|  (50|99)%|Non-2xx' "$dir/get-$row.txt" || true
  echo "== $row: POST /api/v1/jobs  (wrk -t2 -c8 -d${DUR}s)"
  SPEC=examples/synthetic_binary.json wrk -t2 -c8 -d"${DUR}s" --latency -s bench/api/submit.lua \
      -H "Authorization: Bearer $TOKEN" "$URL/api/v1/jobs" >"$dir/post-$row.txt"
  grep -E 'Requests/sec|  (50|99)%|Non-2xx|^non-201' "$dir/post-$row.txt" || true
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "bench/api/stores.sh: the server on $row exited during the load:" >&2
    tail -20 "$dir/server-$row.log" >&2
    exit 1
  fi
  read -r g_rps g_p50 g_p99 < <(parse "$dir/get-$row.txt")
  g_non2xx=$(grep -o 'Non-2xx or 3xx responses: [0-9]*' "$dir/get-$row.txt" | grep -o '[0-9]*$' || echo 0)
  read -r p_rps p_p50 p_p99 < <(parse "$dir/post-$row.txt")
  non2xx=$(grep -o 'Non-2xx or 3xx responses: [0-9]*' "$dir/post-$row.txt" | grep -o '[0-9]*$' || echo 0)
  stop
  echo "$row $g_rps $g_p50 $g_p99 $p_rps $p_p50 $p_p99 $non2xx $g_non2xx" >>"$dir/results"
done

python3 - "$dir/results" "$DUR" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    f = line.split()
    num = lambda v: None if v == "None" else round(float(v), 3)
    rows[f[0]] = {"get_rps": num(f[1]), "get_p50_ms": num(f[2]), "get_p99_ms": num(f[3]),
                  "submit_rps": num(f[4]), "submit_p50_ms": num(f[5]), "submit_p99_ms": num(f[6]),
                  "submit_non2xx": int(f[7]), "get_non2xx": int(f[8])}
what = {"sqlite": "SQLite, WAL, synchronous=NORMAL (default)",
        "sqlite-full": "SQLite, WAL, synchronous=FULL (--durability full)",
        "postgres": "PostgreSQL 15, synchronous_commit=on (default)",
        "postgres-async": "PostgreSQL 15, synchronous_commit=off"}
print("\n| store | GET/s | GET p50 / p99 ms | submit/s | submit p50 / p99 ms | non-2xx (GET, submit) |")
print("| --- | --- | --- | --- | --- | --- |")
for k, r in rows.items():
    print("| %s | %.0f | %s / %s | %.0f | %s / %s | %d, %d |" % (what[k], r["get_rps"], r["get_p50_ms"], r["get_p99_ms"],
          r["submit_rps"], r["submit_p50_ms"], r["submit_p99_ms"], r["get_non2xx"], r["submit_non2xx"]))
def ratio(a, b, k):
    if a not in rows or b not in rows or not rows[b][k] or rows[a][k] is None: return None
    return round(rows[a][k] / rows[b][k], 3)
ratios = {}
for a, b in (("postgres", "sqlite-full"), ("postgres-async", "sqlite"), ("postgres", "sqlite")):
    if a in rows and b in rows:
        ratios["%s/%s" % (a, b)] = {k: ratio(a, b, k) for k in ("get_rps", "get_p99_ms", "submit_rps", "submit_p99_ms")}
for k, r in ratios.items():
    print("ratio %s: submissions %.2fx, GETs %.2fx" % (k, r["submit_rps"] or 0, r["get_rps"] or 0))
print(json.dumps({"bench": "api-stores", "duration_s": int(sys.argv[2]), "rows": rows, "ratio": ratios},
                 separators=(",", ":")))
PY
