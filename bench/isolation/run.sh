#!/usr/bin/env bash
# run.sh - what isolating a task costs (bench/isolation/start_cost.c): the
# per-task start and end work of executor/isolate.c beside a plain fork and
# exec, on this machine's cgroups. Needs root.
#
#   sudo bench/isolation/run.sh          ROUNDS=500 sudo bench/isolation/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
# built by the Makefile (the tree's one link list)
make --no-print-directory -s -j2 build/bench/isolation_start_cost
# SMOKE=1 (make test): 10 rounds
[ "${SMOKE:-0}" = 1 ] && ROUNDS=10
build/bench/isolation_start_cost "${ROUNDS:-200}"
