#!/usr/bin/env bash
# run.sh - build the scheduler simulator against the project's optimized
# objects and run it (make bench-sched). Extra arguments go to the simulator:
#   bench/sched_sim/run.sh --nodes 1000 --gpus 8 --jobs 10000 --seed 42
# `bench/sched_sim/run.sh db [--nodes N --jobs J]` times the SQLite pass instead.
set -euo pipefail
cd "$(dirname "$0")/../.."
objs_of() { for f in "$@"; do echo "build/obj/${f%.c}.o"; done; }
mkdir -p build/bench
CFLAGS="-std=gnu11 -O2 -g -D_GNU_SOURCE -I. -Wall -Wextra -Werror -Wshadow"
if [ "${1:-}" = db ]; then
  shift
  objs=$(objs_of common/*.c storage/*.c scheduler/*.c spec/jobspec.c)
  make --no-print-directory $objs >/dev/null
  cc $CFLAGS -o build/bench/sched_db_pass bench/sched_sim/db_pass.c $objs -lsqlite3 -lcjson -lcrypto -lm -lpthread
  exec build/bench/sched_db_pass "$@"
fi
make --no-print-directory build/obj/scheduler/core.o build/obj/common/util.o >/dev/null
cc $CFLAGS -o build/bench/sched_sim bench/sched_sim/sim.c \
   build/obj/scheduler/core.o build/obj/common/util.o -lcrypto -lm
exec build/bench/sched_sim "$@"
