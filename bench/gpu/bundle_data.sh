#!/usr/bin/env bash
# bundle_data.sh BUILD - copies Fashion-MNIST (when this machine has it) into
# BUILD/data, so a GPU machine that gets BUILD carried over benchmarks on the
# real data (it has no /usr/share/datasets). Without it the benchmark uses
# synthetic data of the same shape. GPU_BUNDLE_DATA=0 skips (30 MB less).
set -euo pipefail
build=${1:-build/gpu}
src=/usr/share/datasets/fashion-mnist
[ "${GPU_BUNDLE_DATA:-1}" = 1 ] || exit 0
[ -r "$src/train-images-idx3-ubyte.gz" ] || { echo "bundle_data: no $src: the bench will use synthetic data"; exit 0; }
mkdir -p "$build/data"
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
  cmp -s "$src/$f" "$build/data/$f" 2>/dev/null || cp "$src/$f" "$build/data/$f"
done
echo "bundle_data: Fashion-MNIST in $build/data ($(du -sh "$build/data" | cut -f1)); $build: $(du -sh "$build" --exclude=obj | cut -f1) without obj/"
