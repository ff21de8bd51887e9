#!/usr/bin/env bash
# bundle_check.sh BUNDLE - the bundle needs nothing else: every library that
# its programs and carried libraries name (DT_NEEDED) is in BUNDLE/lib, or is
# the C library's or CUDA's (the host's), and the loader takes the carried
# ones from BUNDLE/lib, not from this machine. Exit 0 when so; prints what
# is missing otherwise. Runs on the build machine (make test) and the GPU one.
set -uo pipefail
b=${1:-build/gpu-bundle}
host_lib() {
  case "$1" in
    ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*) return 0 ;;
    libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libnvidia*) return 0 ;;
  esac
  return 1
}
bad=0 n=0
for f in "$b"/bin/* "$b"/lib/*; do
  [ -f "$f" ] || continue
  n=$((n + 1))
  for lib in $(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do
    host_lib "$lib" && continue
    if [ ! -e "$b/lib/$lib" ]; then
      echo "bundle_check: $f needs $lib, which is neither in $b/lib nor the C library's or CUDA's"
      bad=1
    fi
  done
done
# the loader's view: what the bundle carries is taken from it (with CUDA's
# libraries from the toolkit here, CUDA_LIB)
for p in "$b"/bin/trainyard "$b"/bin/check_gpu_train; do
  out=$(LD_LIBRARY_PATH=${CUDA_LIB:-/usr/local/cuda/lib64} ldd "$p" 2>&1)
  while read -r lib _ path _; do
    [ -e "$b/lib/$lib" ] || continue   # the host's (the C library's, CUDA's and theirs)
    case "$path" in
      "$(cd "$b" && pwd)"/lib/*|"$b"/bin/../lib/*|*/bin/../lib/*) ;;
      *) [ -z "$path" ] || { echo "bundle_check: $p takes $lib from $path, not the bundle"; bad=1; } ;;
    esac
  done < <(printf '%s\n' "$out" | grep '=>')
done
[ "$bad" = 0 ] && echo "bundle_check: $b: all $n programs and libraries resolve inside it or to the C library and CUDA"
exit $bad
