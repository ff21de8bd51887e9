#!/usr/bin/env bash
# run.sh - what isolating a task costs (bench/isolation/start_cost.c): the
# per-task start and end work of executor/isolate.c beside a plain fork and
# exec, on this machine's cgroups. Needs root.
#
#   sudo bench/isolation/run.sh          ROUNDS=500 sudo bench/isolation/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
make --no-print-directory -s -j2 build/obj/executor/isolate.o $(ls common/*.c | sed 's|\(.*\)\.c|build/obj/\1.o|')
mkdir -p build/bench
cc -std=gnu11 -O2 -D_GNU_SOURCE -I. $(pkg-config --cflags libcjson) -o build/bench/isolation_start_cost \
   bench/isolation/start_cost.c build/obj/executor/isolate.o build/obj/common/*.o \
   $(pkg-config --libs libcjson libcurl openssl) -lz -lm -lpthread
build/bench/isolation_start_cost "${ROUNDS:-200}"
