#!/usr/bin/env bash
# run.sh - what a resize of an elastic job costs on `trainyard up`
# (bench/elastic/resize_cost.py): a job of 1-2 workers grown, shrunk and grown
# again by a blocker and an urgent job, beside a fixed 2-worker run of the
# same spec in the same run. Prints one JSON object last.
#
#   bench/elastic/run.sh            EPOCHS=100 bench/elastic/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory -s -j2 CUDA=0 build/trainyard
# SMOKE=1 (make test): 20 epochs, enough for the grow, the shrink and the grow again
[ "${SMOKE:-0}" = 1 ] && export EPOCHS=20
exec /usr/bin/python3 bench/elastic/resize_cost.py "$PWD/build/trainyard"
