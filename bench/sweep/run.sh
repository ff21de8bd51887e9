#!/usr/bin/env bash
# run.sh - ASHA against the full grid on Fashion-MNIST (docs/sweeps.md, "Speed:
# ASHA against the full grid"): a grid of 12 trials (4 learning rates x 3
# batch sizes of a small MLP), every trial training max_epochs epochs, then
# ASHA over the same values (12 trials, each drawn from them; η 3, rungs 1,
# 3, 9), each on its own `trainyard up --cpu-slots 2` with 2 trials at a time. Prints and writes to
# bench/sweep/results/<date>-<host>.txt: both best validation accuracies,
# the epochs each trained in all, both wall times, and the checks (ASHA's best
# within 0.005 of the grid's, at most 40% of its epochs; exit 1 if not).
#
#   bench/sweep/run.sh                     (make bench-sweep)
#   BIN=build/other/trainyard EPOCHS=9 LIMIT=10000 bench/sweep/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/build/trainyard}
[ -x "$BIN" ] || { echo "bench-sweep: $BIN is missing: build it (make) or set BIN" >&2; exit 1; }
mkdir -p bench/sweep/results
out=bench/sweep/results/$(date -u +%Y-%m-%d)-$(hostname -s).txt
BIN=$BIN exec /usr/bin/python3 bench/sweep/sweep_bench.py "$out"
