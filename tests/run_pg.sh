#!/usr/bin/env bash
# run_pg.sh BUILD [SUITE...] - test binaries of a build on PostgreSQL: starts
# one PostgreSQL 15 (PG_DEV_FAST=1 scripts/pg-dev.sh start in a mktemp -d),
# runs each suite (a name such as check_http, default: every check_* of
# BUILD/tests) one after the other with TY_PG_URL set to its DATABASE_URL
# (tests/pg_fixture.h: each test, each server takes a fresh database), and
# stops it at the end, whatever happens (a trap). Fails if any suite fails.
# Without PostgreSQL each suite says SKIP, or fails under PG_TEST_REQUIRED=1.
#
# PG_RESULTS=DIR (tests/run_all.sh's PostgreSQL lane): each suite's output in
# DIR/NAME.out and a line "NAME RC SECONDS" in DIR/results, nothing printed;
# otherwise each output is printed as it ends. Run from the checkout's root,
# with the environment tests/run_all.sh gives (TRAINYARD_BIN and the rest).
set -u
build=${1:?usage: tests/run_pg.sh BUILD [SUITE...]}
shift
suites=()
if [ $# -gt 0 ]; then
  for n in "$@"; do suites+=("$build/tests/$n"); done
else
  for t in "$build"/tests/check_*; do [ -x "$t" ] && suites+=("$t"); done
fi
export TRAINYARD_BIN=${TRAINYARD_BIN:-$PWD/$build/trainyard}
# the environment tests/run_all.sh gives the suites, for a run by hand
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OPENBLAS_NUM_THREADS=1
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}
out=${PG_RESULTS:-}
own_out=0
if [ -z "$out" ]; then out=$(mktemp -d /tmp/ty_pg_results.XXXXXX); own_out=1; fi
pg_dir=$(mktemp -d /tmp/ty_pglane.XXXXXX)
cleanup() {
  scripts/pg-dev.sh stop "$pg_dir" >>"$out/pg-dev.out" 2>&1
  rm -rf "$pg_dir"
  [ $own_out = 0 ] || rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
bin=${PG_DEV_BIN:-/usr/lib/postgresql/15/bin}
why=""
if [ ! -x "$bin/postgres" ]; then
  why="no PostgreSQL 15 ($bin/postgres; package postgresql-15)"
elif ! env_out=$(PG_DEV_FAST=1 scripts/pg-dev.sh start "$pg_dir" 2>>"$out/pg-dev.out"); then
  why="scripts/pg-dev.sh start failed: $(tail -n 3 "$out/pg-dev.out")"
else
  TY_PG_URL=$(sed -n 's/^DATABASE_URL=//p' <<<"$env_out")
  export TY_PG_URL
fi
fail=0
for t in "${suites[@]}"; do
  n=$(basename "$t")
  start=$(date +%s)
  if [ -n "$why" ]; then
    echo "SKIP: $why" >"$out/$n.out"
    if [ "${PG_TEST_REQUIRED:-0}" = 1 ]; then r=1; else r=0; fi
  elif [ ! -x "$t" ]; then
    echo "$t: not built" >"$out/$n.out"
    r=1
  elif "$t" >"$out/$n.out" 2>&1 </dev/null; then r=0; else r=1; fi
  secs=$(( $(date +%s) - start ))
  echo "$n $r $secs" >>"$out/results"
  [ $r = 0 ] || fail=1
  if [ -z "${PG_RESULTS:-}" ]; then
    echo "== $n on PostgreSQL"
    cat "$out/$n.out"
    [ $r = 0 ] || echo "FAILED: $t on PostgreSQL"
    echo "   (${secs}s)"
  fi
done
exit $fail
