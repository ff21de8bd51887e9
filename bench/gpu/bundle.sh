#!/usr/bin/env bash
# bundle.sh BUILD BUNDLE - assembles the folder `make gpu-bundle` carries to
# a GPU machine (docs/gpu.md, "The bundle"): BUILD/bin's programs, the
# libraries they need that a bare Ubuntu 24.04 host lacks (every one but the
# C library's and CUDA's: cuBLAS, NCCL and the driver are the host's),
# found through the programs' $ORIGIN/../lib, the examples, a slice of
# Fashion-MNIST, and bench/gpu's scripts with verify.sh. Fails when the
# folder would not fit in 64 MiB or a program needs something else.
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build/gpu}
out=${2:-build/gpu-bundle}
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/examples" "$out/data" "$out/bench/gpu"

for p in trainyard check_gpu check_gpu_train gpu_bench; do
  install -m 0755 "$build/bin/$p" "$out/bin/$p"
done

# the libraries: what the programs (and the libraries carried for them)
# name in DT_NEEDED, resolved as this machine's loader does, except the C
# library's and CUDA's (bench/gpu/bundle_check.sh has the same list)
host_lib() {
  case "$1" in
    ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|libresolv.so.*|libutil.so.*) return 0 ;;
    libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*|libnccl.so.*|libnvidia*) return 0 ;;
  esac
  return 1
}
needed() { readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'; }
declare -A seen=()
queue=("$out"/bin/*)
while [ ${#queue[@]} -gt 0 ]; do
  f=${queue[0]}
  queue=("${queue[@]:1}")
  for lib in $(needed "$f"); do
    host_lib "$lib" && continue
    [ -n "${seen[$lib]:-}" ] && continue
    seen[$lib]=1
    path=$(ldd "$f" | awk -v l="$lib" '$1 == l && $3 ~ /^\// {print $3; exit}')
    if [ -z "$path" ]; then
      # a library's own dependency: resolve it through the loader's cache
      path=$(/sbin/ldconfig -p | awk -v l="$lib" '$1 == l && $NF ~ /^\// && /x86-64/ {print $NF; exit}')
    fi
    [ -n "$path" ] || { echo "bundle: cannot find $lib (needed by $f)" >&2; exit 1; }
    cp -L "$path" "$out/lib/$lib"
    chmod 0644 "$out/lib/$lib"
    queue+=("$out/lib/$lib")
  done
done

# jobs and scripts
cp examples/*.json examples/*.py "$out/examples/"
for f in env.sh gpu-test.sh run.sh verify.sh verify.py torch_mlp_gpu.py torch_cnn_gpu.py bundle_check.sh; do
  cp "bench/gpu/$f" "$out/bench/gpu/$f"
done
chmod 0755 "$out"/bench/gpu/*.sh

# a slice of Fashion-MNIST in its own IDX format: the first 12,000 training
# and 2,000 test examples (about 4 MB); the whole set is 30 MB
src=/usr/share/datasets/fashion-mnist
if [ -r "$src/train-images-idx3-ubyte.gz" ]; then
  /usr/bin/python3 - "$src" "$out/data" <<'PY'
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for name, n in (("train", 12000), ("t10k", 2000)):
    with gzip.open(f"{src}/{name}-images-idx3-ubyte.gz") as f:
        magic, count, rows, cols = struct.unpack(">IIII", f.read(16))
        body = f.read(n * rows * cols)
    with gzip.open(f"{dst}/{name}-images-idx3-ubyte.gz", "wb", 9) as g:
        g.write(struct.pack(">IIII", magic, n, rows, cols) + body)
    with gzip.open(f"{src}/{name}-labels-idx1-ubyte.gz") as f:
        magic, count = struct.unpack(">II", f.read(8))
        body = f.read(n)
    with gzip.open(f"{dst}/{name}-labels-idx1-ubyte.gz", "wb", 9) as g:
        g.write(struct.pack(">II", magic, n) + body)
PY
else
  echo "bundle: no $src here: the bundle has no data (the GPU jobs of verify.sh use synthetic data)"
fi
git rev-parse --short HEAD > "$out/VERSION" 2>/dev/null || echo unknown > "$out/VERSION"

size=$(du -sm "$out" | cut -f1)
echo "bundle: $out, ${size} MiB: bin/ $(ls "$out/bin" | tr '\n' ' ')lib/ $(ls "$out/lib" | wc -l) libraries"
[ "$size" -lt 64 ] || { echo "bundle: $size MiB is over 64 MiB" >&2; exit 1; }
bench/gpu/bundle_check.sh "$out"
