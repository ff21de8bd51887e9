#!/usr/bin/env bash
# run_all.sh BUILD - run every test binary of a build; fail if any fails.
# The integration tests find the server binary through TRAINYARD_BIN.
set -u
build=${1:-build/asan}
# Run as root, the agents of the integration tests isolate tasks: each runs
# under a uid of its own and reads the agent's data root, which is this
# checkout. A checkout only root can enter (a mktemp -d directory, 0700) is
# opened to the others (o+rx on the checkout itself, nothing above it); when a
# parent still shuts them out (a clone in /root), say so rather than fail
# every command job with "permission denied".
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  as_task() { setpriv --reuid 65534 --regid 65534 --clear-groups -- "$@"; }
  if ! as_task test -r "$PWD" -a -x "$PWD"; then
    chmod o+rx "$PWD"
    echo "run_all: made $PWD readable to the tasks' uids (chmod o+rx): isolated tasks read the agent's data root"
  fi
  if ! as_task test -r "$PWD" -a -x "$PWD"; then
    echo "run_all: $PWD is not reachable by other uids (a parent directory is closed to them):" \
         "tasks isolated under their own uids cannot read the data root; clone under a directory they can" \
         "enter (e.g. /srv, /opt, /tmp) or run the tests as a user" >&2
    exit 1
  fi
fi
export TRAINYARD_BIN="$PWD/$build/trainyard"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export OPENBLAS_NUM_THREADS=1
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-120}
fail=0; passed=0; failed=0
# the npm packages of package-lock.json before the suites: tests/check_oidc.c
# runs a real OpenID Provider (oidc-provider) with node, and with them here
# it must run rather than say SKIP (OIDC_TEST_REQUIRED)
if command -v node >/dev/null && command -v npm >/dev/null; then
  if [ ! -d node_modules/oidc-provider ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm ci --no-audit --no-fund --loglevel=error || echo "run_all: npm ci failed"
  fi
  export OIDC_TEST_REQUIRED=1
fi
# the S3 store of the blob tests: a one-node Ceph (scripts/s3-dev.sh, tests/s3_fixture.h);
# with radosgw here, as root (its daemons need it), the suites must run it rather
# than say SKIP (S3_TEST_REQUIRED); as a user they say SKIP
if [ "$(id -u)" = 0 ] && command -v radosgw >/dev/null; then
  export S3_TEST_REQUIRED=1
fi
# PostgreSQL (scripts/pg-dev.sh): as root with postgresql-15 here, the suites
# that run on it (the PG lane below, tests/schema_pg_check.py) must run rather
# than say SKIP (PG_TEST_REQUIRED)
if [ "$(id -u)" = 0 ] && [ -x /usr/lib/postgresql/15/bin/postgres ]; then
  export PG_TEST_REQUIRED=1
fi
# the include graph: no circle of modules or folders, each room within CONTRIBUTING.md's table (tests/include_graph.py)
if [ "${INCLUDE_GRAPH_TEST:-1}" != 0 ]; then
  echo "== tests/include_graph.py"
  start=$(date +%s)
  if python3 tests/include_graph.py; then passed=$((passed+1)); else failed=$((failed+1)); fail=1; echo "FAILED: tests/include_graph.py"; fi
  echo "   ($(( $(date +%s) - start ))s)"
fi
# the PostgreSQL baseline against the migrated SQLite schema, with its fence, change capture and JSON helpers, on a real PostgreSQL 15 (tests/schema_pg_check.py: SKIP without /usr/lib/postgresql/15/bin unless PG_TEST_REQUIRED=1)
if [ "${SCHEMA_PG_TEST:-1}" != 0 ]; then
  echo "== tests/schema_pg_check.py"
  start=$(date +%s)
  if python3 tests/schema_pg_check.py "$build"; then passed=$((passed+1)); else failed=$((failed+1)); fail=1; echo "FAILED: tests/schema_pg_check.py"; fi
  echo "   ($(( $(date +%s) - start ))s)"
fi
# every benchmark in its smoke form on the optimized build (tests/bench_smoke.sh),
# in the background beside everything below, niced: it only asks that each
# benchmark runs and prints its JSON line (its figures are not taken here;
# alone it is 3 to 4 minutes). What it builds is built first, here (the
# optimized build, the benchmarks' programs, and the GPU programs that
# bench-gpu and the GPU bundle share), so that no two makes write the same
# file; the benchmarks use ports and network names of their own (port 0,
# ty-hb*), as the checks do.
bench_pid=""
if [ "${BENCH_SMOKE_TEST:-1}" != 0 ]; then
  echo "== the benchmarks' programs (built before bench_smoke and the checks beside it)"
  start=$(date +%s)
  make --no-print-directory -s -j2 all bench-bins build/bench/simagents >/dev/null
  if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
    make --no-print-directory -s -j2 gpu-build >/dev/null
  fi
  echo "   ($(( $(date +%s) - start ))s)"
  bench_log=$(mktemp /tmp/ty_bench_smoke_log.XXXXXX)
  bench_start=$(date +%s)
  nice -n 10 make --no-print-directory -s bench-smoke >"$bench_log" 2>&1 </dev/null &
  bench_pid=$!
  echo "== tests/bench_smoke.sh (make bench-smoke): started beside the checks below"
fi
# The waiting lane: the suites on a real S3 store (those that include
# tests/s3_fixture.h: a one-node Ceph each, mostly waiting on radosgw and their
# jobs), the failover tests (tests/check_ha.c: two servers, a PostgreSQL and
# two agents in network namespaces, waiting out two 6-second leases, about
# 70 s; tests/check_failover_client.c: clients waiting out their retry
# budgets), then the GPU bundle (tests/gpu_bundle.sh: built, self-contained,
# its verify.sh run), the TLS scan (tests/testssl.sh: the HTTPS server's
# protocols, ciphers and known vulnerabilities) and every command block of
# README.md run as written against `make run`'s service (tests/readme_check.py:
# port 8080, or a free one when it is taken). They run one after the other in
# the background, niced, beside the checks of the loop below, and are
# reported after it; the loop skips the check binaries among them.
# S3_BESIDE=0: all of them in the loop's place instead, one after the other.
s3_suites=()
for t in "$build"/tests/check_*; do
  [ -x "$t" ] || continue
  src="tests/$(basename "$t").c"
  case "$(basename "$t")" in check_ha|check_failover_client) s3_suites+=("$t"); continue ;; esac
  [ -f "$src" ] && grep -q '"s3_fixture.h"' "$src" && s3_suites+=("$t")
done
# the scripts of the lane, after its check binaries
lane_scripts=()
[ "${GPU_BUNDLE_TEST:-1}" != 0 ] && lane_scripts+=(tests/gpu_bundle.sh)
[ "${TESTSSL_TEST:-1}" != 0 ] && lane_scripts+=(tests/testssl.sh)
[ "${README_TEST:-1}" != 0 ] && lane_scripts+=(tests/readme_check.py)
# lane_run NAME: one check binary or script of the lane
lane_run() {
  case "$1" in
    tests/gpu_bundle.sh) tests/gpu_bundle.sh ;;
    tests/testssl.sh) tests/testssl.sh "$build" ;;
    tests/readme_check.py) python3 tests/readme_check.py "$build" ;;
    *) "$build/tests/$1" ;;
  esac
}
# lane_report NAME LOG: what the lane's NAME printed, and its result
lane_report() {
  local n=$1 log=$2 res
  echo "== $n (beside the checks above)"
  cat "$log/${n//\//_}.out" 2>/dev/null
  res=$(awk -v n="$n" '$1 == n { print $2, $3 }' "$log/results" 2>/dev/null)
  if [ "${res%% *}" = 0 ]; then passed=$((passed+1)); else failed=$((failed+1)); fail=1; echo "FAILED: $n"; fi
  echo "   (${res##* }s)"
}
lane_names=()
for t in "${s3_suites[@]}"; do lane_names+=("$(basename "$t")"); done
lane_names+=("${lane_scripts[@]}")
s3_pid=""
if [ ${#lane_names[@]} -gt 0 ] && [ "${S3_BESIDE:-1}" != 0 ]; then
  s3_log=$(mktemp -d /tmp/ty_s3_suites.XXXXXX)
  (
    # niced, and all it starts: the loop's checks that time their own work come first
    renice -n 10 -p "$BASHPID" >/dev/null
    for n in "${lane_names[@]}"; do
      start=$(date +%s)
      if lane_run "$n" >"$s3_log/${n//\//_}.out" 2>&1; then r=0; else r=1; fi
      echo "$n $r $(( $(date +%s) - start ))" >>"$s3_log/results"
    done
  ) </dev/null &
  s3_pid=$!
  echo "== the waiting lane (${lane_names[*]}): started beside the checks below"
fi
# The PostgreSQL lane: the store, the scheduler and the API suites again, on
# one real PostgreSQL 15 (tests/run_pg.sh: PG_DEV_FAST=1 scripts/pg-dev.sh
# start in a mktemp -d, stopped when the lane ends, whatever happens) whose
# DATABASE_URL they get as TY_PG_URL: each test and each server takes a fresh
# database of it (tests/pg_fixture.h). The same binaries run on SQLite in the
# loop below; the lane runs them one after the other in the background beside
# it (mostly waiting on its servers and their jobs) and is reported after it.
# PG_LANE=0: no lane; PG_SUITES="check_x ...": another list. The five here
# (the store, the scheduler, submit/list/cancel/place, heartbeats and
# tokens) are what make test's 15 minutes leave room for beside the S3
# suites and the failover test; make test-pg runs every suite on
# PostgreSQL (measured alone on 2 cores, sanitized: nine of them took
# 86-114 s and about 50 s of CPU). Without PostgreSQL they say SKIP, or fail
# under PG_TEST_REQUIRED=1. docs/postgres.md, "Tests on PostgreSQL".
pg_suites=()
for n in ${PG_SUITES:-check_storage check_sched check_http check_tokens check_cluster_http}; do
  [ -x "$build/tests/$n" ] && pg_suites+=("$n")
done
pg_pid=""
if [ ${#pg_suites[@]} -gt 0 ] && [ "${PG_LANE:-1}" != 0 ]; then
  pg_log=$(mktemp -d /tmp/ty_pg_suites.XXXXXX)
  # niced: the loop's checks that time their own work (CPU shares, a
  # console's first seconds) come first when both want the 2 cores
  PG_RESULTS=$pg_log nice -n 10 tests/run_pg.sh "$build" "${pg_suites[@]}" </dev/null >"$pg_log/lane.out" 2>&1 &
  pg_pid=$!
  trap 'kill -TERM "$pg_pid" 2>/dev/null; wait "$pg_pid"; exit 130' INT TERM
  echo "== the PostgreSQL lane (${pg_suites[*]}): started beside the checks below"
fi
# The browser lane: the dashboard in headless Chromium, the OpenAPI
# validator, the API contract (tests/web/run.sh: each file starts servers of
# its own on free ports, and waits on them and their jobs), in the background,
# niced, beside the loop; reported after it. WEB_TESTS=0: not run.
web_pid=""
if [ "${WEB_TESTS:-1}" != 0 ] && [ -x tests/web/run.sh ]; then
  web_log=$(mktemp /tmp/ty_web_log.XXXXXX)
  web_start=$(date +%s)
  nice -n 10 tests/web/run.sh "$build" </dev/null >"$web_log" 2>&1 &
  web_pid=$!
  echo "== tests/web (browser, openapi): started beside the checks below"
fi
for t in "$build"/tests/check_*; do
  [ -x "$t" ] || continue
  if [ -n "$s3_pid" ] && [[ " ${s3_suites[*]} " == *" $t "* ]]; then continue; fi
  echo "== $(basename "$t")"
  start=$(date +%s)
  if "$t"; then passed=$((passed+1)); else failed=$((failed+1)); fail=1; echo "FAILED: $t"; fi
  echo "   ($(( $(date +%s) - start ))s)"
done
if [ -n "$s3_pid" ]; then
  lane_wait_start=$(date +%s)
  wait "$s3_pid" || true
  echo "== the waiting lane: ended $(( $(date +%s) - lane_wait_start ))s after the checks above"
  for n in "${lane_names[@]}"; do lane_report "$n" "$s3_log"; done
  rm -rf "$s3_log"
else
  # S3_BESIDE=0: its check binaries ran in the loop; its scripts here
  for n in "${lane_scripts[@]}"; do
    echo "== $n"
    start=$(date +%s)
    if lane_run "$n"; then passed=$((passed+1)); else failed=$((failed+1)); fail=1; echo "FAILED: $n"; fi
    echo "   ($(( $(date +%s) - start ))s)"
  done
fi
if [ -n "$pg_pid" ]; then
  pg_wait_start=$(date +%s)
  wait "$pg_pid" || true
  trap - INT TERM
  echo "== the PostgreSQL lane: ended $(( $(date +%s) - pg_wait_start ))s after the checks above"
  cat "$pg_log/lane.out"
  for n in "${pg_suites[@]}"; do
    echo "== $n on PostgreSQL (beside the checks above)"
    cat "$pg_log/$n.out" 2>/dev/null
    res=$(awk -v n="$n" '$1 == n { print $2, $3 }' "$pg_log/results" 2>/dev/null)
    if [ "${res%% *}" = 0 ]; then passed=$((passed+1)); else failed=$((failed+1)); fail=1; echo "FAILED: $n on PostgreSQL"; fi
    echo "   (${res##* }s)"
  done
  rm -rf "$pg_log"
fi
# bg_report NAME PID LOG START: a background run's wait, output and result
bg_report() {
  local name=$1 pid=$2 log=$3 began=$4 waited ok=1
  waited=$(date +%s)
  wait "$pid" || ok=0
  echo "== $name (ended $(( $(date +%s) - waited ))s after the checks above)"
  cat "$log"
  rm -f "$log"
  if [ $ok = 1 ]; then passed=$((passed+1)); else failed=$((failed+1)); fail=1; echo "FAILED: $name"; fi
  echo "   ($(( $(date +%s) - began ))s, beside the checks above)"
}
[ -n "$bench_pid" ] && bg_report "tests/bench_smoke.sh (make bench-smoke)" "$bench_pid" "$bench_log" "$bench_start"
[ -n "$web_pid" ] && bg_report "tests/web (browser, openapi)" "$web_pid" "$web_log" "$web_start"
# thousands of agents, in small: 200 simulated agents against this build's server
# (tests/cluster_sim.sh); its heartbeats have a 6 s deadline: it runs alone,
# after every lane has ended
if [ "${CLUSTER_SIM_TEST:-1}" != 0 ]; then
  echo "== tests/cluster_sim.sh"
  start=$(date +%s)
  if tests/cluster_sim.sh "$build"; then passed=$((passed+1)); else failed=$((failed+1)); fail=1; echo "FAILED: tests/cluster_sim.sh"; fi
  echo "   ($(( $(date +%s) - start ))s)"
fi
echo "$passed passed, $failed failed"
exit $fail
