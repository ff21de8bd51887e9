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
# SMOKE=1 (make test) keeps the 60 epochs: the scenario needs the elastic job
# still training when the urgent job arrives (20 epochs end in 6 s on a quiet
# 2-core machine, before the shrink it waits for)
exec /usr/bin/python3 bench/elastic/resize_cost.py "$PWD/build/trainyard"
