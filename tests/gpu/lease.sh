#!/usr/bin/env bash
# lease.sh - one device lease's checks and measurements in one call, within a 540 s budget (not
# yet run on a GPU: the parts' times there are unmeasured; docs/gpu.md, "A lease"). Everything it prints also goes to files under $OUT (the
# device tool brings back at most 8): gpu.txt, ops.txt, train.txt, bench.txt, bench.json,
# nccl.txt, summary.txt. Each part has its own time limit, so a hang costs that part only, and
# all of them together stay inside LEASE_BUDGET seconds (540: the device tool's per-call limit is
# 600), most important first; a part that no longer fits is skipped and says so.
#   1. test_cuda_ops as is (its gemm cases in both CEPHALO_CUDA_GEMM modes), with
#      CEPHALO_CUDA_PORTABLE=1, and the Turing k8 variant when built;
#   2. bench/bench_gpu.sh: gpt2-124m bf16 (LEASE_MODELS, LEASE_PRECISIONS) against PyTorch eager
#      and torch.compile, the tensor-core attention, and the switches of docs/gpu.md in the same
#      call (LEASE_VARIANTS), each with its CEPHALO_CUDA_OPTIME table;
#   3. tests/gpu/test_gpu_train.sh parts a (the float64 oracle, 16-bit activations included) and
#      d (offload on = off, recompute none = full, also with 16-bit activations);
#   4. tests/gpu/test_gpu_nccl.sh: two and three nccl ranks on the one GPU (issue 28, item 8).
# LEASE_PARTS ("ops bench train nccl") runs fewer, e.g. the rest in a second call.
# Build here first, for the lent card only (the carry limit is 64 MiB):
#   make BUILD=build/lease CUDA_ARCHS=90          # the CLI too (plans, `cephalo models`)
#   make cuda BUILD=build/lease-k8 CUDA_ARCHS=90 NVCC_DEFS=-DCEPHALO_MMA_K8=1   # optional
# then run with carry [build/lease/bin, build/lease/tests/gpu, build/lease-k8/tests/gpu]:
#   BUILD=build/lease bash tests/gpu/lease.sh
set -u
cd "$(dirname "$0")/../.." || exit 1
export BUILD=${BUILD:-build/lease}
OUT=${OUT:-runs/lease}
mkdir -p "$OUT"
TMO() { local s=$1; shift; timeout --kill-after=10 "$s" "$@"; }
BUDGET=${LEASE_BUDGET:-540}
part() { # part NAME FILE SECONDS CMD...: one part, its output to the screen and FILE
  local name=$1 file=$OUT/$2 secs=$3 t0=$SECONDS rc
  shift 3
  local left=$((BUDGET - SECONDS))
  if [ "$left" -lt 30 ]; then
    echo "== $name: skipped, ${left}s of the budget left ==" | tee -a "$file" "$OUT/summary.txt"
    return
  fi
  [ "$secs" -gt "$left" ] && secs=$left
  echo "== $name (limit ${secs}s) ==" | tee -a "$file"
  TMO "$secs" "$@" 2>&1 | tee -a "$file"
  rc=${PIPESTATUS[0]}
  echo "== $name: exit $rc, $((SECONDS - t0)) s ==" | tee -a "$file" "$OUT/summary.txt"
}

nvidia-smi >"$OUT/gpu.txt" 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$OUT/summary.txt"

PARTS=" ${LEASE_PARTS:-ops bench train nccl} "
want() { [[ $PARTS == *" $1 "* ]]; }

if want ops; then
  ops=$BUILD/tests/gpu/test_cuda_ops
  part "test_cuda_ops" ops.txt 90 env CMOCKA_MESSAGE_OUTPUT=stdout "$ops"
  part "test_cuda_ops (portable)" ops.txt 90 env CMOCKA_MESSAGE_OUTPUT=stdout CEPHALO_CUDA_PORTABLE=1 "$ops"
  k8=${LEASE_K8:-build/lease-k8/tests/gpu/test_cuda_ops}
  [ -x "$k8" ] && part "test_cuda_ops (mma k8)" ops.txt 90 env CMOCKA_MESSAGE_OUTPUT=stdout "$k8"
  grep -E '^\[  (PASSED|FAILED) ' "$OUT/ops.txt" >>"$OUT/summary.txt"
fi

if want bench; then
  part "bench" bench.txt 270 env BENCH_GPU_MODELS="${LEASE_MODELS:-gpt2-124m}" \
    BENCH_GPU_PRECISIONS="${LEASE_PRECISIONS:-bf16}" BENCH_GPU_TORCH_MODES="eager compile" \
    BENCH_GPU_ATTN="simt mma" BENCH_GPU_OPTIME=1 BENCH_GPU_EXTRAS=0 \
    BENCH_GPU_VARIANTS="${LEASE_VARIANTS:-CEPHALO_ACTS=16 CEPHALO_ADAMW=half CEPHALO_VOCAB_PAD=1 CEPHALO_CUDA_GEMM=lt CEPHALO_ACTS=16,CEPHALO_ADAMW=half,CEPHALO_VOCAB_PAD=1}" \
    bash bench/bench_gpu.sh
  j=$(ls -t runs/bench-gpu/bench-*.json 2>/dev/null | head -1)
  [ -n "$j" ] && cp "$j" "$OUT/bench.json"
  sed -n '/^model /,/^$/p' "$OUT/bench.txt" >>"$OUT/summary.txt"
fi

if want train; then
  part "test_gpu_train a, d" train.txt 240 env GPU_TRAIN_PARTS=ad bash tests/gpu/test_gpu_train.sh
  echo "train: $(grep -c '^ok' "$OUT/train.txt") ok, $(grep -c '^not ok' "$OUT/train.txt") not ok" >>"$OUT/summary.txt"
  grep '^not ok' "$OUT/train.txt" >>"$OUT/summary.txt"
fi

if want nccl; then
  part "test_gpu_nccl" nccl.txt 120 bash tests/gpu/test_gpu_nccl.sh
  grep -E '^(not )?ok' "$OUT/nccl.txt" >>"$OUT/summary.txt"
fi
echo "== summary ==" && cat "$OUT/summary.txt"
