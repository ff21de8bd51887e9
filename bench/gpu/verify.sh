#!/usr/bin/env bash
# verify.sh - the GPU path in one call, from the folder of `make gpu-bundle`
# carried to a GPU machine (docs/gpu.md, "The bundle"):
#
#   build/gpu-bundle/bench/gpu/verify.sh          (or from inside it: bench/gpu/verify.sh)
#
# 1. the device's facts; 2. check_gpu (the GPU engine against the CPU one);
# 3. check_gpu_train (the worker's GPU engine, NCCL); 4. bench/gpu/run.sh
# (ours against PyTorch eager at batch 128 and 1024); 5. `trainyard up` from
# the bundle, the agent reporting the GPUs, and through the API: the seed MLP
# on one GPU, mirrored over every GPU, multi_worker_mirrored on 2 GPUs (when
# there are 2), a PyTorch DDP command job over NCCL, a cancel, and a worker
# killed with SIGKILL that resumes from its checkpoint on the GPU.
# Within 10 minutes (VERIFY_BUDGET_S, default 540, shared by the steps). Ends
# with one JSON object (also in $OUT/verify.json, or BUNDLE/verify-out/):
# every step's figures, or "skipped" with the reason (no GPU here: each GPU
# step says so, and the rest still runs). Exit 0 unless a step that ran failed.
# VERIFY_REHEARSE=1 runs the jobs' flows on CPU slots instead (device cpu,
# gloo): a rehearsal of the script on a machine without a GPU (minutes: the
# bundle's CPU engine uses a reference GEMM). VERIFY_ISOLATION=none runs the
# agent without isolating tasks (default auto: isolated when root; the tasks
# then read the bundle, and PyTorch, as other uids).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(cd "$here/../.." && pwd)
out=${OUT:-$bundle/verify-out}
mkdir -p "$out"
cd "$bundle"
chmod +x bin/* bench/gpu/*.sh 2>/dev/null || true   # a copy that lost the modes
. bench/gpu/env.sh
# cuBLAS from the toolkit or PyTorch's wheels; NCCL from PyTorch's wheel
gpu_env bin/trainyard >/dev/null || true
nccl=$(python3 -c 'import nvidia.nccl as n, os; print(os.path.join(n.__path__[0], "lib"))' 2>/dev/null || true)
[ -n "$nccl" ] && [ -d "$nccl" ] && export LD_LIBRARY_PATH="$nccl${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
py=python3
[ -x /usr/bin/python3 ] && ! python3 -c 'import torch' 2>/dev/null && py=/usr/bin/python3
exec "$py" "$here/verify.py" --bundle "$bundle" --out "$out" --budget "${VERIFY_BUDGET_S:-540}"
