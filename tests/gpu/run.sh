#!/usr/bin/env bash
# make test-gpu: runs the GPU test binaries given on the command line (cmocka, tests/gpu/test_*.c)
# and then the GPU CLI checks (tests/gpu/test_*.sh), and prints one summary line
# "N passed, N failed, N skipped". It first checks that the CUDA worker and every test binary
# were built; on a machine without an NVIDIA GPU it then says so and exits 0 having run nothing.
# docs/gpu.md describes the checks. The environment reaches every check: CEPHALO_CUDA_ATTN=mma
# make test-gpu runs the CLI checks with the tensor-core attention too (docs/cuda.md).
set -u
cd "$(dirname "$0")/../.." || exit 1
B=${BUILD:-build/rel}
WC=$B/bin/cephalo-worker-cuda

missing=()
for f in "$WC" "$@"; do [ -x "$f" ] || missing+=("$f"); done
if [ ${#missing[@]} -gt 0 ]; then
  echo "not built: ${missing[*]} (make cuda needs nvcc; see docs/gpu.md)"
  exit 1
fi

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'; then
  echo "no GPU on this machine: built the CUDA worker and GPU tests, ran nothing"
  exit 0
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader | sed 's/^/# GPU /'

passed=0
failed=0
skipped=0
failures=()
# run_bin BINARY LABEL [VAR=VALUE...]: one cmocka binary, its counts added to the totals
run_bin() {
  local t=$1 label=$2
  shift 2
  out=$(env "$@" CMOCKA_MESSAGE_OUTPUT=stdout "$t" 2>&1)
  rc=$?
  p=$(grep -Eo '^\[  PASSED  \] [0-9]+ test' <<<"$out" | grep -Eo '[0-9]+' | head -1)
  f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' <<<"$out" | grep -Eo '[0-9]+' | head -1)
  s=$(grep -Eo '^\[  SKIPPED \] [0-9]+ test' <<<"$out" | grep -Eo '[0-9]+' | head -1)
  p=${p:-0}
  f=${f:-0}
  s=${s:-0}
  # a binary that found no GPU although nvidia-smi lists one counts as one skip, said loudly
  if grep -q '0 tests: no GPU' <<<"$out"; then
    s=$((s + 1))
    echo "# $label: the binary sees no GPU although nvidia-smi lists one (driver? CUDA_VISIBLE_DEVICES?)"
  fi
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi # crashed before cmocka's summary
  passed=$((passed + p))
  failed=$((failed + f))
  skipped=$((skipped + s))
  if [ "$f" -ne 0 ]; then
    failures+=("$label")
    grep -E '^\[  (FAILED|ERROR) +\]|^\[ +LINE +\]|error|Error|internal' <<<"$out" | head -60
  fi
  printf '%-28s %4d passed %4d failed %4d skipped\n' "$label" "$p" "$f" "$s"
}

for t in "$@"; do
  run_bin "$t" "$(basename "$t")"
  # the ops again on the path of sm_60..sm_75 (48 KB attention tiles, no cp.async): a new GPU
  # tests the old GPUs' code (docs/cuda.md)
  if [ "$(basename "$t")" = test_cuda_ops ]; then
    run_bin "$t" "test_cuda_ops (portable)" CEPHALO_CUDA_PORTABLE=1
    # every op through the CEPHALO_CUDA_OPTIME wrappers (same results; the table goes to the
    # output, shown with TEST_GPU_SHOW_OPTIME=1); test_cuda_ops runs the tensor-core attention
    # (CEPHALO_CUDA_ATTN=mma) against the CPU in each run by itself
    run_bin "$t" "test_cuda_ops (optime)" CEPHALO_CUDA_OPTIME=1
    [ "${TEST_GPU_SHOW_OPTIME:-0}" = 1 ] && sed -n '/^CEPHALO_CUDA_OPTIME/,$p' <<<"$out" | grep -E '^(CEPHALO|  )' | head -30
  fi
done

# Turing's tensor-core attention (two m16n8k8 per product) on this card, when its variant is
# built: make cuda BUILD=build/k8 NVCC_DEFS=-DCEPHALO_MMA_K8=1 (docs/cuda.md, "Turing")
k8=${TEST_GPU_K8:-build/k8/tests/gpu/test_cuda_ops}
if [ -x "$k8" ]; then run_bin "$k8" "test_cuda_ops (mma k8)"; else echo "# test_cuda_ops (mma k8): $k8 not built, not run"; fi

# CLI checks: "ok N - ...", "not ok N - ...", and "ok N - ... # SKIP why" lines
for sh in tests/gpu/test_*.sh; do
  [ -e "$sh" ] || continue
  out=$(BUILD=$B bash "$sh" 2>&1)
  s=$(grep -c '^ok .*# SKIP' <<<"$out")
  p=$(($(grep -c '^ok ' <<<"$out") - s))
  f=$(grep -c '^not ok ' <<<"$out")
  passed=$((passed + p))
  failed=$((failed + f))
  skipped=$((skipped + s))
  if [ "$f" -ne 0 ]; then
    failures+=("$(basename "$sh")")
    grep -A8 '^not ok ' <<<"$out" | head -80
  fi
  grep '^ok .*# SKIP' <<<"$out" | sed 's/^/#   /'
  grep '^# [^ ]' <<<"$out" # figures a script reports (test_gpu_nccl.sh: NCCL's memory)
  printf '%-28s %4d passed %4d failed %4d skipped\n' "$(basename "$sh")" "$p" "$f" "$s"
done
[ ${#failures[@]} -gt 0 ] && echo "failing: ${failures[*]}"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
