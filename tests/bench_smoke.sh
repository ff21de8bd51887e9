#!/usr/bin/env bash
# bench_smoke.sh - every `make bench-*` target of the Makefile in its smoke
# form (SMOKE=1: the smallest sizes, one round; seconds each) on the
# optimized build, so that a benchmark that no longer builds or runs is seen
# by `make test` (tests/run_all.sh calls this) and not by the next person who
# wants its figure. A target fails when make fails or when the last line it
# prints is not a JSON object (every benchmark ends with its result line).
# The list comes from the Makefile itself: a new bench-* target is covered
# without an edit here. BENCH_SMOKE="bench-api bench-sched" runs only those.
# Two need what not every machine has, and say SKIP instead: bench-images and
# bench-isolation need root; bench-gpu prints a "skipped" result without a GPU
# (its programs are still built: `make gpu-build` needs the CUDA toolkit).
set -uo pipefail
cd "$(dirname "$0")/.."
targets=${BENCH_SMOKE:-$(grep -oE '^bench-[a-z0-9-]+:' Makefile | tr -d : | grep -vE '^bench-(bins|smoke)$' | sort -u)}
log=$(mktemp -d /tmp/ty_bench_smoke.XXXXXX)
trap 'rm -rf "$log"' EXIT
fail=0
for t in $targets; do
  if [ "$(id -u)" != 0 ] && { [ "$t" = bench-images ] || [ "$t" = bench-isolation ]; }; then
    echo "bench_smoke: $t: SKIP (needs root)"; continue
  fi
  if [ "$t" = bench-gpu ] && ! { command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; }; then
    echo "bench_smoke: $t: SKIP (no CUDA toolkit: its programs cannot be built)"; continue
  fi
  start=$(date +%s.%N)
  SMOKE=1 timeout 600 make --no-print-directory "$t" </dev/null >"$log/$t.out" 2>&1
  code=$?
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
  last=$(grep -v '^[[:space:]]*$' "$log/$t.out" | tail -1)
  if [ $code -ne 0 ] || ! printf '%s' "$last" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); sys.exit(not isinstance(d, dict))' 2>/dev/null; then
    echo "bench_smoke: $t: FAILED (exit $code, ${secs}s; last line: ${last:0:200})"
    tail -30 "$log/$t.out" | sed 's/^/    /'
    fail=1
  else
    echo "bench_smoke: $t: ok (${secs}s) ${last:0:160}"
  fi
done
exit $fail
