# env.sh - sourced by bench/gpu/gpu-test.sh and run.sh: makes the dynamic
# loader find cuBLAS 13 for a binary of `make gpu-build` on a machine where
# it is not in the rpath ($CUDA_HOME/lib64 of the build machine) nor in the
# loader's cache: the CUDA toolkit's folders, then the pip wheels of the
# Python that holds PyTorch (nvidia/cu13/lib, nvidia/cublas/lib).
# usage: gpu_env BINARY
gpu_env() {
  local bin=$1 d
  if ! ldd "$bin" 2>/dev/null | grep -q 'not found'; then return 0; fi
  for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(python3 -c 'import nvidia, os; [print(os.path.join(p, s)) for p in nvidia.__path__ for s in ("cu13/lib", "cublas/lib")]' 2>/dev/null); do
    if [ -e "$d/libcublas.so.13" ]; then
      export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      echo "gpu_env: libcublas.so.13 from $d"
      ldd "$bin" | grep -q 'not found' || return 0
    fi
  done
  echo "gpu_env: libraries still missing for $bin:"; ldd "$bin" | grep 'not found'
  return 1
}
