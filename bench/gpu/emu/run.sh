#!/usr/bin/env bash
# run.sh [BUILD] - tests/check_gpu (and, with EMU_TRAIN=1, the one-device
# cases of tests/check_gpu_train: the worker's loop on the GPU engine)
# against the GPU engine's code run on the host: executor/cuda/gpu_model.cu and gpu_conv.cu compiled by g++ against
# bench/gpu/emu's CUDA runtime and cuBLAS (kernels as loops, one thread at
# a time; graphs as recorded closures), beside the real CPU engine. It
# checks the engine's logic (indexing, layouts, the order of a step, the
# graph's capture and replay, host API) where no GPU is; it says nothing
# about the GPU itself (concurrency, memory, speed, cuBLAS). BUILD
# (default build/emu) gets the objects and bin/check_gpu_emu.
# Env: CK_RUN_CASE / CK_RUN_SUITE as for check; EMU_SAN=1 builds the
# engine's code and the emulation with ASan/UBSan (device buffers are host
# memory here, so a kernel's out-of-bounds access shows up).
# EMU_SAN=1 runs take a few minutes.
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build/emu}
mkdir -p "$B/emu"
make -s --no-print-directory CUDA=0 BUILD="$B" "$B/tests/check_data" >/dev/null
SAN=
[ "${EMU_SAN:-0}" = 1 ] && SAN="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
CXXFLAGS="-std=c++17 -O2 -g -DTRAINYARD_CUDA -Ibench/gpu/emu/include -Iexecutor/cuda -I. -Wall -Wextra -Wno-unused-parameter $SAN"
for f in gpu_model gpu_conv; do
  python3 bench/gpu/emu/translate.py "executor/cuda/$f.cu" "$B/emu/$f.cpp"
  g++ $CXXFLAGS -c "$B/emu/$f.cpp" -o "$B/emu/$f.o"
done
g++ $CXXFLAGS -c bench/gpu/emu/emu.cpp -o "$B/emu/emu.o"
PKGS="libmicrohttpd libcjson libcurl openssl libarchive"
gcc -std=gnu11 -O1 -g -D_GNU_SOURCE -DTRAINYARD_CUDA -I. $(pkg-config --cflags $PKGS) \
    -I/usr/include/x86_64-linux-gnu/openblas-pthread -c tests/check_gpu.c -o "$B/emu/check_gpu.o"
objs=$(ls "$B"/obj/common/*.o "$B"/obj/spec/*.o "$B"/obj/executor/nn/*.o "$B"/obj/executor/data/*.o)
mkdir -p "$B/bin"
g++ $SAN -o "$B/bin/check_gpu_emu" "$B/emu/check_gpu.o" "$B"/emu/{gpu_model,gpu_conv,emu}.o $objs \
    $(pkg-config --libs $PKGS check) -lsqlite3 -lopenblas -lz -lm -lpthread
echo "emu: $B/bin/check_gpu_emu"
CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-1200} OPENBLAS_NUM_THREADS=1 "$B/bin/check_gpu_emu"
[ "${EMU_TRAIN:-0}" = 1 ] || exit 0
# the worker's GPU engine: train_loop + engine.c + gpu_engine.c (C, with
# TRAINYARD_CUDA) over the emulated gpu_model; nccl_comm without NCCL (one
# device: no communicator; the 2-GPU cases skip, one device is emulated)
make -s --no-print-directory CUDA=0 BUILD="$B" "$B/tests/check_strategy" >/dev/null
python3 bench/gpu/emu/translate.py executor/cuda/nccl_comm.cu "$B/emu/nccl_comm.cpp"
g++ $CXXFLAGS -c "$B/emu/nccl_comm.cpp" -o "$B/emu/nccl_comm.o"
CFLAGS="-std=gnu11 -O1 -g -D_GNU_SOURCE -DTRAINYARD_CUDA -I. $(pkg-config --cflags $PKGS) -I/usr/include/x86_64-linux-gnu/openblas-pthread $SAN"
gcc $CFLAGS -c executor/cuda/gpu_engine.c -o "$B/emu/gpu_engine.o"
gcc $CFLAGS -c executor/strategy/engine.c -o "$B/emu/engine.o"
gcc $CFLAGS -c tests/check_gpu_train.c -o "$B/emu/check_gpu_train.o"
objs_train=$(ls "$B"/obj/executor/comm/*.o "$B"/obj/executor/strategy/*.o "$B/obj/executor/train_loop.o" |
             grep -v '/strategy/engine.o$')
g++ $SAN -o "$B/bin/check_gpu_train_emu" "$B/emu/check_gpu_train.o" "$B"/emu/{gpu_model,gpu_conv,nccl_comm,emu,gpu_engine,engine}.o \
    $objs $objs_train $(pkg-config --libs $PKGS check) -lsqlite3 -lopenblas -lz -lm -lpthread
echo "emu: $B/bin/check_gpu_train_emu"
CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-1200} OPENBLAS_NUM_THREADS=1 "$B/bin/check_gpu_train_emu"
