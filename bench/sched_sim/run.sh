#!/usr/bin/env bash
# run.sh - build the scheduler simulator against the project's optimized
# objects and run it (make bench-sched). Extra arguments go to the simulator:
#   bench/sched_sim/run.sh --nodes 1000 --gpus 8 --jobs 10000 --seed 42
# `bench/sched_sim/run.sh db [--nodes N --jobs J]` times the SQLite pass instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
# SMOKE=1 (make test): 100 nodes and 500 jobs, 3 passes of the db form
# the programs are built by the Makefile (the tree's one link list)
if [ "${1:-}" = db ]; then
  shift
  [ "${SMOKE:-0}" = 1 ] && set -- "$@" --nodes 100 --jobs 500 --passes 3   # the last value of a flag wins
  make --no-print-directory -s -j2 build/bench/sched_db_pass
  exec build/bench/sched_db_pass "$@"
fi
make --no-print-directory -s -j2 build/bench/sched_sim
[ "${SMOKE:-0}" = 1 ] && set -- "$@" --nodes 100 --jobs 500
exec build/bench/sched_sim "$@"
