#!/usr/bin/env bash
# test_env.sh - every CEPHALO_* switch value checked, once (issue 38; common/env.c,
# docs/environment.md): the planner, the worker and the operator refuse a value outside a
# variable's documented ones when they start, exit 2, naming the variable and the accepted
# values - the issue's CEPHALO_VOCAB_PAD=no|false|abc|-1|2 (padding went on) and
# CEPHALO_ADAMW=bogus (the planner took it, the workers failed: `cephalo run` exit 1), and per
# kind the other members (switches, words, numbers, forms, lengths) - whatever the command, before
# any file is read or worker started; they accept the documented values; each binary's
# --help-env lists docs/environment.md's variables; no program source reads a CEPHALO_* variable
# outside the table.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
B=${BUILD:-build/rel}
C=$B/bin/cephalo
W=$B/bin/cephalo-worker
O=$B/bin/cephalo-operator
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE CEPHALO_PROFILE_STORE=none
PLAN=("$C" plan --cluster examples/clusters/local-cpu.yaml --model tiny-gpt --batch 8)
TRAIN=("$W" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --quiet)

# refused VAR VALUE EXPECTED: the planner and the worker exit 2 with "$VAR is 'VALUE', expected EXPECTED"
refused() {
  local var=$1 val=$2 want="\$$1 is '$2', expected $3"
  check "planner: $var='$val' refused, naming the accepted values" 2 "cephalo: $want" -- env "$var=$val" "${PLAN[@]}"
  check "worker: $var='$val' refused, naming the accepted values" 2 "cephalo-worker: $want" -- env "$var=$val" "${TRAIN[@]}"
}

# ---- the issue's cases ---------------------------------------------------------------------------
for v in no false abc -1 2; do refused CEPHALO_VOCAB_PAD "$v" "0 or 1"; done
refused CEPHALO_ADAMW bogus "tensor, unit or half"
check "cephalo run: CEPHALO_ADAMW=bogus refused before any worker starts (exit 2, not a failed worker's 1)" 2 \
  "cephalo: \$CEPHALO_ADAMW is 'bogus', expected tensor, unit or half" -- \
  env CEPHALO_ADAMW=bogus "$C" run examples/jobs/one-cpu.yaml --run-dir "$T/run" --steps 4 --quiet
assert "... and the run directory was never made" test ! -e "$T/run"

# ---- the other members of the class: every kind of variable ---------------------------------------
# switches are 0 or 1, nothing else
for v in yes true on off 01 " 1"; do refused CEPHALO_VOCAB_PAD "$v" "0 or 1"; done
refused CEPHALO_STAGE_HOST yes "0 or 1"
refused CEPHALO_PLAN_EXHAUSTIVE_DP true "0 or 1"
refused CEPHALO_CUDA_TF32 false "0 or 1"
refused CEPHALO_CUDA_PORTABLE no "0 or 1"
refused CEPHALO_CUDA_OPTIME 2 "0 or 1"
# words, as written
refused CEPHALO_ADAMW HALF "tensor, unit or half"
refused CEPHALO_ACTS 8 "16 or 32"
refused CEPHALO_COMM_BACKEND mpi "socket or nccl"
refused CEPHALO_NCCL_UNEVEN padded "auto, grouped or pad"
refused CEPHALO_CUDA_ATTN tensor "simt or mma"
refused CEPHALO_CUDA_GEMM cublas "blas or lt"
# numbers and forms
refused CEPHALO_METRICS_PORT 80x "a port, 0..65535 (0: off)"
refused CEPHALO_METRICS_PORT 65536 "a port, 0..65535 (0: off)"
refused CEPHALO_COMM_TIMEOUT 60s "seconds > 0, at most 1e6 (e.g. 60 or 0.5)"
refused CEPHALO_COMM_TIMEOUT 0 "seconds > 0, at most 1e6 (e.g. 60 or 0.5)"
refused CEPHALO_TEST_NONFINITE soon "STEP or STEP:RANK"
refused CEPHALO_OPERATOR_VERSION v1 "a version, MAJOR.MINOR.PATCH[+BUILD]"
# lengths and control characters
long=$(printf 'j%.0s' $(seq 64))
check "worker: a 64-character \$CEPHALO_JOB_ID refused, naming the limit" 2 \
  "\$CEPHALO_JOB_ID is 64 characters long" -- env CEPHALO_JOB_ID="$long" "${TRAIN[@]}"
check "worker: a newline in \$CEPHALO_JOB refused" 2 "\$CEPHALO_JOB is 'a?b', expected text, at most 253 characters" -- \
  env CEPHALO_JOB="a
b" "${TRAIN[@]}"

check "a near miss of a name is named, and the program goes on" 0 \
  "\$CEPHALO_VOCABPAD is set, but no cephalo program reads it: did you mean \$CEPHALO_VOCAB_PAD?" -- \
  env CEPHALO_VOCABPAD=1 "${PLAN[@]}"

# ---- whatever the command, and the operator too ----------------------------------------------------
check "cephalo models: refused too (every command)" 2 "\$CEPHALO_VOCAB_PAD is 'no'" -- env CEPHALO_VOCAB_PAD=no "$C" models
check "cephalo-worker export: refused too, before its arguments" 2 "\$CEPHALO_ACTS is '8'" -- \
  env CEPHALO_ACTS=8 "$W" export --checkpoint "$T/none" -o "$T/out"
check "cephalo-operator: refused at start, before its configuration is read" 2 "\$CEPHALO_VOCAB_PAD is 'false', expected 0 or 1" -- \
  env CEPHALO_VOCAB_PAD=false "$O" --kubeconfig "$T/no-kubeconfig"
check "cephalo-operator: a documented value goes on to the configuration" 2 "no-kubeconfig" -- \
  env CEPHALO_VOCAB_PAD=1 "$O" --kubeconfig "$T/no-kubeconfig"
check "--help and --version still answer with a bad value" 0 "usage: cephalo" -- \
  bash -c "CEPHALO_VOCAB_PAD=no '$C' --help && CEPHALO_VOCAB_PAD=no '$W' --version && CEPHALO_VOCAB_PAD=no '$O' --version"

# ---- the documented values are accepted ------------------------------------------------------------
for v in 0 1 ""; do
  check "planner: CEPHALO_VOCAB_PAD='$v' accepted" 0 "" -- env "CEPHALO_VOCAB_PAD=$v" "${PLAN[@]}"
  check "worker: CEPHALO_VOCAB_PAD='$v' accepted" 0 "" -- env "CEPHALO_VOCAB_PAD=$v" "${TRAIN[@]}"
done
for v in tensor unit half; do
  check "planner and worker: CEPHALO_ADAMW=$v accepted" 0 "" -- \
    bash -c "CEPHALO_ADAMW=$v ${PLAN[*]} >/dev/null && CEPHALO_ADAMW=$v ${TRAIN[*]}"
done
check "worker: the other documented values accepted together" 0 "" -- \
  env CEPHALO_ACTS=16 CEPHALO_STAGE_HOST=0 CEPHALO_CUDA_TF32=0 CEPHALO_CUDA_ATTN=mma CEPHALO_CUDA_GEMM=lt CEPHALO_CUDA_PORTABLE=1 \
  CEPHALO_CUDA_OPTIME=0 CEPHALO_COMM_BACKEND=socket CEPHALO_NCCL_UNEVEN=pad CEPHALO_COMM_TIMEOUT=0.5 \
  CEPHALO_METRICS_PORT=0 CEPHALO_JOB=job-1 CEPHALO_JOB_ID=job-1 CEPHALO_PLAN_EXHAUSTIVE_DP=1 \
  CEPHALO_PROFILE_CACHE=none CEPHALO_OPERATOR_VERSION= "${TRAIN[@]}"
# the padding is on with 1 and off with 0 and empty: the plan records the logits' row stride
# (GPT-2's V = 50257, padded to 50304)
for v in 0 1 ""; do
  env "CEPHALO_VOCAB_PAD=$v" "$C" plan --cluster examples/clusters/cluster-a.yaml --model gpt2-124m --batch 32 \
    --format json 2>/dev/null >"$T/pad$v.json"
done
check "the plan's logits_row_stride: 0 and empty keep V, 1 pads it" 0 "" -- /usr/bin/python3 -c "
import json
s = [json.load(open('$T/pad%s.json' % v))['inputs']['engine']['logits_row_stride'] for v in ('0', '1', '')]
assert s == [50257, 50304, 50257], s"

# ---- --help-env and the docs' table ------------------------------------------------------------------
grep -o '^| `CEPHALO_[A-Z0-9_]*`' docs/environment.md | tr -d '|` ' >"$T/doc.txt"
for bin in "$C" "$W" "$O"; do
  check "$(basename "$bin") --help-env lists docs/environment.md's variables, in order" 0 "" -- \
    bash -c "'$bin' --help-env | grep -o '^CEPHALO_[A-Z0-9_]*' | diff - '$T/doc.txt'"
done
check "--help-env takes no arguments" 2 "--help-env takes no arguments" -- "$C" --help-env x
# every CEPHALO_* the programs read goes through the table: no getenv of one elsewhere
check "no getenv(\"CEPHALO_...\") (or of a macro naming one) outside common/env.c" 1 "" -- \
  grep -rnE 'getenv\("CEPHALO_|getenv\([A-Z_]+\)' cli common planner worker operator --include='*.c' --include='*.h' --include='*.cu'

echo "1..$n"
