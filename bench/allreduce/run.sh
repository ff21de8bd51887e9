#!/usr/bin/env bash
# run.sh - float32 sum all-reduce between 2 processes on this machine, in the
# same run: ours (executor/comm, COMM_TRANSPORT_AUTO = shared memory, on a plain
# buffer and on a comm_buffer, the latter also rewritten before each call as
# training does; COMM_TRANSPORT_TCP for information),
# torch.distributed with gloo, and OpenMPI's MPI_Allreduce (vader shared-memory
# transport). Sizes: 1 MiB, 0.94 MB (235,146 floats: the seed MLP's
# gradients), 16 MiB, 64 MiB. Each: warm-up calls, then REPS repetitions of
# about REP_MS ms between barriers; the median time per all-reduce. Bandwidth
# is algorithm bandwidth: bytes of the buffer / time per all-reduce.
#
#   bench/allreduce/run.sh          (or: make bench-allreduce)
#   REPS=9 REP_MS=300 bench/allreduce/run.sh
#
# Installs what it lacks with apt-get (openmpi-bin libopenmpi-dev
# python3-torch; sudo when not root). The last line is one JSON object.
set -euo pipefail
cd "$(dirname "$0")/../.."
here=bench/allreduce
RANKS=2
REPS=${REPS:-7}
REP_MS=${REP_MS:-150}
SIZES="1048576 940584 16777216 67108864"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

SUDO=
[ "$(id -u)" = 0 ] || SUDO=sudo
need=()
{ command -v mpicc && command -v mpirun; } >/dev/null 2>&1 || need+=(openmpi-bin libopenmpi-dev)
/usr/bin/python3 -c 'import torch' 2>/dev/null || need+=(python3-torch)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]} with apt-get (first run only)"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need[@]}"
fi
blas=$(update-alternatives --query libblas.so.3-x86_64-linux-gnu 2>/dev/null | sed -n 's/^Value: //p')
case "$blas" in
  *openblas*) ;;
  *) echo "run.sh: libblas.so.3 is '${blas:-unknown}', not OpenBLAS (PyTorch's BLAS); aborting" >&2; exit 1 ;;
esac

# ours: the comm objects exactly as the Makefile builds them (-O3 -march=native)
srcs=$(ls common/*.c executor/comm/*.c)
objs=$(for s in $srcs; do echo "build/obj/${s%.c}.o"; done)
make --no-print-directory -s -j2 $objs
mkdir -p build/bench
cc -std=gnu11 -O2 -g -D_GNU_SOURCE -Wall -Wextra -Werror -I. -o build/bench/comm_bench $here/comm_bench.c $objs \
   $(pkg-config --libs openssl) -lz -lm -lpthread
mpicc -std=gnu11 -O2 -Wall -Wextra -o build/bench/mpi_allreduce $here/mpi_allreduce.c

out=$(mktemp /tmp/allreduce_bench.XXXXXX)
trap 'rm -f "$out"' EXIT
echo "== $(date -u +%FT%TZ), $(nproc) cores ($(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)), $RANKS processes;" \
     "$(uptime | sed 's/.*load average/load average/')"
echo "   libblas.so.3 -> $blas; $(mpirun --version 2>/dev/null | head -1); torch $(/usr/bin/python3 -c 'import torch; print(torch.__version__)')"
echo "-- trainyard, shared memory, plain buffer"
build/bench/comm_bench --ranks $RANKS --path plain --reps "$REPS" --rep-ms "$REP_MS" $SIZES | tee -a "$out"
echo "-- trainyard, shared memory, comm_buffer (zero-copy)"
build/bench/comm_bench --ranks $RANKS --path buffer --reps "$REPS" --rep-ms "$REP_MS" $SIZES | tee -a "$out"
echo "-- trainyard, shared memory, comm_buffer rewritten before each call (as training does; rewrite time taken off)"
build/bench/comm_bench --ranks $RANKS --path buffer --touch --reps "$REPS" --rep-ms "$REP_MS" $SIZES | tee -a "$out"
echo "-- trainyard, TCP over loopback (for information)"
build/bench/comm_bench --ranks $RANKS --transport tcp --reps "$REPS" --rep-ms "$REP_MS" $SIZES | tee -a "$out"
echo "-- torch.distributed gloo"
/usr/bin/python3 $here/torch_gloo.py --ranks $RANKS --reps "$REPS" --rep-ms "$REP_MS" $SIZES | tee -a "$out"
echo "-- OpenMPI MPI_Allreduce (pml ob1, btl self,vader)"
mpirun -np $RANKS --allow-run-as-root --oversubscribe --mca pml ob1 --mca btl self,vader \
  build/bench/mpi_allreduce --reps "$REPS" --rep-ms "$REP_MS" $SIZES | tee -a "$out"

/usr/bin/python3 - "$out" <<'EOF'
import json, sys, datetime
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
def key(r):
    if r["impl"] == "trainyard":
        return "ours_tcp" if r["transport"] == "tcp" else "ours_" + r["path"].replace("+rewrite", "_rewritten")
    return r["impl"]
fig = {}
for r in rows:
    fig.setdefault(key(r), {})[r["bytes"]] = r
names = {1048576: "1MiB", 940584: "0.94MB", 16777216: "16MiB", 67108864: "64MiB"}
cols = ["ours_plain", "ours_buffer", "ours_buffer_rewritten", "ours_tcp", "gloo", "openmpi"]
print("\nalgorithm bandwidth, GB/s (buffer bytes / median time per all-reduce; 2 processes)")
print("%-8s %11s %12s %10s %9s %7s %8s | %10s %9s | %11s %10s" % (
    "size", "ours plain", "ours buffer", "(rewritten)", "ours tcp", "gloo", "openmpi",
    "plain/gloo", "plain/mpi", "buffer/gloo", "buffer/mpi"))
summary = {"date": datetime.date.today().isoformat(), "ranks": 2, "unit": "GB/s algorithm bandwidth",
           "ratio_path": "plain", "sizes": {}}
for b, nm in names.items():
    g = {c: fig.get(c, {}).get(b, {}).get("gbps") for c in cols}
    def ratio(a, z):
        return round(g[a] / g[z], 2) if g[a] and g[z] else None
    r = {"plain_vs_gloo": ratio("ours_plain", "gloo"), "plain_vs_mpi": ratio("ours_plain", "openmpi"),
         "buffer_vs_gloo": ratio("ours_buffer", "gloo"), "buffer_vs_mpi": ratio("ours_buffer", "openmpi")}
    f = lambda v: "%.2f" % v if v is not None else "-"
    print("%-8s %11s %12s %10s %9s %7s %8s | %10s %9s | %11s %10s" % (
        nm, f(g["ours_plain"]), f(g["ours_buffer"]), f(g["ours_buffer_rewritten"]), f(g["ours_tcp"]), f(g["gloo"]), f(g["openmpi"]),
        f(r["plain_vs_gloo"]), f(r["plain_vs_mpi"]), f(r["buffer_vs_gloo"]), f(r["buffer_vs_mpi"])))
    summary["sizes"][nm] = dict({"bytes": b}, **{c + "_gbps": g[c] for c in cols}, **r)
s = summary["sizes"]
summary["ratio_vs_gloo_64MiB"] = s["64MiB"]["plain_vs_gloo"]
summary["ratio_vs_mpi_1MiB"] = s["1MiB"]["plain_vs_mpi"]
summary["buffer_ratio_vs_gloo_64MiB"] = s["64MiB"]["buffer_vs_gloo"]
summary["buffer_ratio_vs_mpi_1MiB"] = s["1MiB"]["buffer_vs_mpi"]
print("targets: plain >= openmpi at every size: %s; plain >= 3x gloo at 16 and 64 MiB: %s" % (
    all((s[n]["plain_vs_mpi"] or 0) >= 1 for n in s),
    all((s[n]["plain_vs_gloo"] or 0) >= 3 for n in ("16MiB", "64MiB"))))
print(json.dumps(summary, separators=(",", ":")))
EOF
