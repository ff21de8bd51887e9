#!/usr/bin/env bash
# run.sh - ASHA against the full grid on Fashion-MNIST (docs/measurements.md,
# "Sweeps"), side by side: two search spaces of a small
# MLP, each run as a grid (every combination to 9 epochs) and as ASHA (the
# same combinations; η 3, rungs 1, 3, 9), each sweep on its own
# `trainyard up --cpu-slots 2` with 2 trials at a time, grid and ASHA
# alternating, three rounds:
#   small  6 learning rates x 2 batch sizes on a 4,000-image slice
#   full   4 learning rates x 3 batch sizes on all 60,000 images
# Prints and writes to bench/sweep/results/<date>-<host>.txt each sweep's
# wall time, epochs, best validation accuracy and where its trials' time
# went (per phase, from the jobs' timelines), the ratios and the checks
# (ASHA's best within 0.005 of the grid's, its wall time at most 60% and its
# epochs at most 40% of the grid's; exit 1 if not), then one JSON line last.
#
#   bench/sweep/run.sh                     (make bench-sweep)
#   SMOKE=1 bench/sweep/run.sh             one round of a tiny space, in seconds (still the JSON line)
#   BIN=build/other/trainyard ROUNDS=1 SPACES=small bench/sweep/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-$PWD/build/trainyard}
[ -x "$BIN" ] || { echo "bench-sweep: $BIN is missing: build it (make) or set BIN" >&2; exit 1; }
mkdir -p bench/sweep/results
out=bench/sweep/results/$(date -u +%Y-%m-%d)-$(hostname -s).txt
BIN=$BIN exec /usr/bin/python3 bench/sweep/sweep_bench.py "$out"
