#!/usr/bin/env bash
# The C trainer against the PyTorch oracle (tests/ref/oracle.py, docs/worker-model.md "The PyTorch
# oracle"): for every tiny model, `cephalo-worker train --data synthetic --dump` runs 5 AdamW steps and the oracle
# recomputes logits, gradients, losses, grad norms and final parameters in float64.
# Prints "ok - MODEL: check (...)" / "not ok - MODEL: check (...)" lines (tests/run.sh counts them).
# KEEP=1 keeps the dumps (the directory is printed).
set -u
BUILD=${BUILD:-build/rel}
WORKER=$BUILD/bin/cephalo-worker
PY=/usr/bin/python3
ORACLE=tests/ref/oracle.py
T=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "# dumps kept in $T"; else trap 'rm -rf "$T"' EXIT; fi

if ! err=$("$PY" -c 'import torch, numpy' 2>&1); then
  echo "not ok - python3-torch and python3-numpy importable by $PY (make deps installs them): $(tail -1 <<<"$err")"
  exit 0
fi

TMO=""
command -v timeout >/dev/null && TMO="timeout 600"

# case NAME MODEL [extra worker flags...]; $OARGS: the oracle's extra arguments
case_() {
  local name=$1 model=$2
  shift 2
  local dir=$T/$name log=$T/$name.jsonl out rc
  out=$($TMO "$WORKER" train --model "$model" --batch 4 --microbatch 2 --steps 5 --seed 7 --lr 1e-3 \
          --warmup 2 --data synthetic --dump "$dir" --log "$log" "$@" 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "not ok - $name: worker failed (exit $rc): $(tail -3 <<<"$out" | tr '\n' ' ')"
    return
  fi
  out=$("$PY" "$ORACLE" "$dir" "$log" ${OARGS:-} 2>&1)
  rc=$?
  # forward the oracle's lines, naming the case; "# " notes stay comments
  sed -e "s/^ok - /ok - $name: /" -e "s/^not ok - /not ok - $name: /" -e '/^\(ok\|not ok\|#\) /!s/^/# /' <<<"$out"
  if [ "$rc" -ne 0 ] && ! grep -q '^not ok ' <<<"$out"; then
    echo "not ok - $name: oracle exited $rc: $(tail -2 <<<"$out" | tr '\n' ' ')"
  fi
}

case_ tiny-gpt tiny-gpt
case_ tiny-gpt-seq32 tiny-gpt --seq 32
case_ tiny-llama tiny-llama
case_ tiny-bert tiny-bert
case_ tiny-vit tiny-vit
# the other schedules: the oracle computes the lr of each step from cephalo.train's "schedule"
case_ tiny-gpt-linear tiny-gpt --schedule linear --min-lr 2e-4
case_ tiny-llama-constant tiny-llama --schedule constant

# 16-bit activations ($CEPHALO_ACTS=16, docs/cuda.md): the CPU device rounds every GEMM and
# attention operand and their gradients to bf16 (fp16) where they are produced, as autocast's
# tensors; against the float64 oracle with its bf16 tolerances, every architecture, and fp16
# (finer than bf16: the same tolerances hold) for the two decoder families.
for model in tiny-gpt tiny-llama tiny-bert tiny-vit; do
  CEPHALO_ACTS=16 OARGS="--precision bf16" case_ "$model-bf16-acts16" "$model" --precision bf16
done
for model in tiny-gpt tiny-llama; do
  CEPHALO_ACTS=16 OARGS="--precision bf16" case_ "$model-fp16-acts16" "$model" --precision fp16
done
 a transformers-style forward on the exported weights equals the
# oracle's forward on the same run's final parameters.
export_case() {
  local model=$1 dir=$T/export-$1 out rc
  out=$($TMO "$WORKER" train --data synthetic --model "$model" --batch 2 --steps 2 --seed 3 --quiet --dump "$dir" \
          --ckpt-dir "$dir/ck" 2>&1 &&
        "$WORKER" export --checkpoint "$dir/ck/step_00000002.safetensors" -o "$dir/hf" 2>&1)
  rc=$?
  if [ "$rc" -ne 0 ]; then
    echo "not ok - export $model: worker failed (exit $rc): $(tail -3 <<<"$out" | tr '\n' ' ')"
    return
  fi
  "$PY" tests/ref/check_export.py "$dir/hf" "$dir" 2>&1 | sed -e '/^\(ok\|not ok\) /!s/^/# /'
}
export_case tiny-gpt
export_case tiny-llama
