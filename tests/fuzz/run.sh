#!/usr/bin/env bash
# run.sh BUILD SECONDS TARGET... - runs each libFuzzer target in turn for
# SECONDS (-max_total_time) on its seed corpus (tests/fuzz/corpus/NAME, read
# only) plus a work corpus (BUILD/corpus/NAME), with its dictionary when there
# is one. Logs: BUILD/logs/NAME.log; a crashing input: BUILD/artifacts/.
# Prints one summary line per target (also appended to BUILD/summary.txt) and
# exits 1 when any target found a crash, leak, UB, timeout or OOM.
set -uo pipefail
build=$1 secs=$2
shift 2
mkdir -p "$build/logs" "$build/artifacts"
failed=()
for t in "$@"; do
  name=${t#fuzz_}
  seeds=tests/fuzz/corpus/$name
  work=$build/corpus/$name
  mkdir -p "$work"
  args=(-max_total_time="$secs" -timeout=25 -rss_limit_mb=2560 -print_final_stats=1
        -artifact_prefix="$build/artifacts/$name-")
  [ -f "tests/fuzz/$name.dict" ] && args+=(-dict="tests/fuzz/$name.dict")
  [ -f "tests/fuzz/$name.options" ] && read -r -a extra < "tests/fuzz/$name.options" && args+=("${extra[@]}")
  log=$build/logs/$name.log
  echo "fuzz: $t for ${secs}s (log $log)"
  "$build/$t" "${args[@]}" "$work" $( [ -d "$seeds" ] && echo "$seeds" ) > "$log" 2>&1
  rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<< "$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<< "$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\).*/\1/p' <<< "$last")
  line="$t: rc=$rc secs=$secs execs=${execs:-?} exec/s=${rate:-?} cov=${cov:-?} ft=${ft:-?} corpus=${corp:-?}"
  echo "$line" | tee -a "$build/summary.txt"
  if [ $rc -ne 0 ]; then
    failed+=("$t")
    grep -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error|SUMMARY|Test unit written' "$log" | head -8
  fi
done
if [ ${#failed[@]} -ne 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}"
  exit 1
fi
echo "fuzz: all ${#} target(s) ran clean"
