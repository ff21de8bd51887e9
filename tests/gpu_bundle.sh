#!/usr/bin/env bash
# gpu_bundle.sh - the GPU bundle needs nothing else, and its one command runs
# here too: `make gpu-bundle` (needs nvcc; without it this says SKIP), then
# bench/gpu/bundle_check.sh (every library its programs need is carried or
# is the C library's or CUDA's), then bench/gpu/verify.sh from the bundle on
# this machine, which has no GPU: it must start `trainyard up` from the
# bundle, and say of each GPU step that it was skipped and why, with no step
# failed. Called by tests/run_all.sh (docs/gpu.md, "The bundle").
set -uo pipefail
cd "$(dirname "$0")/.."
nvcc=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null || true)
if [ -z "$nvcc" ]; then
  echo "gpu_bundle: SKIP: no CUDA toolkit (nvcc) on this machine: the bundle cannot be built"
  exit 0
fi
bundle=${GPU_BUNDLE:-build/gpu-bundle}
make --no-print-directory -s -j2 gpu-bundle GPU_BUNDLE="$bundle" GPU_BUNDLE_DATA=0 >/tmp/gpu_bundle.$$.log 2>&1 || {
  cat /tmp/gpu_bundle.$$.log; rm -f /tmp/gpu_bundle.$$.log; echo "gpu_bundle: FAILED: make gpu-bundle"; exit 1; }
grep -E "^bundle" /tmp/gpu_bundle.$$.log
rm -f /tmp/gpu_bundle.$$.log
out=$(mktemp -d /tmp/gpu_verify.XXXXXX)
OUT=$out VERIFY_BUDGET_S=120 timeout 300 "$bundle/bench/gpu/verify.sh" >"$out/stdout" 2>&1
code=$?
tail -1 "$out/stdout" > "$out/last.json"
/usr/bin/python3 - "$out/last.json" "$code" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except ValueError:
    print("gpu_bundle: FAILED: verify.sh printed no JSON:", open(sys.argv[1]).read()[:500]); sys.exit(1)
bad = []
if int(sys.argv[2]) != 0: bad.append(f"verify.sh exited {sys.argv[2]}")
if d.get("failed"): bad.append(f"failed steps: {d['failed']}")
if not (d.get("up") or {}).get("ok"): bad.append(f"trainyard up from the bundle: {d.get('up')}")
gpu_steps = ["check_gpu", "check_gpu_train", "bench", "default_1gpu", "mirrored_all_gpus",
             "multi_worker_mirrored_2gpus", "ddp_nccl_command", "cancel", "sigkill_resume"]
if not d.get("device", {}).get("gpus"):
    for k in gpu_steps:
        why = (d.get(k) or {}).get("skipped")
        if not why: bad.append(f"{k}: not said skipped ({d.get(k)})")
if bad:
    print("gpu_bundle: FAILED:", "; ".join(bad)); sys.exit(1)
print(f"gpu_bundle: ok: verify.sh ran in {d['seconds']} s; skipped {len(d['skipped'])} steps, each with its reason "
      f"(e.g. '{(d.get('default_1gpu') or {}).get('skipped')}')")
PY
rc=$?
rm -rf "$out"
exit $rc
