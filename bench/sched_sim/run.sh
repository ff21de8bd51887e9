#!/usr/bin/env bash
# run.sh - build the scheduler simulator against the project's optimized
# objects and run it (make bench-sched). Extra arguments go to the simulator:
#   bench/sched_sim/run.sh --nodes 1000 --gpus 8 --jobs 10000 --seed 42
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory build/obj/scheduler/core.o build/obj/common/util.o >/dev/null
mkdir -p build/bench
cc -std=gnu11 -O2 -g -D_GNU_SOURCE -I. -Wall -Wextra -Werror -Wshadow \
   -o build/bench/sched_sim bench/sched_sim/sim.c \
   build/obj/scheduler/core.o build/obj/common/util.o -lcrypto -lm
exec build/bench/sched_sim "$@"
