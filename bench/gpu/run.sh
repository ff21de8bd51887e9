#!/usr/bin/env bash
# run.sh [BUILD] - trainyard's GPU engine vs PyTorch eager on one GPU, fp32,
# ROUNDS rounds run alternately (ours, then PyTorch) in the same run:
#   mlp: the seed Fashion-MNIST MLP (784-256-128-10 relu, dropout 0.4/0.3,
#        softmax, RMSprop lr 0.001) at batch 128 and 1024
#        (gpu_bench --model mlp / torch_mlp_gpu.py);
#   cnn: the Fashion-MNIST CNN (conv2d 32 3x3 relu, max_pooling2d 2, conv2d
#        64 3x3 relu, max_pooling2d 2, flatten, dense 128 relu, dropout 0.5,
#        dense 10 softmax; Adam lr 0.001) at batch 128
#        (gpu_bench --model cnn / torch_cnn_gpu.py, cuDNN).
# Prints each run's JSON, a table, and as its last line one JSON object
# with the medians and ratios (batch_B for the MLP, cnn_batch_B for the CNN).
#
# BUILD (default build/gpu) holds bin/gpu_bench from `make gpu-build` and,
# when the build machine had it, data/ with Fashion-MNIST; else each side
# uses synthetic data of the same shape. PyTorch: `python3` with CUDA torch.
# Env: ROUNDS (3), EPOCHS (6: one warm-up + 5 timed), MODELS ("mlp cnn"),
# BATCHES ("128 1024", the MLP's), CNN_BATCHES ("128").
# Without a CUDA device: says so, prints {"skipped": ...}, exits 0.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/gpu}
bin=$build/bin/gpu_bench
# SMOKE=1 (make test): one round, one warm-up and one timed epoch, batch 128
if [ "${SMOKE:-0}" = 1 ]; then ROUNDS=1 EPOCHS=2 BATCHES=128; fi
ROUNDS=${ROUNDS:-3}
EPOCHS=${EPOCHS:-6}
BATCHES=${BATCHES:-128 1024}
CNN_BATCHES=${CNN_BATCHES:-128}
MODELS=${MODELS:-mlp cnn}
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
for model in $MODELS; do
  case $model in
    mlp) batches=$BATCHES; peer=bench/gpu/torch_mlp_gpu.py ;;
    cnn) batches=$CNN_BATCHES; peer=bench/gpu/torch_cnn_gpu.py ;;
    *) echo "bench/gpu: MODELS: mlp or cnn, got $model"; exit 1 ;;
  esac
  for b in $batches; do
    # a failed run is recorded and the others go on (the summary lists it; exit 1)
    for r in $(seq 1 "$ROUNDS"); do
      if line=$("$bin" --model "$model" --batch "$b" --epochs "$EPOCHS" --data "$data" --seed "$r"); then
        echo "$line"; echo "$model ours $b $r $line" >>"$log"
      else
        echo "bench/gpu: gpu_bench --model $model --batch $b failed: $line"
        echo "$model failed $b $r {\"run\": \"gpu_bench --model $model --batch $b\"}" >>"$log"
        break
      fi
      if [ $torch_ok = 1 ]; then
        if line=$(python3 "$peer" --batch "$b" --epochs "$EPOCHS" --data "$data" --seed "$r"); then
          echo "$line"; echo "$model torch $b $r $line" >>"$log"
        else
          echo "bench/gpu: $peer --batch $b failed"
          echo "$model failed $b $r {\"run\": \"$peer --batch $b\"}" >>"$log"
        fi
      fi
    done
    line=$("$bin" --model "$model" --batch "$b" --epochs "$EPOCHS" --data "$data" --tf32) && {
      echo "$line"; echo "$model tf32 $b 1 $line" >>"$log"; }
  done
done
python3 - "$log" <<'PY'
import json, statistics, sys
runs, failed = {}, []
for ln in open(sys.argv[1]):
    model, kind, b, r, js = ln.split(" ", 4)
    if kind == "failed":
        failed.append(json.loads(js)["run"])
        continue
    runs.setdefault((model, kind, int(b)), []).append(json.loads(js))
if not runs:
    print(json.dumps({"bench": "gpu", "ok": False, "failed": failed}))
    sys.exit(1)
targets = {("mlp", 128): 5.0, ("mlp", 1024): 1.5}  # the CNN has none yet: to measure
names = {"mlp": "fashion-mnist mlp 784-256-128-10, rmsprop, fp32",
         "cnn": "fashion-mnist cnn conv32-pool-conv64-pool-128-10, adam, fp32"}
out = {"bench": "gpu", "model": names["mlp"]}
print("\n| model | batch | trainyard samples/s | PyTorch eager samples/s | ratio (median of rounds) | target | ours TF32 |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for model, b in sorted({(k[0], k[2]) for k in runs}, key=lambda k: (k[0] != "mlp", k[1])):
    ours = [x["samples_per_sec"] for x in runs.get((model, "ours", b), [])]
    torch = [x["samples_per_sec"] for x in runs.get((model, "torch", b), [])]
    tf32 = [x["samples_per_sec"] for x in runs.get((model, "tf32", b), [])]
    ratios = [o / t for o, t in zip(ours, torch) if t]
    target = targets.get((model, b))
    res = {"trainyard": round(statistics.median(ours), 1) if ours else None,
           "pytorch": round(statistics.median(torch), 1) if torch else None,
           "ratio": round(statistics.median(ratios), 2) if ratios else None,
           "target": target, "trainyard_tf32": tf32[0] if tf32 else None,
           "test_accuracy": [x["test_accuracy"] for x in runs.get((model, "ours", b), [])],
           "pytorch_test_accuracy": [x["test_accuracy"] for x in runs.get((model, "torch", b), [])],
           "rounds": len(ours)}
    if res["ratio"] is not None and target is not None:
        res["meets_target"] = res["ratio"] >= target
    if model == "cnn":
        res["model"] = names["cnn"]
    out[("batch_%d" if model == "mlp" else "cnn_batch_%d") % b] = res
    print("| %s | %d | %s | %s | %s | %s | %s |" % (model, b, res["trainyard"], res["pytorch"],
                                                    res["ratio"], target, res["trainyard_tf32"]))
if failed:
    out["failed"] = failed
first = next(iter(runs.values()))[0]
out["device"] = first.get("device")
out["data"] = first.get("data")
print(json.dumps(out))
sys.exit(1 if failed else 0)
PY
