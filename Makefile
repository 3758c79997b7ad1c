# Cephalo - one entry point. `make help` lists the targets.
#
#   make            build everything buildable here (planner library and the `cephalo` CLI)
#   make deps       install the missing Debian packages (idempotent; needs root)
#   make test       unit + CLI tests; ends with "N passed, N failed"
#   make demo       the planner on the paper's Cluster A, then training on emulated devices
#   make bench      planning-time and CPU training benchmarks (against PyTorch)
#   make fuzz       libFuzzer targets for the cluster, model and profile parsers
#   SAN=1           build and test with AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-gpu   CUDA ops against the CPU device, the invariant and PyTorch oracles on the GPU
#   make bench-gpu  tokens/s, MFU and peak memory against PyTorch on the GPU
#   CUDA=auto|0|1   CUDA detection (auto: build cephalo-worker-cuda when nvcc is found)

SHELL := /bin/bash
CC ?= cc
SAN ?= 0
CUDA ?= auto
FUZZ_SECONDS ?= 60

NVCC := $(firstword $(wildcard /usr/local/cuda/bin/nvcc) $(shell command -v nvcc 2>/dev/null))
ifeq ($(CUDA),auto)
  HAVE_CUDA := $(if $(NVCC),1,0)
else ifeq ($(CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc was not found (looked in /usr/local/cuda/bin and PATH))
  endif
  HAVE_CUDA := 1
else ifeq ($(CUDA),0)
  HAVE_CUDA := 0
else
  $(error CUDA must be auto, 0 or 1 (got '$(CUDA)'))
endif

ifeq ($(SAN),1)
  BUILD := build/san
  OPT := -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined
  LDSAN := -fsanitize=address,undefined
else
  BUILD := build/rel
  OPT := -O2 -g
  LDSAN :=
endif

WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CPPFLAGS := -Icommon -Iplanner -Iworker -Ioperator -D_POSIX_C_SOURCE=200809L -DCEPHALO_HAVE_CUDA=$(HAVE_CUDA)
CFLAGS := -std=c17 $(OPT) $(WARN) -fopenmp -MMD -MP
# OpenBLAS's OpenMP build, linked by path: inside our own parallel regions it runs single-threaded
# instead of oversubscribing the cores (the pthread build would spawn its own threads).
BLAS_DIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
LDLIBS := -fopenmp -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lyaml -lcjson -lmicrohttpd -lpthread -lm

COMMON_SRC := $(wildcard common/*.c)
PLANNER_SRC := $(filter-out planner/cli.c,$(wildcard planner/*.c))
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(COMMON_SRC) $(PLANNER_SRC))
LIB := $(BUILD)/libcephalo-plan.a
CLI := $(BUILD)/bin/cephalo
WORKER_SRC := $(filter-out worker/main.c worker/comm_nccl.c,$(wildcard worker/*.c))
WLIB := $(BUILD)/libcephalo-worker.a
WORKER := $(BUILD)/bin/cephalo-worker
# the operator: its Kubernetes client, inventory and reconcile (libcurl) in a library that the
# unit tests link too, and the binary (operator/main.c)
OPERATOR_SRC := $(filter-out operator/main.c,$(wildcard operator/*.c))
OLIB := $(BUILD)/libcephalo-operator.a
OPERATOR := $(BUILD)/bin/cephalo-operator
TEST_SRC := $(wildcard tests/unit/test_*.c)
TESTS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCH := $(BUILD)/bench/bench_plan
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)

# ---- the CUDA worker (cephalo-worker-cuda): built whenever nvcc is found ----------------------
# The CPU binaries never link CUDA: the CUDA device (worker/*.cu) and the nccl backend
# (worker/comm_nccl.c) are linked into cephalo-worker-cuda only, which resolves the weak
# references device.c and comm.c make to them. SAN=1 builds skip it (ASan and the CUDA runtime
# do not mix without special options, and nothing here can run it).
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
CUDA_ARCHS := 80 86 89 90
NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                -gencode arch=compute_90,code=compute_90
NVCCFLAGS := -std=c++17 -O3 -lineinfo $(NVCC_GENCODE) -Icommon -Iworker \
             -DCEPHALO_HAVE_CUDA=1 --Werror all-warnings -Xcompiler -Wall,-Wextra,-Werror \
             -MMD -MP
CUDA_INC := -I$(CUDA_HOME)/include
CUDA_LIBDIRS := $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib
CUDA_LDLIBS := $(foreach l,$(CUDA_LIBDIRS),-L$(l) -Wl,-rpath,$(l)) -lcudart -lcublasLt -lcublas \
               -lnccl -lstdc++
CUDA_CU_SRC := $(wildcard worker/*.cu)
CUDA_C_SRC := $(wildcard worker/comm_nccl.c)
CUDA_OBJ := $(patsubst %.cu,$(BUILD)/%.cu.o,$(CUDA_CU_SRC)) $(patsubst %.c,$(BUILD)/cuda/%.o,$(CUDA_C_SRC))
WORKER_CUDA := $(BUILD)/bin/cephalo-worker-cuda
GPU_TEST_SRC := $(wildcard tests/gpu/test_*.c)
GPU_TESTS := $(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(GPU_TEST_SRC))
ifeq ($(HAVE_CUDA)$(SAN),10)
  CUDA_TARGETS := $(WORKER_CUDA) $(GPU_TESTS)
else
  CUDA_TARGETS :=
endif

.SECONDARY:
.PHONY: all deps test demo bench fuzz clean help info cuda test-gpu bench-gpu
all: $(CLI) $(WORKER) $(OLIB) $(OPERATOR) $(CUDA_TARGETS)

cuda: $(CUDA_TARGETS)
	@[ -n "$(CUDA_TARGETS)" ] || { echo "no CUDA build: nvcc not found, CUDA=0 or SAN=1" >&2; exit 1; }

help:
	@sed -n '2,14p' Makefile | sed 's/^# \{0,1\}//'

info:
	@echo "build dir: $(BUILD)  SAN=$(SAN)  CUDA=$(CUDA) -> HAVE_CUDA=$(HAVE_CUDA)  nvcc: $(or $(NVCC),not found)"

deps:
	@mk/deps.sh

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

$(LIB): $(LIB_OBJ)
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(WLIB): $(patsubst %.c,$(BUILD)/%.o,$(WORKER_SRC))
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(OLIB): $(patsubst %.c,$(BUILD)/%.o,$(OPERATOR_SRC))
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(OPERATOR): $(BUILD)/operator/main.o $(OLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS) -lcurl

$(CLI): $(BUILD)/planner/cli.o $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(WORKER): $(BUILD)/worker/main.o $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(OLIB) $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS) -lcurl -lcmocka

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CUDA_INC) $(CFLAGS) -c $< -o $@

$(WORKER_CUDA): $(BUILD)/worker/main.o $(CUDA_OBJ) $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDLIBS) $(CUDA_LDLIBS)

$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(CUDA_OBJ) $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDLIBS) $(CUDA_LDLIBS) -lcmocka

# GPU tests and benchmarks: they need a GPU (and PyTorch with CUDA for the peers); without one
# they say so and exit 0 after building everything.
test-gpu: deps $(CLI) $(WORKER) cuda
	@BUILD=$(BUILD) tests/gpu/run.sh $(GPU_TESTS)

bench-gpu: deps $(CLI) cuda
	@BUILD=$(BUILD) bench/bench_gpu.sh

$(BENCH): $(BUILD)/bench/bench_plan.o $(BUILD)/bench/paper_dp.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

test: deps $(CLI) $(WORKER) $(OPERATOR) $(TESTS)
	@BUILD=$(BUILD) tests/run.sh $(TESTS)

demo: deps $(CLI) $(WORKER)
	@BUILD=$(BUILD) mk/demo.sh

bench: deps $(BENCH) $(CLI) $(WORKER)
	@$(BENCH)
	@BUILD=$(BUILD) bench/bench_train.sh
	@BUILD=$(BUILD) bench/bench_fsdp.sh
	@BUILD=$(BUILD) bench/bench_accuracy.sh

# libFuzzer targets (clang), built apart from the normal objects.
FUZZ_BUILD := build/fuzz
FUZZ_CFLAGS := -std=c17 -g -O1 -fsanitize=fuzzer,address,undefined $(CPPFLAGS) -Wall -Wextra -Werror
# The parsers fuzzed need neither BLAS nor OpenMP: only these worker modules are linked in.
FUZZ_WORKER_SRC := $(wildcard worker/safetensors.c worker/data.c)
# the watch-stream parser alone: it has no libcurl dependency (the loop is in watch_loop.c)
FUZZ_OPERATOR_SRC := $(wildcard operator/watch.c)
$(FUZZ_BUILD)/%: fuzz/%.c $(COMMON_SRC) $(PLANNER_SRC) $(FUZZ_WORKER_SRC) $(FUZZ_OPERATOR_SRC)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $^ -lyaml -lcjson -lm

fuzz: deps $(patsubst fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRC))
	@FUZZ_SECONDS=$(FUZZ_SECONDS) mk/fuzz.sh $(patsubst fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRC))

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)
