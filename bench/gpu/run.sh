#!/usr/bin/env bash
# run.sh [BUILD] - trainyard's GPU engine vs PyTorch eager on one GPU: the
# seed Fashion-MNIST MLP (784-256-128-10 relu, dropout 0.4/0.3, softmax,
# RMSprop lr 0.001) at batch 128 and 1024, fp32, ROUNDS rounds run
# alternately (ours, then PyTorch) in the same run. Prints each run's JSON,
# a table, and as its last line one JSON object with the medians and ratios.
#
# BUILD (default build/gpu) holds bin/gpu_bench from `make gpu-build` and,
# when the build machine had it, data/ with Fashion-MNIST; else each side
# uses synthetic data of the same shape. PyTorch: `python3` with CUDA torch.
# Env: ROUNDS (3), EPOCHS (6: one warm-up + 5 timed), BATCHES ("128 1024").
# Without a CUDA device: says so, prints {"skipped": ...}, exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/gpu}
bin=$build/bin/gpu_bench
ROUNDS=${ROUNDS:-3}
EPOCHS=${EPOCHS:-6}
BATCHES=${BATCHES:-128 1024}
. bench/gpu/env.sh
[ -f "$bin" ] && [ ! -x "$bin" ] && chmod +x "$bin"   # a carry that lost the mode
if [ ! -x "$bin" ]; then
  echo "bench/gpu: $bin missing: building it (make gpu-build)"
  make --no-print-directory gpu-build GPU_BUILD="$build" || {
    echo "bench/gpu: cannot build here: run 'make gpu-build' on a development machine and carry $build"; exit 1; }
fi
gpu_env "$bin" || exit 1
probe=$("$bin" --probe); rc=$?
if [ $rc -eq 3 ]; then
  echo "bench/gpu: $probe: nothing measured (this benchmark needs an NVIDIA GPU)"
  reason=${probe//\"/\'}
  echo "{\"bench\": \"gpu\", \"skipped\": \"no CUDA device\", \"reason\": \"$reason\"}"
  exit 0
elif [ $rc -ne 0 ]; then
  echo "bench/gpu: $bin --probe failed ($rc): $probe"; exit 1
fi
echo "bench/gpu: $probe"
data=/usr/share/datasets/fashion-mnist
[ -r "$build/data/train-images-idx3-ubyte.gz" ] && data=$build/data
torch_ok=1
python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null || {
  torch_ok=0; echo "bench/gpu: python3 has no CUDA PyTorch: our figures only"; }
log=$(mktemp /tmp/bench_gpu.XXXXXX)
trap 'rm -f "$log"' EXIT
for b in $BATCHES; do
  for r in $(seq 1 "$ROUNDS"); do
    line=$("$bin" --batch "$b" --epochs "$EPOCHS" --data "$data" --seed "$r") || {
      echo "bench/gpu: gpu_bench --batch $b failed"; exit 1; }
    echo "$line"; echo "ours $b $r $line" >>"$log"
    if [ $torch_ok = 1 ]; then
      line=$(python3 bench/gpu/torch_mlp_gpu.py --batch "$b" --epochs "$EPOCHS" --data "$data" --seed "$r") || {
        echo "bench/gpu: torch_mlp_gpu.py --batch $b failed"; exit 1; }
      echo "$line"; echo "torch $b $r $line" >>"$log"
    fi
  done
  line=$("$bin" --batch "$b" --epochs "$EPOCHS" --data "$data" --tf32) && {
    echo "$line"; echo "tf32 $b 1 $line" >>"$log"; }
done
python3 - "$log" <<'PY'
import json, statistics, sys
runs = {}
for ln in open(sys.argv[1]):
    kind, b, r, js = ln.split(" ", 3)
    runs.setdefault((kind, int(b)), []).append(json.loads(js))
targets = {128: 5.0, 1024: 1.5}
out = {"bench": "gpu", "model": "fashion-mnist mlp 784-256-128-10, rmsprop, fp32"}
print("\n| batch | trainyard samples/s | PyTorch eager samples/s | ratio (median of rounds) | target | ours TF32 |")
print("| --- | --- | --- | --- | --- | --- |")
for b in sorted({k[1] for k in runs}):
    ours = [x["samples_per_sec"] for x in runs.get(("ours", b), [])]
    torch = [x["samples_per_sec"] for x in runs.get(("torch", b), [])]
    tf32 = [x["samples_per_sec"] for x in runs.get(("tf32", b), [])]
    ratios = [o / t for o, t in zip(ours, torch) if t]
    res = {"trainyard": round(statistics.median(ours), 1) if ours else None,
           "pytorch": round(statistics.median(torch), 1) if torch else None,
           "ratio": round(statistics.median(ratios), 2) if ratios else None,
           "target": targets.get(b), "trainyard_tf32": tf32[0] if tf32 else None,
           "test_accuracy": [x["test_accuracy"] for x in runs.get(("ours", b), [])],
           "pytorch_test_accuracy": [x["test_accuracy"] for x in runs.get(("torch", b), [])],
           "rounds": len(ours)}
    if res["ratio"] is not None and b in targets:
        res["meets_target"] = res["ratio"] >= targets[b]
    out["batch_%d" % b] = res
    print("| %d | %s | %s | %s | %s | %s |" % (b, res["trainyard"], res["pytorch"], res["ratio"],
                                               targets.get(b), res["trainyard_tf32"]))
first = next(iter(runs.values()))[0]
out["device"] = first.get("device")
out["data"] = first.get("data")
print(json.dumps(out))
PY
