#!/usr/bin/env bash
# run.sh - float32 sum all-reduce between 2 processes on this machine, in the
# same run: ours (executor/comm, COMM_TRANSPORT_AUTO = shared memory, on a plain
# buffer and on a comm_buffer, the latter also rewritten before each call as
# training does; COMM_TRANSPORT_TCP for information),
# torch.distributed with gloo, and OpenMPI's MPI_Allreduce (vader shared-memory
# transport). Sizes: 1 MiB, 0.94 MB (235,146 floats: the seed MLP's
# gradients), 16 MiB, 64 MiB. Each: warm-up calls, then REPS repetitions of
# about REP_MS ms between barriers; the median time per all-reduce. ROUNDS
# rounds alternate the implementations; summary.py reports medians over
# rounds and the median of each round's ratio. Bandwidth is algorithm
# bandwidth: bytes of the buffer / time per all-reduce.
#
#   bench/allreduce/run.sh          (or: make bench-allreduce)
#   ROUNDS=5 REPS=7 REP_MS=150 bench/allreduce/run.sh
#
# Installs what it lacks with apt-get (openmpi-bin libopenmpi-dev
# python3-torch; sudo when not root). The last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/allreduce
RANKS=2
ROUNDS=${ROUNDS:-5}
REPS=${REPS:-5}
REP_MS=${REP_MS:-100}
SIZES="1048576 940584 16777216 67108864"
# SMOKE=1 (make test): one round of one repetition at the smallest size, every implementation
if [ "${SMOKE:-0}" = 1 ]; then ROUNDS=1 REPS=1 REP_MS=5 SIZES=1048576; fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
need=()
# mpicc comes with openmpi-bin, its mpi.h with libopenmpi-dev: both are checked
{ command -v mpicc && command -v mpirun; } >/dev/null 2>&1 || need+=(openmpi-bin)
dpkg-query -W -f='${Status}' libopenmpi-dev 2>/dev/null | grep -q 'install ok installed' || need+=(libopenmpi-dev)
/usr/bin/python3 -c 'import torch' 2>/dev/null || need+=(python3-torch)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} with apt-get (first run only)"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
fi
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
case "$blas" in
  *openblas*) ;;
  *) echo "run.sh: libblas.so.3 is '${blas:-unknown}', not OpenBLAS (PyTorch's BLAS); aborting" >&2; exit 1 ;;
esac

# ours: built by the Makefile from the objects it builds (the collectives at
# -O3 -march=native) and the tree's one link list
make --no-print-directory -s -j2 build/bench/comm_bench
mpicc -std=gnu11 -O2 -Wall -Wextra -o build/bench/mpi_allreduce $here/mpi_allreduce.c

out=$(mktemp /tmp/allreduce_bench.XXXXXX)
trap 'rm -f "$out"' EXIT
echo "== $(date -u +%FT%TZ), $(getconf _NPROCESSORS_ONLN) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $RANKS processes, $ROUNDS rounds;" \
     "$(uptime | sed 's/.*load average/load average/')"
echo "   libblas.so.3 -> $blas; $(mpirun --version 2>/dev/null | head -1); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
# Rounds alternate the implementations, so each round's figures come from the
# same few seconds of a shared machine; summary.py takes medians over rounds.
opts=(--reps "$REPS" --rep-ms "$REP_MS")
for round in $(seq 1 "$ROUNDS"); do
  echo "#round $round" >> "$out"
  echo "-- round $round: trainyard, shared memory, plain buffer"
  build/bench/comm_bench --ranks $RANKS --path plain "${opts[@]}" $SIZES | tee -a "$out"
  echo "-- round $round: trainyard, shared memory, comm_buffer (zero-copy)"
  build/bench/comm_bench --ranks $RANKS --path buffer "${opts[@]}" $SIZES | tee -a "$out"
  echo "-- round $round: trainyard, comm_buffer rewritten before each call (as training does; rewrite time taken off)"
  build/bench/comm_bench --ranks $RANKS --path buffer --touch "${opts[@]}" $SIZES | tee -a "$out"
  echo "-- round $round: trainyard, TCP over loopback (for information)"
  build/bench/comm_bench --ranks $RANKS --transport tcp "${opts[@]}" $SIZES | tee -a "$out"
  echo "-- round $round: torch.distributed gloo"
  /usr/bin/python3 $here/torch_gloo.py --ranks $RANKS "${opts[@]}" $SIZES | tee -a "$out"
  echo "-- round $round: OpenMPI MPI_Allreduce (pml ob1, btl self,vader)"
  mpirun -np $RANKS --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader \
    build/bench/mpi_allreduce "${opts[@]}" $SIZES | tee -a "$out"
done
/usr/bin/python3 $here/summary.py "$out"
