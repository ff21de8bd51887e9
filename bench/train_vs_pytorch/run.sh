#!/usr/bin/env bash
# run.sh - the training engine against PyTorch on the seed MLP, one thread each,
# in the same run: samples/s of each and the ratio (median of ROUNDS alternating
# runs of SPEED_EPOCHS epochs), then test accuracy after 10 epochs for 3 seeds
# (median). Fashion-MNIST's 60k training images, batch 128, RMSprop 0.001.
#
#   bench/train_vs_pytorch/run.sh            (or: make bench-train)
#   ROUNDS=5 SPEED_EPOCHS=2 ACC_EPOCHS=10 bench/train_vs_pytorch/run.sh
#
# Needs: OpenBLAS selected as libblas.so.3 (PyTorch's BLAS; checked), Debian's
# python3-torch under /usr/bin/python3, the dataset-fashion-mnist package.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/train_vs_pytorch
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
ROUNDS=${ROUNDS:-3}
SPEED_EPOCHS=${SPEED_EPOCHS:-2}
ACC_EPOCHS=${ACC_EPOCHS:-10}
SEEDS=${SEEDS:-"1 2 3"}
# SMOKE=1 (make test): one round and one seed of one epoch; the verdict is printed, not enforced
if [ "${SMOKE:-0}" = 1 ]; then ROUNDS=1 SPEED_EPOCHS=1 ACC_EPOCHS=1 SEEDS=1; fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
case "$blas" in
  *openblas*) echo "libblas.so.3 -> $blas" ;;
  *) echo "run.sh: libblas.so.3 is '${blas:-unknown}', not OpenBLAS: PyTorch would not use the same BLAS; aborting" >&2
     exit 1 ;;
esac
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "run.sh: /usr/bin/python3 has no torch (apt-get install -y python3-torch)" >&2; exit 1; }
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "run.sh: no Fashion-MNIST in $DATA (package dataset-fashion-mnist)" >&2; exit 1; }

# The bench driver, built by the Makefile with the engine's objects exactly as
# it builds them (executor/nn with -O3 -march=native) and the tree's one link list.
make --no-print-directory -s -j2 build/bench/mlp_bench

field() { /usr/bin/python3 -c "import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])['$1'])"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "== speed: $ROUNDS rounds x $SPEED_EPOCHS epochs, 1 thread each ($(getconf _NPROCESSORS_ONLN) cores; $(uptime | sed 's/.*load average/load average/'))"
ours=(); torch=(); ratios=()
for r in $(seq 1 "$ROUNDS"); do
  o=$(build/bench/mlp_bench "$SPEED_EPOCHS" "$r" "$DATA" | field samples_per_sec)
  t=$(/usr/bin/python3 $here/torch_mlp.py "$SPEED_EPOCHS" "$r" "$DATA" | field samples_per_sec)
  ours+=("$o"); torch+=("$t"); ratios+=("$(echo "$o / $t" | bc -l)")
  printf 'round %d: trainyard %9.0f samples/s   pytorch %9.0f samples/s   ratio %.2f\n' "$r" "$o" "$t" \
    "$(echo "$o / $t" | bc -l)"
done
mo=$(median "${ours[@]}"); mt=$(median "${torch[@]}")
ratio=$(median "${ratios[@]}")   # pairs from the same moment: noise cancels
printf 'median:  trainyard %9.0f samples/s   pytorch %9.0f samples/s   ratio (median of rounds) %.2f\n' "$mo" "$mt" "$ratio"

echo "== accuracy: $ACC_EPOCHS epochs, seeds $SEEDS (Fashion-MNIST test split, 10k)"
accs=(); taccs=()
for s in $SEEDS; do
  out=$(build/bench/mlp_bench "$ACC_EPOCHS" "$s" "$DATA")
  a=$(echo "$out" | field test_accuracy); sp=$(echo "$out" | field samples_per_sec)
  ta=$(/usr/bin/python3 $here/torch_mlp.py "$ACC_EPOCHS" "$s" "$DATA" | field test_accuracy)
  accs+=("$a"); taccs+=("$ta")
  printf 'seed %s: trainyard test_accuracy %.4f (%.0f samples/s)   pytorch test_accuracy %.4f\n' "$s" "$a" "$sp" "$ta"
done
ma=$(median "${accs[@]}"); mta=$(median "${taccs[@]}")
printf 'median test accuracy: trainyard %.4f   pytorch %.4f\n' "$ma" "$mta"

verdict=ok
awk -v r="$ratio" 'BEGIN {exit !(r < 1.5)}' && verdict="FAIL: below 1.5x PyTorch"
awk -v a="$ma" 'BEGIN {exit !(a < 0.875)}' && verdict="FAIL: median test accuracy below 0.875"
printf '{"trainyard_samples_per_sec": %.0f, "pytorch_samples_per_sec": %.0f, "ratio": %.3f, "trainyard_test_accuracy": %.4f, "pytorch_test_accuracy": %.4f, "verdict": "%s"}\n' \
  "$mo" "$mt" "$ratio" "$ma" "$mta" "$verdict"
[ "$verdict" = ok ] || [ "${SMOKE:-0}" = 1 ]
