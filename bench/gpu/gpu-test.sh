#!/usr/bin/env bash
# gpu-test.sh [BUILD] - runs tests/check_gpu as built by `make gpu-build`
# (BUILD/bin/check_gpu, default build/gpu): the GPU engine against the CPU
# engine. On a GPU machine: carry build/gpu there and run this script
# (docs/gpu.md). Without a CUDA device every case prints SKIP and passes.
set -uo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/gpu}
bin=$build/bin/check_gpu
. bench/gpu/env.sh
[ -f "$bin" ] && [ ! -x "$bin" ] && chmod +x "$bin"   # a carry that lost the mode
if [ ! -x "$bin" ]; then
  echo "gpu-test: $bin missing: building it (make gpu-build)"
  make --no-print-directory gpu-build GPU_BUILD="$build" || {
    echo "gpu-test: cannot build here: run 'make gpu-build' on a development machine and carry $build"; exit 1; }
fi
gpu_env "$bin" || exit 1
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
export CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-300}
"$bin"
