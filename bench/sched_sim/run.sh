#!/usr/bin/env bash
# run.sh - build the scheduler simulator against the project's optimized
# objects and run it (make bench-sched). Extra arguments go to the simulator:
#   bench/sched_sim/run.sh --nodes 1000 --gpus 8 --jobs 10000 --seed 42
# `bench/sched_sim/run.sh db [--nodes N --jobs J]` times the pass over a store instead
# (SQLite; DB=postgres or DB=both below).
set -euo pipefail
cd "$(dirname "$0")/../.."
# SMOKE=1 (make test): 100 nodes and 500 jobs, 3 passes of the db form
# the programs are built by the Makefile (the tree's one link list)
# DB=postgres: the db form on a PostgreSQL 15 started here (scripts/pg-dev.sh,
# durable), with synchronous_commit on, then off; DB=both: SQLite first; one
# table and one JSON line with every run ({"sqlite", "postgres",
# "postgres_async", "ratio"}).
if [ "${1:-}" = db ]; then
  shift
  [ "${SMOKE:-0}" = 1 ] && set -- "$@" --nodes 100 --jobs 500 --passes 3   # the last value of a flag wins
  make --no-print-directory -s -j2 build/bench/sched_db_pass
  case "${DB:-sqlite}" in
    sqlite) exec build/bench/sched_db_pass "$@" ;;
    postgres | both) ;;
    *) echo "bench/sched_sim/run.sh: DB=$DB: sqlite (default), postgres or both" >&2; exit 2 ;;
  esac
  tmp=$(mktemp -d /tmp/ty_sched_db.XXXXXX)
  chmod 711 "$tmp" # pg-dev.sh: postgres (as root) reaches its own folders in it
  trap 'scripts/pg-dev.sh stop "$tmp/pg" >/dev/null 2>&1 || true; rm -rf "$tmp"' EXIT
  trap 'exit 130' INT TERM
  if [ "$DB" = both ]; then
    build/bench/sched_db_pass "$@" | tee "$tmp/sqlite.out"
  fi
  # twice, each on a new cluster: synchronous_commit on (PostgreSQL's default:
  # an fsync per commit, as SQLite's synchronous=FULL), then off for the
  # passes' session (libpq's options=-c; the peer of SQLite's default NORMAL,
  # docs/postgres.md "Speed"). PG_ASYNC=0 runs only the first.
  for sc in on off; do
    [ "$sc" = off ] && [ "${PG_ASYNC:-1}" = 0 ] && break
    scripts/pg-dev.sh start "$tmp/pg" >"$tmp/pg.env" # durable: PG_DEV_FAST unset
    # shellcheck disable=SC1091
    . "$tmp/pg.env"
    export PGPASSFILE
    url=$DATABASE_URL
    [ "$sc" = off ] && url="$url&options=-c%20synchronous_commit%3Doff"
    echo "== PostgreSQL, synchronous_commit=$sc"
    build/bench/sched_db_pass "$@" --db "$url" | tee "$tmp/pg-$sc.out"
    scripts/pg-dev.sh stop "$tmp/pg" >/dev/null
  done
  python3 - "$tmp" <<'PY'
import json, os, sys
def last(f):
    f = os.path.join(sys.argv[1], f)
    return json.loads(open(f).read().strip().splitlines()[-1]) if os.path.exists(f) else None
runs = [(k, last(f)) for k, f in (("sqlite", "sqlite.out"), ("postgres", "pg-on.out"), ("postgres_async", "pg-off.out"))]
runs = [(k, v) for k, v in runs if v]
def r(a, b): return round(a / b, 2) if b else None
names = {"sqlite": "SQLite (NORMAL)", "postgres": "PG (sync on)", "postgres_async": "PG (sync off)"}
print("\n| pass (ms) | " + " | ".join(names[k] for k, _ in runs) + " |")
print("| --- |" + " --- |" * len(runs))
for mode, what in (("mirror", "steady (the mirror)"), ("full_load", "loading everything")):
    for k in ("first_ms", "median_ms", "p99_ms", "cpu_median_ms", "upkeep_ms", "refresh_ms", "apply_ms", "committed_ms"):
        print("| %s %s | " % (what, k) + " | ".join("%.1f" % v[mode][k] for _, v in runs) + " |")
out = dict(runs)
s = out.get("sqlite")
if s:
    out["ratio"] = {k: {"mirror_median": r(v["mirror"]["median_ms"], s["mirror"]["median_ms"]),
                        "full_load_refresh": r(v["full_load"]["refresh_ms"], s["full_load"]["refresh_ms"])}
                    for k, v in runs if k != "sqlite"}
print(json.dumps(out, separators=(",", ":")))
PY
  exit 0
fi
make --no-print-directory -s -j2 build/bench/sched_sim
[ "${SMOKE:-0}" = 1 ] && set -- "$@" --nodes 100 --jobs 500
exec build/bench/sched_sim "$@"
