#!/usr/bin/env bash
# bench_smoke.sh - every `make bench-*` target of the Makefile in its smoke
# form (SMOKE=1: the smallest sizes, one round; seconds each) on the
# optimized build, so that a benchmark that no longer builds or runs is seen
# by `make test` (tests/run_all.sh calls this) and not by the next person who
# wants its figure. A target fails when make fails or when the last line it
# prints is not a JSON object (every benchmark ends with its result line).
# The list comes from the Makefile itself: a new bench-* target is covered
# without an edit here. BENCH_SMOKE="bench-api bench-sched" runs only those.
# bench-api and bench-sched-db run a second time with DB=postgres (below).
# Two need what not every machine has, and say SKIP instead: bench-images and
# bench-isolation need root; bench-gpu prints a "skipped" result without a GPU
# (its programs are still built: `make gpu-build` needs the CUDA toolkit).
set -uo pipefail
cd "$(dirname "$0")/.."
targets=${BENCH_SMOKE:-$(grep -oE '^bench-[a-z0-9-]+:' Makefile | tr -d : | grep -vE '^bench-(bins|smoke)$' | sort -u)}
log=$(mktemp -d /tmp/ty_bench_smoke.XXXXXX)
trap 'rm -rf "$log"' EXIT
fail=0
# smoke NAME [VAR=VALUE...]: make NAME in its smoke form, with those variables
smoke() {
  local t=$1 name=$1
  shift
  [ $# -gt 0 ] && name="$t $*"
  local out=$log/$(printf '%s' "$name" | tr -c 'a-zA-Z0-9_-' _).out
  local start code secs last
  start=$(date +%s.%N)
  SMOKE=1 timeout 600 make --no-print-directory "$t" "$@" </dev/null >"$out" 2>&1
  code=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  last=$(grep -v '^[[:space:]]*$' "$out" | tail -1)
  if [ $code -ne 0 ] || ! printf '%s' "$last" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); sys.exit(not isinstance(d, dict))' 2>/dev/null; then
    echo "bench_smoke: $name: FAILED (exit $code, ${secs}s; last line: ${last:0:200})"
    tail -30 "$out" | sed 's/^/    /'
    fail=1
  else
    echo "bench_smoke: $name: ok (${secs}s) ${last:0:160}"
  fi
}
for t in $targets; do
  if [ "$(id -u)" != 0 ] && { [ "$t" = bench-images ] || [ "$t" = bench-isolation ]; }; then
    echo "bench_smoke: $t: SKIP (needs root)"; continue
  fi
  if [ "$t" = bench-gpu ] && ! { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
    echo "bench_smoke: $t: SKIP (no CUDA toolkit: its programs cannot be built)"; continue
  fi
  smoke "$t"
done
# The two with a PostgreSQL form (DB=postgres: a real PostgreSQL 15 started by
# scripts/pg-dev.sh, durable; bench-api runs its stores' rows, bench-sched-db
# its passes with synchronous_commit on and off), with BENCH_SMOKE_PG=1 (make
# test-pg; make test's budget has no room for their ~40 s, and their targets
# smoke-run above): SKIP without PostgreSQL 15, a failure then with
# PG_TEST_REQUIRED=1, as tests/schema_pg_check.py.
for t in bench-api bench-sched-db; do
  [ "${BENCH_SMOKE_PG:-0}" = 1 ] || continue
  case " $targets " in *" $t "*) ;; *) continue ;; esac
  if ! [ -x "${PG_DEV_BIN:-/usr/lib/postgresql/15/bin}/initdb" ]; then
    if [ "${PG_TEST_REQUIRED:-0}" = 1 ]; then
      echo "bench_smoke: $t DB=postgres: FAILED (no PostgreSQL 15 and PG_TEST_REQUIRED=1)"; fail=1
    else
      echo "bench_smoke: $t DB=postgres: SKIP (no PostgreSQL 15: install postgresql-15)"
    fi
    continue
  fi
  smoke "$t" DB=postgres
done
exit $fail
