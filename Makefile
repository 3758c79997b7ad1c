# Cephalo - one entry point. `make help` lists the targets.
#
#   make            build everything buildable here (planner library and the `cephalo` CLI)
#   make deps       install the missing Debian packages (idempotent; needs root)
#   make test       unit + CLI tests; ends with "N passed, N failed"
#   make demo       the planner on the paper's Cluster A, then training on emulated devices
#   make k8s-demo   the operator on the project's own control plane with fake GPU nodes (2 L4, A10G,
#                   T4): the chart installed, a CPU-sized CephaloJob watched to Succeeded, torn down
#   make bench      planning-time and CPU training benchmarks (against PyTorch), `cephalo report` of 3M log lines
#   make fuzz       libFuzzer targets for the parsers of user input (fuzz/fuzz_*.c)
#   SAN=1           build and test with AddressSanitizer + UndefinedBehaviorSanitizer
#   make test-gpu   CUDA ops against the CPU device, the invariant and PyTorch oracles on the GPU
#   make bench-gpu  tokens/s, MFU and peak memory against PyTorch on the GPU
#   make bench-operator  the operator on the test control plane: 300 fake GPU nodes, 50 jobs; time to
#                   their pods, API requests/s per job at rest (OPERATOR=BIN, BENCH_OP_*: see the script)
#   CUDA=auto|0|1   CUDA detection (auto: build cephalo-worker-cuda when nvcc is found)
#   CUDA_ARCHS=...  GPU architectures built (default: those of 60 61 70 75 80 86 89 90 nvcc has)
#   make cuda-check compile worker/devices/*.cu for sm_60..sm_90 with CUDA 11.8 (cached) and sm_75 with nvcc,
#                   with ptxas -v tables (registers, spills; fails if the mma attention spills on sm_80/90)
#   make version    the version of this tree: VERSION, plus `git describe` for development builds
#   make dist       dist/cephalo-VERSION.tar.gz (the source) and the chart package (helm package)
#   make images     the operator and CPU worker images with buildah + mmdebstrap (no registry;
#                   cached in ~/.cache/cephalo-images; docker/build-images.sh)

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
# Headers are included by their path (docs/development.md, "Layout"): "common/log.h", "planner/model.h",
# and inside the worker by its layer, "model/train.h" (-Iworker), so that the planner's model.h and
# the worker's model/ cannot be confused.
INC_DIRS := . worker
CPPFLAGS := $(addprefix -I,$(INC_DIRS)) -I$(BUILD)/gen -D_POSIX_C_SOURCE=200809L -DCEPHALO_HAVE_CUDA=$(HAVE_CUDA)
CFLAGS := -std=c17 $(OPT) $(WARN) -fopenmp -MMD -MP
# OpenBLAS's OpenMP build, linked by path: inside our own parallel regions it runs single-threaded
# instead of oversubscribing the cores (the pthread build would spawn its own threads).
BLAS_DIR := /usr/lib/x86_64-linux-gnu/openblas-openmp
LDLIBS := -fopenmp -L$(BLAS_DIR) -Wl,-rpath,$(BLAS_DIR) -lopenblas -lyaml -lcjson -lmicrohttpd -lpthread -lm

COMMON_SRC := $(wildcard common/*.c)
PLANNER_SRC := $(wildcard planner/*.c)
LIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(COMMON_SRC) $(PLANNER_SRC))
LIB := $(BUILD)/libcephalo-plan.a
# the `cephalo` command: its subcommands (run, job files, the progress view, profile) in a library
# the tests link too, and cli/main.c
CLI_SRC := $(filter-out cli/main.c,$(wildcard cli/*.c))
CLILIB := $(BUILD)/libcephalo-cli.a
CLI := $(BUILD)/bin/cephalo
WORKER_SRC := $(filter-out worker/cmd/main.c worker/comm/comm_nccl.c,$(wildcard worker/*/*.c))
WLIB := $(BUILD)/libcephalo-worker.a
WORKER := $(BUILD)/bin/cephalo-worker
# the operator: its Kubernetes client, inventory and reconcile (libcurl) in a library that the
# unit tests link too, and the binary (operator/main.c)
OPERATOR_SRC := $(filter-out operator/main.c,$(wildcard operator/*.c operator/client/*.c))
OLIB := $(BUILD)/libcephalo-operator.a
OPERATOR := $(BUILD)/bin/cephalo-operator
TEST_SRC := $(wildcard tests/unit/test_*.c)
TESTS := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(TEST_SRC))
BENCH := $(BUILD)/bench/bench_plan
# tokenizers: the agreement checker of tests/cli/test_tokenizer.sh and the throughput benchmark
TOKCHECK := $(BUILD)/tests/tok/tokcheck
BENCH_TOK := $(BUILD)/bench/bench_tok
BENCH_SAMPLE := $(BUILD)/bench/bench_sample
# loopback throughput of the socket backend's collectives (docs/comm.md, "Throughput")
BENCH_COMM := $(BUILD)/bench/bench_comm
# the checkpoint checksum's rate (docs/checkpoints.md)
BENCH_CRC := $(BUILD)/bench/bench_crc
FUZZ_SRC := $(wildcard fuzz/fuzz_*.c)

# ---- the CUDA worker (cephalo-worker-cuda): built whenever nvcc is found ----------------------
# The CPU binaries never link CUDA: the CUDA device (worker/devices/*.cu) and the nccl backend
# (worker/comm/comm_nccl.c) are linked into cephalo-worker-cuda only, where they register their rows
# in device.c's and comm.c's tables at start-up. SAN=1 builds skip it (ASan and the CUDA runtime
# do not mix without special options, and nothing here can run it).
CUDA_HOME := $(patsubst %/bin/nvcc,%,$(NVCC))
# The architectures: by default every one of CUDA_ARCHS_ALL that this nvcc can compile for (nvcc 13:
# 75 80 86 89 90; CUDA 11.8 and 12.x: all eight), or CUDA_ARCHS="..." on the command line. Each
# gets SASS, and the newest also PTX, which the driver JIT-compiles for newer GPUs. The list is
# compiled in (CEPHALO_CUDA_ARCHS): the CUDA device names it when a GPU is not covered.
CUDA_ARCHS_ALL := 60 61 70 75 80 86 89 90
comma := ,
ifeq ($(HAVE_CUDA),1)
  NVCC_SM := $(patsubst sm_%,%,$(filter sm_%,$(shell $(NVCC) --list-gpu-code 2>/dev/null)))
  CUDA_ARCHS := $(if $(NVCC_SM),$(filter $(NVCC_SM),$(CUDA_ARCHS_ALL)),$(CUDA_ARCHS_ALL))
endif
CUDA_ARCHS_NEWEST := $(lastword $(shell printf '%s\n' $(CUDA_ARCHS) | sort -n))
NVCC_GENCODE := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                $(if $(CUDA_ARCHS_NEWEST),-gencode arch=compute_$(CUDA_ARCHS_NEWEST)$(comma)code=compute_$(CUDA_ARCHS_NEWEST))
# flags of every CUDA compile (the build's and cuda-check's); -Wno-deprecated-gpu-targets: nvcc
# 12.8+ warns that sm_60-70 are deprecated, which --Werror would turn into an error
NVCC_COMMON := -std=c++17 -O3 -lineinfo $(addprefix -I,$(INC_DIRS)) -DCEPHALO_HAVE_CUDA=1 \
               --Werror all-warnings -Wno-deprecated-gpu-targets -Xcompiler -Wall,-Wextra,-Werror \
               -MMD -MP
# NVCC_DEFS: extra defines for a variant build, e.g. the Turing attention path on an sm_80+ card:
#   make cuda BUILD=build/k8 NVCC_DEFS=-DCEPHALO_MMA_K8=1   (docs/cuda.md)
NVCC_DEFS ?=
NVCCFLAGS := $(NVCC_COMMON) $(NVCC_GENCODE) -DCEPHALO_CUDA_ARCHS='"$(CUDA_ARCHS)"' $(NVCC_DEFS)
CUDA_INC := -I$(CUDA_HOME)/include
CUDA_LIBDIRS := $(CUDA_HOME)/lib64 $(CUDA_HOME)/lib
CUDA_LDLIBS := $(foreach l,$(CUDA_LIBDIRS),-L$(l) -Wl,-rpath,$(l)) -lcudart -lcublasLt -lcublas \
               -lnccl -lstdc++
CUDA_CU_SRC := $(wildcard worker/*/*.cu)
CUDA_C_SRC := $(wildcard worker/comm/comm_nccl.c)
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
.PHONY: all deps controlplane test demo k8s-demo bench fuzz clean help info cuda test-gpu bench-gpu bench-operator cuda-check cuda-check-run cuda-check-objs cuda118 images
all: $(CLI) $(WORKER) $(OLIB) $(OPERATOR) $(CUDA_TARGETS)

cuda: $(CUDA_TARGETS)
	@[ -n "$(CUDA_TARGETS)" ] || { echo "no CUDA build: nvcc not found, CUDA=0 or SAN=1" >&2; exit 1; }

help:
	@sed -n '/^$$/q;2,$$p' Makefile | sed 's/^# \{0,1\}//'

info:
	@echo "build dir: $(BUILD)  SAN=$(SAN)  CUDA=$(CUDA) -> HAVE_CUDA=$(HAVE_CUDA)  nvcc: $(or $(NVCC),not found)"
	@echo "CUDA_ARCHS: $(or $(CUDA_ARCHS),none (no CUDA build))$(if $(CUDA_ARCHS_NEWEST), (SASS each; PTX for $(CUDA_ARCHS_NEWEST)))"

deps:
	@mk/deps.sh

# The test control plane (tests/k8s/apiserver.sh: kube-apiserver, scheduler, controller-manager
# from Debian's kubernetes source), built once into its cache before any suite runs: whether it
# exists must not depend on which suite runs first, nor on SAN=1 leaving out the suite that used
# to build it (test_k8s.sh), as happened on a machine with empty caches. Building needs root;
# without it the operator suites say how to build it.
controlplane: deps
	@tests/k8s/apiserver.sh built || { [ "$$(id -u)" != 0 ] && \
	  echo "make: the test control plane is not built and building it needs root: sudo tests/k8s/apiserver.sh build" >&2; } || \
	  { echo "make: building the test control plane from Debian's kubernetes source (once; a few minutes)"; \
	    t0=$$(date +%s); tests/k8s/apiserver.sh build && echo "make: the test control plane built in $$(( $$(date +%s) - t0 )) s"; }

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# The version compiled in (common/version.h): VERSION plus `git describe` (mk/version.sh),
# regenerated on every make but rewritten only when it changed, so a new commit rebuilds
# version.o alone.
VERSION_H := $(BUILD)/gen/cephalo_build_version.h
$(VERSION_H): FORCE
	@mkdir -p $(dir $@)
	@mk/version.sh --header >$@.tmp && { cmp -s $@.tmp $@ && rm -f $@.tmp || mv $@.tmp $@; }
$(BUILD)/common/version.o: $(VERSION_H)
FORCE:
.PHONY: FORCE version dist
version:
	@mk/version.sh
# the source tarball and the chart package, named by the version, in dist/ (mk/dist.sh)
dist:
	@mk/dist.sh dist

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

$(CLILIB): $(patsubst %.c,$(BUILD)/%.o,$(CLI_SRC))
	@mkdir -p $(dir $@)
	$(AR) rcs $@ $^

$(CLI): $(BUILD)/cli/main.o $(CLILIB) $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(WORKER): $(BUILD)/worker/cmd/main.o $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(CLILIB) $(OLIB) $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS) -lcurl -lcmocka

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

$(BUILD)/cuda/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CPPFLAGS) $(CUDA_INC) $(CFLAGS) -c $< -o $@

$(WORKER_CUDA): $(BUILD)/worker/cmd/main.o $(CUDA_OBJ) $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDLIBS) $(CUDA_LDLIBS)

$(BUILD)/tests/gpu/%: $(BUILD)/tests/gpu/%.o $(CUDA_OBJ) $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) -o $@ $^ $(LDLIBS) $(CUDA_LDLIBS) -lcmocka

# ---- cuda-check: the CUDA sources compile for every architecture, without a GPU --------------
# worker/devices/*.cu for each of CUDA_ARCHS_ALL with Debian's CUDA 11.8 (mk/cuda118.sh unpacks it into
# ~/.cache/cephalo-cuda118 once; nvcc 13 no longer compiles for sm_60-70), and for the oldest
# architecture of the default build with the nvcc in use, with the build's flags (-Werror included):
# compile only, objects in build/cuda-check, nothing linked or run. Every compile is tried, then a
# table says which passed (make -k); it fails if one did.
CHECK_BUILD := build/cuda-check
CUDA118_CACHE := $(or $(CEPHALO_CUDA118_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cephalo-cuda118)
NVCC118 := $(CUDA118_CACHE)/root/usr/lib/nvidia-cuda-toolkit/bin/nvcc
CHECK_ARCH_NVCC := $(if $(filter 1,$(HAVE_CUDA)),$(firstword $(shell printf '%s\n' $(CUDA_ARCHS) | sort -n)))
CHECK_OBJ118 := $(foreach a,$(CUDA_ARCHS_ALL),$(patsubst %.cu,$(CHECK_BUILD)/cuda11.8/sm_$(a)/%.o,$(CUDA_CU_SRC)))
CHECK_OBJNV := $(if $(CHECK_ARCH_NVCC),$(patsubst %.cu,$(CHECK_BUILD)/nvcc/sm_$(CHECK_ARCH_NVCC)/%.o,$(CUDA_CU_SRC)))

cuda118:
	@mk/cuda118.sh >/dev/null

images:
	@docker/build-images.sh build

# $(1): the directory under $(CHECK_BUILD), $(2): the architecture, $(3): the nvcc. ptxas -v's
# report (registers, spills per kernel) goes to NAME.o.ptxas beside the object, for
# mk/ptxas_report.sh (cuda-check recompiles an object without one); a failing compile shows its
# messages without the report's lines.
define CHECK_RULE
$(CHECK_BUILD)/$(1)/sm_$(2)/%.o: %.cu
	@mkdir -p $$(dir $$@)
	@rm -f $$@ $$@.ptxas
	$(3) $(NVCC_COMMON) -gencode arch=compute_$(2),code=sm_$(2) -DCEPHALO_CUDA_ARCHS='"$(2)"' -Xptxas -v -c $$< -o $$@ 2> $$@.ptxas || \
	  { grep -vE '^ptxas info|bytes stack frame' $$@.ptxas >&2; rm -f $$@; exit 1; }
endef
$(foreach a,$(CUDA_ARCHS_ALL),$(eval $(call CHECK_RULE,cuda11.8,$(a),$(NVCC118))))
$(if $(CHECK_ARCH_NVCC),$(eval $(call CHECK_RULE,nvcc,$(CHECK_ARCH_NVCC),$(NVCC))))
$(CHECK_OBJ118): | cuda118

cuda-check-objs: $(CHECK_OBJ118) $(CHECK_OBJNV)

# A passing run's report is kept in ~/.cache/cephalo-cuda-check under a hash of everything the
# compiles read (the .cu and header sources, this Makefile, the report script, both nvcc versions):
# a clean clone whose CUDA sources did not change (CI) prints that report again instead of spending
# ~15 minutes of two cores recompiling 9 architectures. CUDA_CHECK_CACHE=0 always compiles.
CUDA_CHECK_CACHE ?= 1
CUDA_CHECK_CACHE_DIR := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/cephalo-cuda-check
cuda-check: cuda118
	@key=$$( { find worker common planner -name '*.cu' -o -name '*.h' -o -name '*.cuh' | LC_ALL=C sort | xargs cat; \
	           cat Makefile mk/ptxas_report.sh; $(NVCC118) --version; $(if $(NVCC),$(NVCC) --version); } | sha256sum | cut -c1-32); \
	 hit=$(CUDA_CHECK_CACHE_DIR)/$$key.txt; \
	 if [ "$(CUDA_CHECK_CACHE)" = 1 ] && [ -f "$$hit" ]; then \
	   cat "$$hit"; echo "cuda-check: the report of a passing run of these same sources (cached: $$hit; CUDA_CHECK_CACHE=0 recompiles)"; exit 0; fi; \
	 mkdir -p $(CUDA_CHECK_CACHE_DIR) && \
	 $(MAKE) --no-print-directory cuda-check-run 2>&1 | tee "$$hit.tmp"; rc=$${PIPESTATUS[0]}; \
	 if [ $$rc = 0 ]; then mv "$$hit.tmp" "$$hit"; else rm -f "$$hit.tmp"; fi; exit $$rc

cuda-check-run: cuda118
	@for o in $(CHECK_OBJ118) $(CHECK_OBJNV); do [ -f $$o.ptxas ] || rm -f $$o; done; \
	 ok=1; $(MAKE) --no-print-directory -k cuda-check-objs || ok=0; \
	 echo "cuda-check: compile-only, -Werror, worker/devices/*.cu ($(notdir $(CUDA_CU_SRC))):"; \
	 row() { bad=; for f in $(CUDA_CU_SRC); do [ -f $(CHECK_BUILD)/$$1/$${f%.cu}.o ] || bad="$$bad $$f"; done; \
	         echo "  $$2 $${1#*/}: $${bad:+FAILED:}$${bad:-ok}"; }; \
	 for a in $(CUDA_ARCHS_ALL); do row cuda11.8/sm_$$a "CUDA 11.8 (Debian's, cached)"; done; \
	 if [ -n "$(CHECK_ARCH_NVCC)" ]; then \
	   row nvcc/sm_$(CHECK_ARCH_NVCC) "nvcc $$($(NVCC) --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') ($(NVCC))"; \
	 else echo "  no nvcc here (CUDA=$(CUDA)): the default build's compile was not checked"; fi; \
	 reports=$$(ls $(addsuffix .ptxas,$(CHECK_OBJ118) $(CHECK_OBJNV)) 2>/dev/null); \
	 if [ -n "$$reports" ]; then mk/ptxas_report.sh $$reports || ok=0; else ok=0; fi; \
	 [ $$ok = 1 ] || { echo "cuda-check: FAILED" >&2; exit 1; }

# GPU tests and benchmarks: they need a GPU (and PyTorch with CUDA for the peers); without one
# they say so and exit 0 after building everything.
test-gpu: deps $(CLI) $(WORKER) cuda
	@BUILD=$(BUILD) tests/gpu/run.sh $(GPU_TESTS)

bench-gpu: deps $(CLI) cuda
	@BUILD=$(BUILD) bench/bench_gpu.sh

# the operator at scale against the real test control plane (tests/k8s/apiserver.sh, kubelet.py);
# another binary, run as it is and never rebuilt: make bench-operator OPERATOR=/path/to/cephalo-operator
BENCH_OP_BIN := $(if $(filter command line,$(origin OPERATOR)),$(OPERATOR))
bench-operator: deps $(if $(BENCH_OP_BIN),,$(OPERATOR))
	@OPERATOR=$(or $(BENCH_OP_BIN),$(OPERATOR)) BUILD=$(BUILD) bench/bench_operator.sh

$(BENCH): $(BUILD)/bench/bench_plan.o $(BUILD)/bench/paper_dp.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(TOKCHECK): $(BUILD)/tests/tok/tokcheck.o $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(BENCH_TOK): $(BUILD)/bench/bench_tok.o $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(BENCH_SAMPLE): $(BUILD)/bench/bench_sample.o $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(BENCH_COMM): $(BUILD)/bench/bench_comm.o $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

$(BENCH_CRC): $(BUILD)/bench/bench_crc.o $(WLIB) $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDSAN) -o $@ $^ $(LDLIBS)

test: deps controlplane $(CLI) $(WORKER) $(OPERATOR) $(TESTS) $(TOKCHECK)
	@BUILD=$(BUILD) tests/run.sh $(TESTS)

demo: deps $(CLI) $(WORKER)
	@BUILD=$(BUILD) mk/demo.sh

# Cephalo on the project's own Kubernetes control plane with fake GPU nodes (docs/k8s.md, "make k8s-demo")
k8s-demo: deps controlplane $(CLI) $(WORKER) $(OPERATOR)
	@BUILD=$(BUILD) mk/k8s_demo.sh

bench: deps $(BENCH) $(CLI) $(WORKER) $(BENCH_TOK) $(BENCH_SAMPLE) $(BENCH_COMM) $(BENCH_CRC)
	@$(BENCH)
	@$(BENCH_SAMPLE)
	@$(BENCH_COMM)
	@$(BENCH_CRC)
	@BUILD=$(BUILD) bench/bench_tok.sh
	@BUILD=$(BUILD) bench/bench_report.sh
	@BUILD=$(BUILD) bench/bench_train.sh
	@BUILD=$(BUILD) bench/bench_fsdp.sh
	@BUILD=$(BUILD) bench/bench_accuracy.sh

# libFuzzer targets (clang), built apart from the normal objects.
FUZZ_BUILD := build/fuzz
FUZZ_FLAGS := -std=c17 -g -O1 $(CPPFLAGS) -Wall -Wextra -Werror
FUZZ_CFLAGS := -fsanitize=fuzzer,address,undefined $(FUZZ_FLAGS)
# The parsers fuzzed need neither BLAS nor OpenMP: only these worker modules are linked in (the
# file codecs, the plan reader and a sharded checkpoint's index.json).
FUZZ_WORKER_SRC := $(wildcard worker/formats/*.c) worker/state/plan_read.c worker/state/ckpt_index.c
# The operator's parsers alone, none of which needs libcurl: the watch stream (the loop is
# watch_loop.c), a CephaloJob's spec (spec.model.initFrom's checks are model_source_spec.c; the
# ConfigMap read is model_source.c) and the kubeconfig (the client is client/kube.c).
FUZZ_OPERATOR_SRC := operator/client/watch.c operator/job_spec.c operator/pod_template.c operator/quantity.c operator/model_source_spec.c operator/client/kube_config.c
# The code under test is compiled once for all targets (each target used to compile all ~50
# sources again: minutes of CI), instrumented for the fuzzer but without its main.
FUZZ_LIB_SRC := $(COMMON_SRC) $(PLANNER_SRC) $(CLI_SRC) $(FUZZ_WORKER_SRC) $(FUZZ_OPERATOR_SRC)
FUZZ_LIB_OBJ := $(patsubst %.c,$(FUZZ_BUILD)/obj/%.o,$(FUZZ_LIB_SRC))
$(FUZZ_BUILD)/obj/%.o: %.c | $(VERSION_H)
	@mkdir -p $(dir $@)
	clang -fsanitize=fuzzer-no-link,address,undefined $(FUZZ_FLAGS) -MMD -MP -c $< -o $@
$(FUZZ_BUILD)/%: fuzz/%.c $(FUZZ_LIB_OBJ) | $(VERSION_H)
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -o $@ $^ -lyaml -lcjson -lm

fuzz: deps $(patsubst fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRC))
	@FUZZ_SECONDS=$(FUZZ_SECONDS) mk/fuzz.sh $(patsubst fuzz/%.c,$(FUZZ_BUILD)/%,$(FUZZ_SRC))

clean:
	rm -rf build

-include $(shell find build -name '*.d' 2>/dev/null)
