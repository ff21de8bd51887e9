#!/usr/bin/env bash
# cnn.sh - the training engine against PyTorch on the Keras-tutorial CNN of
# examples/fashion_mnist_cnn.json (conv32 same-pool-conv64-pool-dense128-
# dropout-dense10, Adam 0.001), one thread each, in the same run:
#   speed:    at batch 128, ROUNDS alternating rounds of SPEED_EPOCHS epochs of
#             `trainyard train` and torch_cnn.py, each under /usr/bin/time:
#             samples/s of each (training steps only), the ratio (median of
#             the per-round ratios) and the peak RSS of each (median) and its ratio;
#   accuracy: ACC_EPOCHS (5) epochs of each with the example's batch size,
#             test accuracy on the 10k test split.
# Both train on the same images (the example's validation_split: the last
# part is evaluated after each epoch, untimed) with the same model and optimizer.
#
#   bench/train_vs_pytorch/cnn.sh            (or: make bench-train-cnn)
#   ROUNDS=5 SPEED_EPOCHS=2 BUILD=build/x bench/train_vs_pytorch/cnn.sh
#   (BUILD: the build dir, default build; CUDA: default 0, see below)
#   LIMIT=2560 ROUNDS=1 ACC_EPOCHS=1 bench/train_vs_pytorch/cnn.sh   (smoke test)
#
# Verdict: ok when ratio >= 1.5, our peak RSS <= PyTorch's and our test
# accuracy after ACC_EPOCHS epochs >= 0.91; otherwise FAIL naming each miss.
# Needs: OpenBLAS selected as libblas.so.3 (PyTorch's BLAS; checked), Debian's
# python3-torch under /usr/bin/python3, the dataset-fashion-mnist package,
# /usr/bin/time. Note: PyTorch's CPU convolutions run on its bundled oneDNN
# (aten::mkldnn_convolution), not on BLAS; only its dense layers use OpenBLAS.
# Figures on a shared 2-core machine move 10-40% from run to run.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/train_vs_pytorch
BUILD=${BUILD:-build}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
SPEC=${SPEC:-examples/fashion_mnist_cnn.json}
# SMOKE=1 (make test): 2,560 examples, one round, one accuracy epoch; the verdict printed, not enforced
if [ "${SMOKE:-0}" = 1 ]; then LIMIT=2560 ROUNDS=1 ACC_EPOCHS=1; fi
ROUNDS=${ROUNDS:-3}
SPEED_EPOCHS=${SPEED_EPOCHS:-1}
ACC_EPOCHS=${ACC_EPOCHS:-5}
SEED=${SEED:-7}
LIMIT=${LIMIT:-}   # a smoke test: at most LIMIT training and test examples each
lim=(); [ -n "$LIMIT" ] && lim=(--limit "$LIMIT")
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
case "$blas" in
  *openblas*) echo "libblas.so.3 -> $blas" ;;
  *) echo "cnn.sh: libblas.so.3 is '${blas:-unknown}', not OpenBLAS: PyTorch would not use the same BLAS; aborting" >&2
     exit 1 ;;
esac
/usr/bin/python3 -c 'import torch' 2>/dev/null || { echo "cnn.sh: /usr/bin/python3 has no torch (apt-get install -y python3-torch)" >&2; exit 1; }
[ -f "$DATA/train-images-idx3-ubyte.gz" ] || { echo "cnn.sh: no Fashion-MNIST in $DATA (package dataset-fashion-mnist)" >&2; exit 1; }
[ -x /usr/bin/time ] || TRAINYARD_EXTRA_PKGS=time scripts/deps.sh   # the peak RSS of each side

# A CPU-only build by default (CUDA=0): PyTorch here is a CPU build, and
# linking cudart/cublas/nccl alone adds ~150 MiB to the peak RSS of a CPU run.
# The Makefile does not track flags, so a BUILD dir holding a CUDA build gets
# its CPU-only build in $BUILD/cpu rather than a mixed relink.
CUDA=${CUDA:-0}
# a smoke run takes the build as it is (its peak RSS is not a figure)
[ "${SMOKE:-0}" = 1 ] && [ -d "$BUILD/obj/executor/cuda" ] && CUDA=1
if [ "$CUDA" = 0 ] && [ -d "$BUILD/obj/executor/cuda" ]; then BUILD=$BUILD/cpu; fi
echo "building $BUILD/trainyard (CUDA=$CUDA)"
make --no-print-directory -s -j2 CUDA="$CUDA" BUILD="$BUILD" "$BUILD/trainyard"
ty=$BUILD/trainyard

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# The speed rounds run the example's model at batch 128 (a copy of SPEC with
# that batch size); the accuracy run takes SPEC as it is, and PyTorch the same
# batch size, dropout rate and validation split.
specv() { /usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))" "$SPEC" "$1"; }
/usr/bin/python3 -c "import json,sys; s=json.load(open(sys.argv[1])); s['fit']['batch_size']=128; json.dump(s, open(sys.argv[2], 'w'))" "$SPEC" "$tmp/speed.json"
acc_batch=$(specv "s['fit']['batch_size']")
acc_drop=$(specv "[l['rate'] for l in s['model']['layers'] if l['type'] == 'dropout'][0]")
acc_vs=$(specv "s['data'].get('validation_split', 0)")

# run NAME CMD...: runs CMD under /usr/bin/time; stdout to $tmp/NAME.out, peak RSS (KiB) to $tmp/NAME.rss
run() {
  local name=$1; shift
  if ! /usr/bin/time -f %M -o "$tmp/$name.rss" "$@" >"$tmp/$name.out" 2>"$tmp/$name.err"; then
    echo "cnn.sh: $name failed:" >&2; tail -5 "$tmp/$name.err" >&2; exit 1
  fi
}
field() { /usr/bin/python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])['$1'])" "$2"; }
rss() { tail -1 "$tmp/$1.rss"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "== speed: $ROUNDS rounds x $SPEED_EPOCHS epochs of $SPEC at batch 128, 1 thread each ($(getconf _NPROCESSORS_ONLN) cores; $(uptime | sed 's/.*load average/load average/'))"
ours=(); torch=(); ratios=(); orss=(); trss=()
for r in $(seq 1 "$ROUNDS"); do
  run ours "$ty" train "$tmp/speed.json" --epochs "$SPEED_EPOCHS" --data-path "$DATA" "${lim[@]}"
  run torch /usr/bin/python3 $here/torch_cnn.py "$SPEED_EPOCHS" "$SEED" "$DATA" "${lim[@]}" --batch 128 \
      --dropout "$acc_drop" --validation-split "$acc_vs"
  o=$(field samples_per_sec "$tmp/ours.out"); t=$(field samples_per_sec "$tmp/torch.out")
  ours+=("$o"); torch+=("$t"); ratios+=("$(echo "$o / $t" | bc -l)")
  orss+=("$(rss ours)"); trss+=("$(rss torch)")
  printf 'round %d: trainyard %6.0f samples/s %5.0f MiB   pytorch %6.0f samples/s %5.0f MiB   ratio %.2f\n' "$r" \
    "$o" "$(echo "$(rss ours) / 1024" | bc -l)" "$t" "$(echo "$(rss torch) / 1024" | bc -l)" "$(echo "$o / $t" | bc -l)"
done
mo=$(median "${ours[@]}"); mt=$(median "${torch[@]}")
ratio=$(median "${ratios[@]}")   # pairs from the same moment: noise cancels
mor=$(median "${orss[@]}"); mtr=$(median "${trss[@]}")
rss_ratio=$(echo "$mor / $mtr" | bc -l)
printf 'median:  trainyard %6.0f samples/s   pytorch %6.0f samples/s   ratio (median of rounds) %.2f\n' "$mo" "$mt" "$ratio"
printf 'peak RSS (median): trainyard %.0f MiB   pytorch %.0f MiB   ours/theirs %.2f\n' \
  "$(echo "$mor / 1024" | bc -l)" "$(echo "$mtr / 1024" | bc -l)" "$rss_ratio"

echo "== accuracy: $ACC_EPOCHS epochs each of $SPEC, batch $acc_batch (Fashion-MNIST test split, 10k)"
run ours "$ty" train "$SPEC" --epochs "$ACC_EPOCHS" --data-path "$DATA" "${lim[@]}"
sed 's/^/  trainyard: /' "$tmp/ours.out" | grep -v '^  trainyard: {'
run torch /usr/bin/python3 $here/torch_cnn.py "$ACC_EPOCHS" "$SEED" "$DATA" "${lim[@]}" --batch "$acc_batch" \
    --dropout "$acc_drop" --validation-split "$acc_vs"
sed 's/^/  pytorch:   /' "$tmp/torch.out" | grep -v '^  pytorch:   {'
a=$(field test_accuracy "$tmp/ours.out"); ta=$(field test_accuracy "$tmp/torch.out")
printf 'test accuracy after %d epochs: trainyard %.4f   pytorch %.4f\n' "$ACC_EPOCHS" "$a" "$ta"

miss=()
awk -v r="$ratio" 'BEGIN {exit !(r < 1.5)}' && miss+=("speed ratio $(printf %.2f "$ratio") below 1.5x PyTorch")
awk -v o="$mor" -v t="$mtr" 'BEGIN {exit !(o > t)}' && miss+=("peak RSS $((mor / 1024)) MiB above PyTorch's $((mtr / 1024)) MiB")
awk -v a="$a" 'BEGIN {exit !(a < 0.91)}' && miss+=("test accuracy $(printf %.4f "$a") below 0.91 after $ACC_EPOCHS epochs")
if [ ${#miss[@]} -eq 0 ]; then verdict=ok; else verdict="FAIL: $(IFS=';'; echo "${miss[*]}" | sed 's/;/; /g')"; fi
printf '{"model": "fashion_mnist_cnn", "trainyard_samples_per_sec": %.0f, "pytorch_samples_per_sec": %.0f, "ratio": %.3f, "trainyard_peak_rss_kib": %d, "pytorch_peak_rss_kib": %d, "rss_ratio": %.3f, "trainyard_test_accuracy": %.4f, "pytorch_test_accuracy": %.4f, "acc_epochs": %d, "verdict": "%s"}\n' \
  "$mo" "$mt" "$ratio" "$mor" "$mtr" "$rss_ratio" "$a" "$ta" "$ACC_EPOCHS" "$verdict"
[ "$verdict" = ok ] || [ "${SMOKE:-0}" = 1 ]
