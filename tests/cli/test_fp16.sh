#!/bin/bash
# test_fp16.sh - fp16 mixed precision on CPU devices, which emulate it exactly (fp16 matmul
# operands and parameter gathers, fp32 accumulation, master weights, moments and reductions):
# the multi-rank invariant for GPT and Llama, dynamic loss scaling (a non-finite gradient on one
# rank skips the step on every rank and halves the scale; clean steps double it), resuming with
# the scale, and a 200-step run against fp32.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
B=${BUILD:-build/rel}
C=$B/bin/cephalo
W=$B/bin/cephalo-worker
T=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
PY=/usr/bin/python3 # Debian's, with numpy (mk/deps.sh)
PT="$PY tests/fsdp/plan_tool.py"
export OMP_NUM_THREADS=1

. tests/cli/ranks.sh
args=(--data synthetic --steps 3 --lr 2e-3 --seed 5)
one() { # one NAME MODEL [worker args...]: one rank, batch 12 in microbatches of 4
  local name=$1 model=$2
  shift 2
  "$W" train --quiet --model "$model" --batch 12 --microbatch 4 "${args[@]}" \
    --ckpt-dir "$T/$name" --log "$T/$name.jsonl" "$@" 2>"$T/$name.err"
}
ck() { echo "$T/$1/step_0000000${2:-3}.safetensors"; }
field() { # field FILE KEY: the KEY of every step, as a Python list
  $PY -c "import json,sys; print([json.loads(l)[sys.argv[2]] for l in open(sys.argv[1])])" "$1" "$2"
}

# ---- fp16 against fp32 and bf16, and determinism ----
for model in tiny-gpt tiny-llama; do
  one "$model-32" $model
  one "$model-16" $model --precision fp16
  one "$model-16b" $model --precision fp16
  check "$model fp16: trains, loss within 2% of fp32 at every step" 0 "" -- \
    losses_within 0.02 3 "$T/$model-32.jsonl" "$T/$model-16.jsonl"
  check "$model fp16: really rounds (parameters differ from fp32 by more than fp32 noise)" 1 "" -- \
    $PT compare "$(ck $model-16)" "$(ck $model-32)" --tol 1e-4
  check "$model fp16: deterministic (two runs bit-identical)" 0 "" -- \
    $PT compare "$(ck $model-16b)" "$(ck $model-16)" --tol 0
done
one gpt-bf16 tiny-gpt --precision bf16
check "fp16 is not bf16 (the two checkpoints differ)" 1 "max relative parameter difference" -- \
  $PT compare "$(ck tiny-gpt-16)" "$(ck gpt-bf16)" --tol 0

# ---- the invariant: 3 uneven ranks = 1 rank, GPT and Llama ----
# As with bf16 (test_modes.sh), a master weight that differs in its last fp32 bit may round to the
# neighbouring fp16 value, so the losses must agree closely and the parameters in norm.
for model in tiny-gpt tiny-llama; do
  san_skip $model tiny-gpt && continue # fp16's own paths are the architectures' same (SAN_LIGHT)
  $C plan --cluster "$(cluster_of 3)" --model $model --batch 12 -o "$T/base-$model.json" >/dev/null
  $PT rewrite "$T/base-$model.json" "$T/p3-$model.json" --ranks 5:1,3:3,4:2 --shards random --seed 3 --precision fp16
  run_ranks "$T/p3-$model.json" "$T/r3-$model" "${args[@]}" --ckpt-dir "$T/r3-$model/ckpt"
  check "$model fp16 on 3 uneven ranks = 1 rank in fp16: losses within 1e-5" 0 "" -- \
    losses_within 1e-5 3 "$T/$model-16.jsonl" "$T/r3-$model"/rank{0,1,2}.jsonl
  check "$model fp16 on 3 uneven ranks = 1 rank in fp16: parameters within 1e-3 in norm per unit" 0 "" -- \
    $PT compare "$T/r3-$model/ckpt/step_00000003" "$(ck $model-16)" --tol 1e-3 --rms
done
check "fp16: bytes sent per step = (world-1) x (2 x gathered + 4 x reduced) + the loss all-reduce" 0 "" -- $PY -c "
import json
plan = json.load(open('$T/p3-tiny-gpt.json'))
numel = [u['numel'] for u in plan['units']]
world, emb = 3, numel[0]
gathered = sum(numel) + emb + sum(numel[:-1])
reduced = sum(numel) + emb
want = (world - 1) * (2 * gathered + 4 * reduced) + 2 * (world - 1) * 8 * 5  # 5 doubles: RS + AG
got = sum(json.loads(open(f'$T/r3-tiny-gpt/rank{r}.jsonl').readline())['bytes_sent'] for r in range(world))
assert got == want, (got, want)
"

# ---- the fused optimizer ($CEPHALO_ADAMW): the same bits in every mode ----
# half: the update writes each shard's 16-bit copy, which the gathers send (or, one rank, widen)
# instead of rounding the fp32 shard at every gather; unit: one multi-tensor update per unit.
CEPHALO_ADAMW=half one gpt-bf16-half tiny-gpt --precision bf16 --data synthetic
check "bf16, one rank: adamw half = tensor, bit for bit" 0 "" -- \
  $PT compare "$(ck gpt-bf16-half)" "$(ck gpt-bf16)" --tol 0
for mode in half unit; do
  CEPHALO_ADAMW=$mode run_ranks "$T/p3-tiny-gpt.json" "$T/r3-$mode" "${args[@]}" --data synthetic --ckpt-dir "$T/r3-$mode/ckpt"
  check "fp16 on 3 uneven ranks: adamw $mode = tensor, bit for bit" 0 "" -- \
    $PT compare "$T/r3-$mode/ckpt/step_00000003" "$T/r3-tiny-gpt/ckpt/step_00000003" --tol 0
done
CEPHALO_STAGE_HOST=1 CEPHALO_ADAMW=half run_ranks "$T/p3-tiny-gpt.json" "$T/r3-staged" "${args[@]}" --data synthetic \
  --ckpt-dir "$T/r3-staged/ckpt"
check "fp16 on 3 uneven ranks, staged collectives: adamw half = tensor, bit for bit" 0 "" -- \
  $PT compare "$T/r3-staged/ckpt/step_00000003" "$T/r3-tiny-gpt/ckpt/step_00000003" --tol 0
CEPHALO_ADAMW=fused check "a bad \$CEPHALO_ADAMW is refused, naming the choices" 2 \
  "CEPHALO_ADAMW is 'fused', expected tensor, unit or half" -- \
  "$W" train --model tiny-gpt --data synthetic --steps 1 --batch 2

# ---- dynamic loss scaling ----
# An overflow injected into rank 1's gradient at step 1: every rank skips step 1, so the state
# after it (checkpoint step 2) is the state after step 0 (checkpoint step 1), bit for bit.
P=$T/p3-tiny-gpt.json
CEPHALO_TEST_NONFINITE=1:1 run_ranks "$P" "$T/inf" --steps 4 --lr 2e-3 --seed 5 --ckpt-every 1 \
  --keep-last 0 --ckpt-dir "$T/inf/ckpt"
check "overflow on rank 1 at step 1: every rank skips the step and halves the scale" 0 "" -- $PY -c "
import json
for r in range(3):
    s = [json.loads(l) for l in open(f'$T/inf/rank{r}.jsonl')]
    assert [x['skipped'] for x in s] == [False, True, False, False], (r, s)
    assert [x['loss_scale'] for x in s] == [65536, 65536, 32768, 32768], (r, s)
    assert s[1]['grad_norm'] is None, s[1]  # inf in the log is JSON null
"
check "... the parameters and AdamW moments after the skipped step are bit-identical to before it" 0 "" -- \
  $PT compare "$T/inf/ckpt/step_00000002" "$T/inf/ckpt/step_00000001" --tol 0
check "... and training goes on (the next step changes them)" 1 "" -- \
  $PT compare "$T/inf/ckpt/step_00000003" "$T/inf/ckpt/step_00000002" --tol 0
check "... the progress line says so" 0 "scale 65536 (gradient not finite: step skipped)" -- \
  env CEPHALO_TEST_NONFINITE=0 "$W" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --precision fp16
# The update after a skip is AdamW's first (bias correction counts updates, as PyTorch's
# optimizer.step() skipped by GradScaler does): with the first step skipped, the second moves
# each parameter by lr * m / (1 - b1) / (sqrt(v / (1 - b2)) + eps), not by the t = 2 step (0.73x).
CEPHALO_TEST_NONFINITE=0 one skip0 tiny-gpt --precision fp16 --steps 2 --min-lr 2e-3 --weight-decay 0 \
  --ckpt-every 1 --keep-last 0
check "after a skipped first step, the next update is AdamW's first (bias correction t = 1)" 0 "" -- $PY -c "
import sys
sys.path.insert(0, 'tests/fsdp'); sys.path.insert(0, 'tests/ref')
import numpy as np
from plan_tool import flatten
a, b = flatten('$T/skip0/step_00000001.safetensors'), flatten('$T/skip0/step_00000002.safetensors')
lr, b1, b2, eps = 2e-3, 0.9, 0.95, 1e-8
for name in a:
    if not name.startswith('param.'):
        assert not a[name].any(), name + ': moments after the skipped step are not zero'
        continue
    m, v = b['adam_m.' + name[6:]].astype(np.float64), b['adam_v.' + name[6:]].astype(np.float64)
    step = a[name].astype(np.float64) - b[name]
    for t, want in ((1, True), (2, False)):
        pred = lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        ok = np.abs(step - pred).max() <= 1e-6
        assert ok == want, (name, t, np.abs(step - pred).max())
"
one window tiny-gpt --precision fp16 --steps 5 --loss-scale-window 2 --loss-scale 1024
check "the scale doubles after --loss-scale-window clean steps (from --loss-scale)" 0 "[1024, 1024, 2048, 2048, 4096]" -- \
  field "$T/window.jsonl" loss_scale
check "fp32 runs have no loss scaling (scale 1, nothing skipped)" 0 "[1, 1, 1]" -- field "$T/tiny-gpt-32.jsonl" loss_scale

# Resuming keeps the scale, its clean-step count and AdamW's update count: a run interrupted at
# step 2 (after a skip at step 1, scale halved) continues bit for bit like the uninterrupted one.
CEPHALO_TEST_NONFINITE=1 one whole tiny-gpt --precision fp16 --steps 5 --loss-scale-window 2
CEPHALO_TEST_NONFINITE=1 one part tiny-gpt --precision fp16 --steps 5 --loss-scale-window 2 --ckpt-every 2 --keep-last 0
rm "$T/part/step_00000004.safetensors" "$T/part/step_00000005.safetensors"
echo step_00000002.safetensors >"$T/part/latest"
one part tiny-gpt --precision fp16 --steps 5 --loss-scale-window 2 --resume auto --overwrite
check "fp16 resume after a skip: bit-identical to the uninterrupted run" 0 "" -- \
  $PT compare "$(ck part 5)" "$(ck whole 5)" --tol 0
check "... with the same scales after the resume" 0 "" -- bash -c \
  "[ \"\$(tail -n 3 '$T/part.jsonl' | $PY -c 'import json,sys; print([json.loads(l)[\"loss_scale\"] for l in sys.stdin])')\" = \"\$(tail -n 3 '$T/whole.jsonl' | $PY -c 'import json,sys; print([json.loads(l)[\"loss_scale\"] for l in sys.stdin])')\" ]"
check "the checkpoint records the optimizer's progress (metadata cephalo.optimizer)" 0 "" -- $PY -c "
import json, struct
f = open('$(ck whole 5)', 'rb')
n = struct.unpack('<Q', f.read(8))[0]
meta = json.loads(f.read(n))['__metadata__']
o = json.loads(meta['cephalo.optimizer'])
assert o == {'adam_steps': 4, 'skipped_steps': 1, 'loss_scale': 65536, 'clean_steps': 1}, o
assert json.loads(meta['cephalo.train'])['precision'] == 'fp16'
"

# ---- 200 steps of demo-gpt: fp16 ends within 2% of fp32 ----
# A numerical property of the arithmetic, which the sanitizers do not change: the sanitizer run
# (where these two runs took 150 of the script's 160 s) trains 20 steps of each, for the memory
# checks of the same code, and compares the losses only where they have had time to fall.
demo_steps=200
case "${BUILD:-build/rel}" in *san*) demo_steps=20 ;; esac
demo() {
  "$W" train --data synthetic --quiet --model examples/models/demo-gpt.yaml --batch 4 --steps $demo_steps --lr 1e-3 \
    --warmup 10 --threads 2 --log "$T/demo-$1.jsonl" "${@:2}"
}
demo fp32 && demo fp16 --precision fp16
check "demo-gpt, $demo_steps steps: fp16's final loss within 2% of fp32's (at 200), no step skipped" 0 "" -- $PY -c "
import json, math
a = [json.loads(l) for l in open('$T/demo-fp32.jsonl')]
b = [json.loads(l) for l in open('$T/demo-fp16.jsonl')]
assert len(a) == len(b) == $demo_steps
assert all(math.isfinite(x['loss']) for x in a + b)
assert not any(x['skipped'] for x in b)
if $demo_steps == 200:
    la, lb = sum(x['loss'] for x in a[-10:]) / 10, sum(x['loss'] for x in b[-10:]) / 10
    print(f'last-10 mean loss: fp32 {la:.4f}, fp16 {lb:.4f}, first {a[0][\"loss\"]:.4f}')
    assert abs(la - lb) <= 0.02 * la, (la, lb)
    assert la < 0.7 * a[0]['loss'], 'the demo did not learn'
"

# ---- bad input ----
check "--loss-scale that is not a power of two is refused" 2 "--loss-scale: '1000' is not a power of two" -- \
  "$W" train --data synthetic --model tiny-gpt --batch 2 --precision fp16 --loss-scale 1000
check "--loss-scale-window 0 is refused" 2 "--loss-scale-window: '0' is not an integer in [1," -- \
  "$W" train --data synthetic --model tiny-gpt --batch 2 --precision fp16 --loss-scale-window 0
check "a bad \$CEPHALO_TEST_NONFINITE is refused" 2 "expected STEP or STEP:RANK" -- \
  env CEPHALO_TEST_NONFINITE=soon "$W" train --data synthetic --model tiny-gpt --batch 2 --precision fp16
check "fp32 and bf16 do not skip: a non-finite gradient there is the divergence it is" 1 "the loss" -- \
  env CEPHALO_TEST_NONFINITE=0 "$W" train --data synthetic --model tiny-gpt --batch 2 --steps 3 --precision bf16

