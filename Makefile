# trainyard - build, test, run. See README.md.
#
#   make            optimized build: build/trainyard
#   make test       ASan/UBSan build of everything, then every test
#   make run        deps + build + `trainyard up`
#   make deps       install the Debian packages the build needs (idempotent)
#   make CUDA=1     also build the GPU path (auto when nvcc is found)
#
# Sources are found by folder, so a new .c file needs no edit here. Each test
# tests/check_X.c links the modules listed in DEPS_check_X (default: all).

SHELL := /bin/bash
CC ?= cc
BUILD ?= build
SAN ?= 0

# What pkg-config tells is read when make parses this file: on a fresh machine
# that is before `deps` has installed the packages, so the goals that install
# them (run, test) build in a sub-make that parses it again afterwards; a build
# without them stops at once and says what to run (check-pkgs).
PKGS := libmicrohttpd gnutls libcjson libcurl openssl libarchive cjose libpq
PKGS_OK := $(shell pkg-config --exists $(PKGS) 2>/dev/null && echo 1)
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CHECK_LIBS := $(shell pkg-config --libs check 2>/dev/null)
BLAS_CFLAGS := -I/usr/include/x86_64-linux-gnu/openblas-pthread

WARN := -Wall -Wextra -Werror -Wshadow -Wformat=2 -Wno-format-nonliteral
CFLAGS_BASE := -std=gnu11 $(WARN) -g -D_GNU_SOURCE -I. $(PKG_CFLAGS) $(BLAS_CFLAGS)
ifeq ($(SAN),1)
  OPT := -O1 -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
  NN_OPT := $(OPT)
  LDSAN := -fsanitize=address,undefined
else
  OPT := -O2
  NN_OPT := -O3 -march=native
  LDSAN :=
endif
CFLAGS ?=
ALL_CFLAGS := $(CFLAGS_BASE) $(OPT) $(CFLAGS)
LIBS := $(PKG_LIBS) -lsqlite3 -lopenblas -lz -lm -lpthread

# ------------------------------------------------------------------ CUDA
NVCC ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(origin CUDA),undefined)
  CUDA := $(if $(NVCC),1,0)
endif
CUDA_HOME ?= /usr/local/cuda
ifeq ($(CUDA),1)
  CU_SRC := $(wildcard executor/cuda/*.cu)
  ALL_CFLAGS += -DTRAINYARD_CUDA -I$(CUDA_HOME)/include
  LIBS += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas
  NCCL_LIB := $(firstword $(wildcard $(CUDA_HOME)/lib64/libnccl.so /usr/lib/x86_64-linux-gnu/libnccl.so))
  ifneq ($(NCCL_LIB),)
    ALL_CFLAGS += -DTRAINYARD_NCCL
    LIBS += -lnccl
  endif
  # the worker's GPU step engine (C; reached through engine_gpu_cuda, executor/strategy/engine.h)
  GPU_ENGINE_SRC := executor/cuda/gpu_engine.c
else
  CU_SRC :=
  GPU_ENGINE_SRC :=
endif

# ------------------------------------------------------------------ modules
COMMON_SRC  := $(wildcard common/*.c)
STORAGE_SRC := $(wildcard storage/*.c)
SPEC_SRC    := $(wildcard spec/*.c)
CLIENT_SRC  := $(wildcard client/*.c)
API_SRC     := $(wildcard api/*.c)
SERVER_SRC  := $(wildcard server/*.c)
CMD_SRC     := $(filter-out cmd/main.c,$(wildcard cmd/*.c))
SCHED_SRC   := $(wildcard scheduler/*.c)
NN_SRC      := $(wildcard executor/nn/*.c)
DATA_SRC    := $(wildcard executor/data/*.c)
EXEC_SRC    := $(wildcard executor/*.c)
COMM_SRC    := $(wildcard executor/comm/*.c)
STRAT_SRC   := $(wildcard executor/strategy/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))
COMMON_OBJ  := $(call obj,$(COMMON_SRC))
STORAGE_OBJ := $(call obj,$(STORAGE_SRC))
SPEC_OBJ    := $(call obj,$(SPEC_SRC))
CLIENT_OBJ  := $(call obj,$(CLIENT_SRC))
API_OBJ     := $(call obj,$(API_SRC))
SERVER_OBJ  := $(call obj,$(SERVER_SRC))
CMD_OBJ     := $(call obj,$(CMD_SRC))
SCHED_OBJ   := $(call obj,$(SCHED_SRC))
NN_OBJ      := $(call obj,$(NN_SRC))
DATA_OBJ    := $(call obj,$(DATA_SRC))
EXEC_OBJ    := $(call obj,$(EXEC_SRC))
COMM_OBJ    := $(call obj,$(COMM_SRC))
STRAT_OBJ   := $(call obj,$(STRAT_SRC))
CU_OBJ      := $(patsubst %.cu,$(BUILD)/obj/%.o,$(CU_SRC))
GPU_ENGINE_OBJ := $(call obj,$(GPU_ENGINE_SRC)) $(CU_OBJ)
# The dashboard (web/), the OpenAPI document and the examples are compiled into the binary
# (scripts/embed_assets.sh writes a C table; server/static.c serves it).
ASSET_SRC   := $(shell find web -type f ! -name '.*' 2>/dev/null | LC_ALL=C sort) api/openapi.json \
               $(sort $(wildcard examples/*.json))
# web/vendor/'s scripts and style sheets go in gzip'd (-9n: no name, no time, the same
# bytes every build): static.c sends them so to a browser, inflated to a client without gzip.
ASSET_GZIP  := $(filter web/vendor/%.js web/vendor/%.css,$(ASSET_SRC))
ASSET_EMBED := $(filter-out $(ASSET_GZIP),$(ASSET_SRC)) $(patsubst %,$(BUILD)/gen/gz/%.gz,$(ASSET_GZIP))
ASSET_OBJ   := $(BUILD)/obj/gen/assets.o
SERVER_OBJ  += $(ASSET_OBJ)
ENGINE_OBJ  := $(COMMON_OBJ) $(SPEC_OBJ) $(NN_OBJ) $(DATA_OBJ)
LIB_OBJ     := $(COMMON_OBJ) $(STORAGE_OBJ) $(SPEC_OBJ) $(CLIENT_OBJ) $(API_OBJ) $(SERVER_OBJ) $(CMD_OBJ) \
               $(SCHED_OBJ) $(NN_OBJ) $(DATA_OBJ) $(COMM_OBJ) $(STRAT_OBJ) $(EXEC_OBJ) $(GPU_ENGINE_OBJ)

# Which modules each test links (default: all of them).
DEPS_check_flags   := $(COMMON_OBJ)
DEPS_check_ws      := $(COMMON_OBJ)
DEPS_check_jobspec := $(COMMON_OBJ) $(SPEC_OBJ)
DEPS_check_nn      := $(ENGINE_OBJ) $(COMM_OBJ) $(STRAT_OBJ) $(GPU_ENGINE_OBJ)
DEPS_check_data    := $(ENGINE_OBJ)
DEPS_check_conv    := $(ENGINE_OBJ)
DEPS_check_storage := $(COMMON_OBJ) $(SPEC_OBJ) $(STORAGE_OBJ)
DEPS_check_sched   := $(COMMON_OBJ) $(SPEC_OBJ) $(STORAGE_OBJ) $(SCHED_OBJ)
DEPS_check_sweep_logic := $(COMMON_OBJ) $(SPEC_OBJ) $(BUILD)/obj/scheduler/sweep.o
DEPS_check_comm    := $(COMMON_OBJ) $(COMM_OBJ)
DEPS_check_strategy := $(ENGINE_OBJ) $(COMM_OBJ) $(STRAT_OBJ) $(BUILD)/obj/executor/train_loop.o $(GPU_ENGINE_OBJ)
DEPS_check_oidc    := $(COMMON_OBJ) $(BUILD)/obj/server/oidc.o
DEPS_check_blob    := $(COMMON_OBJ) $(STORAGE_OBJ) $(SPEC_OBJ)
DEPS_check_sigv4   := $(COMMON_OBJ)
# tests/check_image.c makes the test registry's bcrypt login (crypt_gensalt_rn)
LIBS_check_image := -lcrypt

TEST_SRC := $(wildcard tests/check_*.c)
TEST_BIN := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRC))

.PHONY: all deps test test-pg run check-pkgs clean bench-api bench-train bench-sched bench-elastic bench-scaling install-deps-bench bench-allreduce bench-cluster
all: $(BUILD)/trainyard

$(BUILD)/obj/executor/nn/%.o: executor/nn/%.c | check-pkgs
	@mkdir -p $(dir $@)
	@echo "  CC  $<"
	@$(CC) $(CFLAGS_BASE) $(NN_OPT) $(CFLAGS) $(filter -DTRAINYARD_%,$(ALL_CFLAGS)) -MMD -MP -c $< -o $@

# The collectives' reduce loops, like the engine: -O3 -march=native (sanitized under SAN=1).
$(BUILD)/obj/executor/comm/%.o: executor/comm/%.c | check-pkgs
	@mkdir -p $(dir $@)
	@echo "  CC  $<"
	@$(CC) $(CFLAGS_BASE) $(NN_OPT) $(CFLAGS) $(filter -DTRAINYARD_%,$(ALL_CFLAGS)) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.c | check-pkgs
	@mkdir -p $(dir $@)
	@echo "  CC  $<"
	@$(CC) $(ALL_CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/gen/gz/%.gz: %
	@mkdir -p $(dir $@)
	@echo "  GZ  $<"
	@gzip -9nc $< > $@.tmp && mv $@.tmp $@

$(BUILD)/gen/assets.c: $(ASSET_EMBED) scripts/embed_assets.sh
	@mkdir -p $(dir $@)
	@echo "  GEN $@"
	@scripts/embed_assets.sh $@ $(BUILD)/gen/gz/ $(ASSET_EMBED)

$(ASSET_OBJ): $(BUILD)/gen/assets.c
	@mkdir -p $(dir $@)
	@echo "  CC  $<"
	@$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC $<"
	@$(NVCC) $(NVCCFLAGS) -I. $(filter -DTRAINYARD_%,$(ALL_CFLAGS)) -MMD -MP -c $< -o $@

$(BUILD)/trainyard: $(BUILD)/obj/cmd/main.o $(LIB_OBJ)
	@echo "  LD  $@"
	@$(CC) $(LDSAN) -o $@ $^ $(LIBS)

.SECONDEXPANSION:
$(BUILD)/tests/%: tests/%.c $$(if $$(DEPS_$$*),$$(DEPS_$$*),$$(LIB_OBJ))
	@mkdir -p $(dir $@)
	@echo "  LD  $@"
	@$(CC) $(ALL_CFLAGS) -o $@ $< $(if $(DEPS_$*),$(DEPS_$*),$(LIB_OBJ)) $(LIBS) $(LIBS_$*) $(CHECK_LIBS) $(LDSAN)

tests: $(TEST_BIN)

# make test: the sanitized build of everything, then every test binary.
# Each prints check's summary line; the run fails if any test fails.
# The sanitized build uses every core unless make already runs with -j (a jobserver).
test: deps
	$(MAKE) --no-print-directory $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc)) \
	    SAN=1 CUDA=0 BUILD=build/asan build/asan/trainyard $(patsubst $(BUILD)/%,build/asan/%,$(TEST_BIN))
	@tests/run_all.sh build/asan

# make test-pg: the sanitized build, then every test binary on PostgreSQL 15
# (tests/run_pg.sh: one PostgreSQL from scripts/pg-dev.sh, TY_PG_URL; those
# that open no store run as in make test). make test runs the store, the
# scheduler and the API suites so (tests/run_all.sh's PostgreSQL lane).
test-pg: deps
	$(MAKE) --no-print-directory $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(shell nproc)) \
	    SAN=1 CUDA=0 BUILD=build/asan build/asan/trainyard $(patsubst $(BUILD)/%,build/asan/%,$(TEST_BIN))
	@PG_TEST_REQUIRED=$${PG_TEST_REQUIRED:-$$([ "$$(id -u)" = 0 ] && [ -x /usr/lib/postgresql/15/bin/postgres ] && echo 1 || echo 0)} \
	  tests/run_pg.sh build/asan

# make run: deps, then the build in a sub-make (it reads pkg-config after the
# packages are there), then scripts/run.sh. ONCE=1: stop once the demo job has
# ended, exiting 0 only if it succeeded (a smoke test of an install).
run: deps
	@$(MAKE) --no-print-directory all
	ONCE=$(ONCE) scripts/run.sh

# every object waits for this: without the packages, one line that says what to run
check-pkgs:
	@if [ "$(PKGS_OK)" != 1 ]; then \
	  echo "trainyard: the build needs packages pkg-config does not find ($(PKGS)):" >&2; \
	  echo "  run 'make deps' (or 'make run' / 'make test', which install them first)" >&2; exit 1; fi

deps:
	@scripts/deps.sh

# ------------------------------------------------------------------ benchmarks (bench/, docs/measurements.md)
# The benchmarks' own programs are built here, from this build's objects and
# the tree's one link list ($(LIBS)), as the binary and the tests are: a
# bench/*/run.sh asks for its program by name (`make build/bench/NAME`) and
# never links by hand, so a library the tree gains reaches every benchmark.
BENCH_SRC_comm_bench           := bench/allreduce/comm_bench.c
BENCH_SRC_sched_sim            := bench/sched_sim/sim.c
BENCH_SRC_sched_db_pass        := bench/sched_sim/db_pass.c
BENCH_SRC_scaling              := bench/scaling/scaling.c
BENCH_SRC_mlp_bench            := bench/train_vs_pytorch/mlp_bench.c
BENCH_SRC_isolation_start_cost := bench/isolation/start_cost.c
BENCH_SRC_simagents            := bench/cluster/simagents.c
BENCH_SRC_proxy_bench          := bench/proxy/proxy_bench.c
BENCH_SRC_blobput              := bench/blobs/blobput.c
BENCH_PROGS := comm_bench sched_sim sched_db_pass scaling mlp_bench isolation_start_cost simagents proxy_bench blobput
BENCH_BIN   := $(patsubst %,$(BUILD)/bench/%,$(BENCH_PROGS))

$(BUILD)/bench/%: $$(BENCH_SRC_$$*) $(LIB_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LD  $@"
	@$(CC) $(ALL_CFLAGS) -o $@ $(BENCH_SRC_$*) $(LIB_OBJ) $(LIBS) $(LDSAN)

.PHONY: bench-bins bench-smoke
bench-bins: $(BENCH_BIN)

# bench-smoke: every bench-* target in its smoke form (SMOKE=1: the smallest
# sizes, one round, seconds each) on the optimized build; fails when one does
# not end with its JSON result line (tests/bench_smoke.sh; `make test` runs it).
bench-smoke: all bench-bins
	tests/bench_smoke.sh

# bench-api: GETs and submissions under wrk (bench/api/run.sh); DB=postgres or
# DB=both: the same load on a server on SQLite and one on a real PostgreSQL 15,
# one table (bench/api/stores.sh; docs/measurements.md, "The REST API on PostgreSQL")
bench-api: all
	bench/api/run.sh

# bench-blobs: a 1 GiB checkpoint through the server (DATA) against through an
# S3 store (radosgw on loopback, the worker's presigned multipart path): time
# and the server's CPU; a burst of 16 x 64 MiB through the store must cost
# the server < 0.10 of a core (root; docs/measurements.md)
.PHONY: bench-blobs
bench-blobs: all
	bench/blobs/run.sh

bench-train: all
	bench/train_vs_pytorch/run.sh

# The Fashion-MNIST CNN against PyTorch (speed, peak memory, 5-epoch accuracy);
# the script builds its own CPU-only trainyard.
.PHONY: bench-train-cnn
bench-train-cnn:
	BUILD=$(BUILD) bench/train_vs_pytorch/cnn.sh

bench-sched: all
	bench/sched_sim/run.sh

# bench-sched-db: the pass over a real SQLite file at the target's size,
# 10,000 nodes x 8 GPUs and 100,000 queued jobs (docs/measurements.md, "The
# whole pass on SQLite"; the target: a median under 40 ms). DB=postgres: on a
# real PostgreSQL 15 (synchronous_commit on, then off); DB=both: SQLite too,
# one table ("The pass on PostgreSQL")
.PHONY: bench-sched-db
bench-sched-db: all
	bench/sched_sim/run.sh db --nodes 10000 --jobs 100000

bench-elastic: all
	bench/elastic/run.sh

# bench-evaluator: what an evaluator side-car costs the training beside it (docs/measurements.md)
# bench-isolation: the per-task cost of isolating a task (root; docs/measurements.md)
.PHONY: bench-evaluator bench-isolation
bench-evaluator: all
	bench/evaluator/run.sh

bench-isolation: all
	bench/isolation/run.sh

bench-allreduce:
	bench/allreduce/run.sh

bench-scaling: all
	bench/scaling/run.sh

# bench-sweep: ASHA against the full grid of 12 trials on Fashion-MNIST
# (bench/sweep/run.sh; docs/measurements.md, "Sweeps")
.PHONY: bench-sweep
bench-sweep: all
	BIN=$$PWD/$(BUILD)/trainyard bench/sweep/run.sh

# bench-images: what an OCI image and a 10 MiB context add to a command job's
# start (bench/images/run.sh; root, podman, docker-registry)
.PHONY: bench-images
bench-images: all
	BIN=$$PWD/$(BUILD)/trainyard bench/images/run.sh

# bench-cluster: thousands of simulated agents (bench/cluster/simagents.c)
# against one real server: AGENTS="1000 5000" by default, RATE jobs/s for
# DUR s, and the before/after of the server's old paths (docs/measurements.md,
# "Cluster of simulated agents").
bench-cluster: all
	bench/cluster/run.sh

# bench-proxy: the reverse proxy (server/proxy.c) against direct and against
# nginx as a reverse proxy, wrk on one app on loopback (bench/proxy/run.sh;
# docs/measurements.md, "The reverse proxy")
.PHONY: bench-proxy
bench-proxy: all
	BUILD=$(BUILD) bench/proxy/run.sh

# bench-proxy-load: the server's own API latency, idle and while its proxy
# holds 100 requests and 20 WebSockets to a job's port (bench/proxy/api_load.sh;
# docs/measurements.md, "The API beside the proxy")
.PHONY: bench-proxy-load
bench-proxy-load: all
	BUILD=$(BUILD) bench/proxy/api_load.sh

# bench-ha: two servers on one PostgreSQL, each in a network namespace; 10
# runs (HA_RUNS=N), alternately a kill -9 of the leader and a cut of its
# network: the takeover time, what a curl client sees meanwhile, nothing
# acknowledged lost or doubled, the faulted server back as a standby (root,
# PostgreSQL 15; bench/ha/run.sh; docs/ha.md, "Takeover, measured")
.PHONY: bench-ha
bench-ha: all
	BIN=$$PWD/$(BUILD)/trainyard bench/ha/run.sh

# demo-pg-ha: PostgreSQL itself highly available under a server (pg_auto_failover:
# a monitor, a primary and its synchronous secondary on loopback; the server
# given both in one multi-host URL), a job training through `pg_autoctl perform
# failover` (root; scripts/pg-ha-demo.sh; docs/ha.md). A demo to read, not a test.
.PHONY: demo-pg-ha
demo-pg-ha: all
	@d=$$(mktemp -d /tmp/ty_pg_ha.XXXXXX) && BIN=$$PWD/$(BUILD)/trainyard scripts/pg-ha-demo.sh run $$d

# ------------------------------------------------------------------ faults and load (docs/reliability.md)
# test-faults: tests/check_faults in its long form (FAULTS_LONG=1: 500
# submissions across a server kill -9, worker and agent kill -9, cut and bad
# checkpoint uploads, a full tmpfs, 64 writers x 60 rounds) on the sanitized
# build; `make test` runs its short form with every other test.
# bench-load: bench/load/run.sh (wrk while 2 jobs train, slurmrestd peer).
.PHONY: test-faults bench-load
test-faults: deps
	$(MAKE) --no-print-directory SAN=1 CUDA=0 BUILD=build/asan build/asan/trainyard build/asan/tests/check_faults
	TRAINYARD_BIN=$$PWD/build/asan/trainyard FAULTS_LONG=1 OPENBLAS_NUM_THREADS=1 build/asan/tests/check_faults

bench-load: all
	bench/load/run.sh
# ------------------------------------------------------------------ end of faults and load

# ------------------------------------------------------------------ GPU (docs/gpu.md)
# nvcc: Hopper machine code plus PTX; no C++ runtime in the objects (the
# link is cc's). CUDA_ARCH="-arch=native" on a machine with a GPU.
CUDA_ARCH ?= -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
NVCCFLAGS ?= -O3 -std=c++17 $(CUDA_ARCH) \
             -Xcompiler -fPIC,-Wall,-Wextra,-Werror,-fno-exceptions,-fno-threadsafe-statics
DEPS_check_gpu := $(ENGINE_OBJ) $(CU_OBJ)
DEPS_check_gpu_train := $(ENGINE_OBJ) $(COMM_OBJ) $(STRAT_OBJ) $(BUILD)/obj/executor/train_loop.o $(GPU_ENGINE_OBJ)

# gpu-build: the GPU test and benchmark in build/gpu/bin, linked with none of
# the server's libraries (no libmicrohttpd, cJSON, SQLite, curl, libarchive: the engine's
# objects without the spec parser and checkpoint.c; jobspecs built in C),
# with the CUDA runtime, check, zlib and libcrypto static, so the
# folder runs on a GPU machine that has the driver and cuBLAS only. Portable
# CPU code (x86-64-v3), not -march=native. Carry build/gpu to that machine.
GPU_BUILD ?= build/gpu
# bench/gpu/ref_cblas.c stands in for OpenBLAS there (a static OpenBLAS is
# 30 MB a binary, too much to carry).
GPU_LINK_OBJ = $(filter-out %/ctxtar.o,$(COMMON_OBJ)) $(BUILD)/obj/spec/shapes.o \
               $(filter-out %/checkpoint.o,$(NN_OBJ)) $(DATA_OBJ) \
               $(filter-out %/nccl_comm.o,$(CU_OBJ)) $(BUILD)/obj/bench/gpu/ref_cblas.o
GPU_LINK_LIBS = -L$(CUDA_HOME)/lib64 -Wl,--as-needed -Wl,-rpath,$(CUDA_HOME)/lib64 \
                -lcublas -lcublasLt -Wl,-Bstatic -lcudart_static -lcheck_pic -lsubunit \
                -lcrypto -lz -Wl,-Bdynamic -ldl -lrt -lpthread -lm
$(BUILD)/bin/check_gpu: tests/check_gpu.c $(GPU_LINK_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LD  $@"
	@$(CC) $(ALL_CFLAGS) -o $@ $< $(GPU_LINK_OBJ) $(GPU_LINK_LIBS)
# check_gpu_train (the worker's GPU engine under train_loop): also the spec
# parser, checkpoints (cJSON: libcjson.so.1 goes to BUILD/lib, found through
# $$ORIGIN), the collectives and strategies, and NCCL (dynamic: the GPU
# machine's, e.g. PyTorch's nvidia/nccl wheel, docs/gpu.md).
GPU_TRAIN_OBJ = $(filter-out %/ctxtar.o,$(COMMON_OBJ)) $(SPEC_OBJ) $(NN_OBJ) $(DATA_OBJ) $(COMM_OBJ) $(STRAT_OBJ) \
                $(BUILD)/obj/executor/train_loop.o $(GPU_ENGINE_OBJ) $(BUILD)/obj/bench/gpu/ref_cblas.o \
                $(BUILD)/obj/tests/gpu_blas_stub.o
$(BUILD)/bin/check_gpu_train: tests/check_gpu_train.c $(GPU_TRAIN_OBJ)
	@mkdir -p $(dir $@) $(BUILD)/lib
	@echo "  LD  $@"
	@cp -L $$(pkg-config --variable=libdir libcjson)/libcjson.so.1 $(BUILD)/lib/
	@$(CC) $(ALL_CFLAGS) -o $@ $< $(GPU_TRAIN_OBJ) -Wl,-rpath,'$$ORIGIN/../lib' -lcjson \
	    $(GPU_LINK_LIBS) -L$(CUDA_HOME)/lib64 -lnccl
$(BUILD)/bin/gpu_bench: bench/gpu/gpu_bench.c $(GPU_LINK_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LD  $@"
	@$(CC) $(ALL_CFLAGS) -o $@ $< $(GPU_LINK_OBJ) $(GPU_LINK_LIBS)

# The full trainyard for a GPU machine (gpu-bundle): every module with the
# GPU engine and NCCL, the reference GEMM for the CPU engine (no OpenBLAS to
# carry), the CUDA runtime static, cuBLAS and NCCL the machine's. DT_RPATH
# (not RUNPATH) $$ORIGIN/../lib: the carried libraries' own dependencies are
# found there too. Contexts are left out (bench/gpu/ctxtar_none.c stands in):
# libarchive would bring libxml2 and ICU, 35 MB over what the bundle may carry.
GPU_FULL_OBJ = $(BUILD)/obj/cmd/main.o $(filter-out %/ctxtar.o,$(LIB_OBJ)) $(BUILD)/obj/bench/gpu/ref_cblas.o \
               $(BUILD)/obj/tests/gpu_blas_stub.o $(BUILD)/obj/bench/gpu/ctxtar_none.o
$(BUILD)/bin/trainyard: $(GPU_FULL_OBJ)
	@mkdir -p $(dir $@)
	@echo "  LD  $@"
	@$(CC) -o $@ $(GPU_FULL_OBJ) -Wl,--disable-new-dtags -Wl,-rpath,'$$ORIGIN/../lib' \
	    $(filter-out -larchive,$(PKG_LIBS)) -lsqlite3 -lz -lm -lpthread -L$(CUDA_HOME)/lib64 -Wl,--as-needed -lnccl -lcublas -lcublasLt \
	    -Wl,-Bstatic -lcudart_static -Wl,-Bdynamic -ldl -lrt

# gpu-bundle: one folder for a GPU machine (docs/gpu.md): bin/ (trainyard,
# check_gpu, check_gpu_train, gpu_bench), lib/ (every library they need that
# is neither the C library nor CUDA's), examples/, a slice of Fashion-MNIST,
# bench/gpu/ with verify.sh. Under 64 MiB.
GPU_BUNDLE ?= build/gpu-bundle
.PHONY: gpu-bundle
gpu-bundle:
	@test -n "$(NVCC)" || { echo "gpu-bundle: nvcc not found (CUDA toolkit at $(CUDA_HOME)?)"; exit 1; }
	$(MAKE) --no-print-directory CUDA=1 BUILD=$(GPU_BUILD) NN_OPT="-O3 -march=x86-64-v3" \
	    $(GPU_BUILD)/bin/check_gpu $(GPU_BUILD)/bin/gpu_bench $(GPU_BUILD)/bin/check_gpu_train \
	    $(GPU_BUILD)/bin/trainyard
	@bench/gpu/bundle.sh $(GPU_BUILD) $(GPU_BUNDLE)

.PHONY: gpu-build gpu-test bench-gpu
gpu-build:
	@test -n "$(NVCC)" || { echo "gpu-build: nvcc not found (CUDA toolkit at $(CUDA_HOME)?)"; exit 1; }
	$(MAKE) --no-print-directory CUDA=1 BUILD=$(GPU_BUILD) NN_OPT="-O3 -march=x86-64-v3" \
	    $(GPU_BUILD)/bin/check_gpu $(GPU_BUILD)/bin/gpu_bench $(GPU_BUILD)/bin/check_gpu_train
	@bench/gpu/bundle_data.sh $(GPU_BUILD)

gpu-test: gpu-build
	bench/gpu/gpu-test.sh $(GPU_BUILD)

bench-gpu: gpu-build
	bench/gpu/run.sh $(GPU_BUILD)

# ---- fuzzing (docs/reliability.md)
# libFuzzer targets tests/fuzz/fuzz_X.c -> build/fuzz/fuzz_X (clang, ASan+UBSan,
# every object built with -fsanitize=fuzzer-no-link into build/fuzz/obj).
# A target that #includes a module's .c (to reach its static parsers) names
# that object in FUZZ_EXCL_fuzz_X. Seeds: tests/fuzz/corpus/X, dictionary
# tests/fuzz/X.dict. fuzz-ci: 60 s each, fails on any crash/leak/UB;
# fuzz-long: FUZZ_SECONDS (600) each, one after the other. FUZZ_RUN="fuzz_csv"
# runs only those. Work corpora, logs and crash inputs go to build/fuzz/.
FUZZ_CC ?= clang
FUZZ_BUILD := build/fuzz
FUZZ_SECONDS ?= 600
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_RUN ?= $(FUZZ_TARGETS)
FUZZ_EXCL_fuzz_http_route := $(BUILD)/obj/server/http.o
FUZZ_EXCL_fuzz_worker_config := $(BUILD)/obj/executor/worker.o
FUZZ_EXCL_fuzz_agent_assignments := $(BUILD)/obj/executor/agent.o
FUZZ_EXCL_fuzz_ps := $(BUILD)/obj/executor/strategy/ps.o
# tests/check_{agent,worker}_parse.c #include agent.c / worker.c (bugs fuzzing found there)
DEPS_check_agent_parse = $(filter-out %/executor/agent.o,$(LIB_OBJ))
DEPS_check_worker_parse = $(filter-out %/executor/worker.o,$(LIB_OBJ))

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(LIB_OBJ) $(wildcard tests/fuzz/*.h)
	@echo "  LD  $@"
	@$(CC) $(ALL_CFLAGS) -fsanitize=fuzzer -o $@ $< $(filter-out $(FUZZ_EXCL_fuzz_$*),$(LIB_OBJ)) $(LIBS) $(LDSAN)

.PHONY: fuzz fuzz-ci fuzz-long fuzz-bins
fuzz-bins: $(patsubst %,$(BUILD)/%,$(FUZZ_TARGETS))

fuzz:
	@command -v $(FUZZ_CC) >/dev/null || { echo "fuzz: $(FUZZ_CC) not found (apt-get install clang libclang-rt-dev)"; exit 1; }
	$(MAKE) --no-print-directory CC=$(FUZZ_CC) SAN=1 CUDA=0 BUILD=$(FUZZ_BUILD) CFLAGS=-fsanitize=fuzzer-no-link fuzz-bins

fuzz-ci: fuzz
	tests/fuzz/run.sh $(FUZZ_BUILD) 60 $(FUZZ_RUN)

fuzz-long: fuzz
	tests/fuzz/run.sh $(FUZZ_BUILD) $(FUZZ_SECONDS) $(FUZZ_RUN)

clean:
	rm -rf build

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
