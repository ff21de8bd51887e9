#!/usr/bin/env bash
# run.sh - data-parallel sync cost on 2 workers x 1 thread, ours beside
# PyTorch DDP (gloo) in the same run: the seed MLP, global batch 128 (64 per
# worker), Fashion-MNIST. For each: throughput synchronised (gradients
# all-reduced every step) and unsynchronised (the same 2 processes training
# alone: the upper bound on 2 cores), and their ratio; ROUNDS alternating
# rounds, medians. Last line: one JSON object.
#
#   bench/scaling/run.sh            (or: make bench-scaling)
#   ROUNDS=5 EPOCHS=3 bench/scaling/run.sh
#
# Target: synchronised keeps >= 90% of the unsynchronised throughput.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/scaling
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
ROUNDS=${ROUNDS:-3}
EPOCHS=${EPOCHS:-2}
# SMOKE=1 (make test): one round of one epoch
if [ "${SMOKE:-0}" = 1 ]; then ROUNDS=1 EPOCHS=1; fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

need=()
/usr/bin/python3 -c 'import torch, numpy' 2>/dev/null || need+=(python3-torch python3-numpy)
dpkg-query -W -f='${Status}' libopenblas0-pthread 2>/dev/null | grep -q 'install ok' || need+=(libopenblas0-pthread)
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || need+=(dataset-fashion-mnist)
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  echo "run.sh: installing ${need[*]}"
  $SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
case "$blas" in
  *openblas*) echo "libblas.so.3 -> $blas" ;;
  *) echo "run.sh: libblas.so.3 is '${blas:-unknown}', not OpenBLAS: PyTorch would be crippled; aborting" >&2
     exit 1 ;;
esac

# built by the Makefile from the engine's objects (-O3 -march=native) and the tree's one link list
make --no-print-directory -s -j2 build/bench/scaling

field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "== $ROUNDS rounds x $EPOCHS epochs, 2 workers x 1 thread ($(getconf _NPROCESSORS_ONLN) cores; $(uptime | sed 's/.*load average/load average/'))"
our_r=(); torch_r=(); os_=(); ou_=(); ts_=(); tu_=()
for r in $(seq 1 "$ROUNDS"); do
  s=$(build/bench/scaling sync "$EPOCHS" "$DATA" | field samples_per_sec)
  u=$(build/bench/scaling unsync "$EPOCHS" "$DATA" | field samples_per_sec)
  ts=$(/usr/bin/python3 $here/torch_ddp.py sync "$EPOCHS" "$DATA" | field samples_per_sec)
  tu=$(/usr/bin/python3 $here/torch_ddp.py unsync "$EPOCHS" "$DATA" | field samples_per_sec)
  os_+=("$s"); ou_+=("$u"); ts_+=("$ts"); tu_+=("$tu")
  our_r+=("$(echo "$s / $u" | bc -l)"); torch_r+=("$(echo "$ts / $tu" | bc -l)")
  printf 'round %d: trainyard sync %7.0f unsync %7.0f samples/s (%.3f)   pytorch ddp sync %7.0f unsync %7.0f (%.3f)\n' \
    "$r" "$s" "$u" "$(echo "$s / $u" | bc -l)" "$ts" "$tu" "$(echo "$ts / $tu" | bc -l)"
done
ro=$(median "${our_r[@]}"); rt=$(median "${torch_r[@]}")
printf 'median: trainyard keeps %.3f of unsynchronised throughput, pytorch ddp (gloo) %.3f\n' "$ro" "$rt"
verdict=ok
awk -v r="$ro" 'BEGIN {exit !(r < 0.90)}' && verdict="below target: synchronised keeps less than 90%"
printf '{"trainyard_sync": %.0f, "trainyard_unsync": %.0f, "trainyard_ratio": %.3f, "ddp_sync": %.0f, "ddp_unsync": %.0f, "ddp_ratio": %.3f, "verdict": "%s"}\n' \
  "$(median "${os_[@]}")" "$(median "${ou_[@]}")" "$ro" "$(median "${ts_[@]}")" "$(median "${tu_[@]}")" "$rt" "$verdict"
