#!/bin/bash
# test_modes.sh - the trainer's modes on CPU devices: the offload schedule with checkpoints kept
# in device memory, host-staged collectives (the cuda device's path when ranks share a GPU),
# per-microbatch against layered accumulation, and bf16 mixed precision (which the CPU device
# emulates exactly: bf16 matmul operands, fp32 accumulation, parameters gathered in bf16), and
# stopping on SIGTERM (every rank after the same step, checkpointed, resumable).
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
# fp32 sums in another order: params_agree (tests/cli/lib.sh; docs/fsdp.md, "The invariant")

. tests/cli/ranks.sh
args=(--data synthetic --steps 3 --lr 2e-3 --seed 5)
one() { # one NAME [worker args...]: one rank, tiny-gpt, batch 12 in microbatches of 4
  local name=$1
  shift
  "$W" train --quiet --model tiny-gpt --batch 12 --microbatch 4 "${args[@]}" \
    --ckpt-dir "$T/$name" --log "$T/$name.jsonl" "$@" 2>"$T/$name.err"
}
ck() { echo "$T/$1/step_00000003.safetensors"; }

# ---- offload off: the checkpoints stay in device memory; nothing else changes ----
one ref
one nooff --offload off
check "offload off: bit-identical parameters to offload on" 0 "" -- $PT compare "$(ck nooff)" "$(ck ref)" --tol 0
check "offload off: the checkpoint pool is device memory (peak grows by it)" 0 "" -- $PY -c "
import json
on = json.loads(open('$T/ref.jsonl').readline())['peak_bytes']
off = json.loads(open('$T/nooff.jsonl').readline())['peak_bytes']
act = 4 * 64 * 64 * 4                      # microbatch 4 x 64 tokens x d 64, fp32
assert off - on == (3 * 3 + 3) * act, (on, off)   # (units-1) checkpoints + 1 gradient, x 3 microbatches
"

# ---- host-staged collectives: the same bits as collectives on the slots themselves ----
$C plan --cluster "$(cluster_of 3)" --model tiny-gpt --batch 12 -o "$T/base.json" >/dev/null
$PT rewrite "$T/base.json" "$T/p3.json" --ranks 5:1,3:3,4:2 --shards random --seed 3
run_ranks "$T/p3.json" "$T/direct" "${args[@]}" --ckpt-dir "$T/direct/ckpt"
CEPHALO_STAGE_HOST=1 run_ranks "$T/p3.json" "$T/staged" "${args[@]}" --ckpt-dir "$T/staged/ckpt"
check "staged collectives on 3 ranks: bit-identical to direct" 0 "" -- \
  $PT compare "$T/staged/ckpt/step_00000003" "$T/direct/ckpt/step_00000003" --tol 0
$C plan --cluster "$(cluster_of 3)" --model tiny-gpt --batch 12 --strategy whale -o "$T/pw.json" >/dev/null
CEPHALO_STAGE_HOST=1 run_ranks "$T/pw.json" "$T/wstaged" "${args[@]}" --ckpt-dir "$T/wstaged/ckpt"
check "staged all-reduces (replicated plan): = 1 rank" 0 "" -- \
  params_agree "$T/wstaged/ckpt/step_00000003.safetensors" "$(ck ref)" 2e-3 3

# ---- per-microbatch accumulation: same update, more collectives ----
run_ranks "$T/p3.json" "$T/permicro" "${args[@]}" --accumulate per-micro --ckpt-dir "$T/permicro/ckpt"
check "per-microbatch accumulation on 3 ranks (5, 1, 2 microbatches) = 1 rank" 0 "" -- \
  params_agree "$T/permicro/ckpt/step_00000003" "$(ck ref)" 2e-3 3
check "per-microbatch: 5 passes (the most microbatches) x (8 gathers, 5 reduce-scatters) per step on every rank" 0 "" -- $PY -c "
import json
for r in range(3):
    for l in open(f'$T/permicro/rank{r}.jsonl'):
        o = json.loads(l)
        assert (o['gathers'], o['reduce_scatters']) == (40, 25), (r, o)
"
check "layered: 8 gathers and 5 reduce-scatters per step" 0 "" -- $PY -c "
import json
o = json.loads(open('$T/direct/rank1.jsonl').readline())
assert (o['gathers'], o['reduce_scatters']) == (8, 5), o
"
refused_permicro() { ! run_ranks "$T/pw.json" "$T/pwbad" --steps 1 --accumulate per-micro >/dev/null && cat "$T/pwbad/rank0.err"; }
check "per-microbatch accumulation with a replicated plan is refused" 0 "per-microbatch accumulation needs a sharded plan" -- \
  refused_permicro

# ---- bf16 mixed precision (CPU emulation) ----
one bf16 --precision bf16
check "bf16: trains, loss within 2% of fp32 at every step" 0 "" -- losses_within 0.02 3 "$T/ref.jsonl" "$T/bf16.jsonl"
check "bf16: really rounds (parameters differ from fp32 by more than fp32 noise)" 1 "" -- \
  $PT compare "$(ck bf16)" "$(ck ref)" --tol 1e-4
one bf16b --precision bf16
check "bf16: deterministic (two runs bit-identical)" 0 "" -- $PT compare "$(ck bf16b)" "$(ck bf16)" --tol 0
$PT rewrite "$T/base.json" "$T/p3b.json" --ranks 5:1,3:3,4:2 --shards random --seed 3 --precision bf16
run_ranks "$T/p3b.json" "$T/bf3" "${args[@]}" --ckpt-dir "$T/bf3/ckpt"
# bf16 is chaotic where fp32 is not: a master weight that differs in its last fp32 bit can round
# to the neighbouring bf16 value, and AdamW turns the changed near-zero gradients it causes into
# full-size steps for a few elements. So the losses must agree closely and the parameters in
# norm (1-rank bf16 against fp32 differs by 6e-3 here; microbatching alone moves it by 4e-4).
check "bf16 on 3 uneven ranks = 1 rank in bf16: losses within 1e-5" 0 "" -- \
  losses_within 1e-5 3 "$T/bf16.jsonl" "$T/bf3/rank0.jsonl"
check "bf16 on 3 uneven ranks = 1 rank in bf16: parameters within 3e-3 in norm per unit" 0 "" -- \
  $PT compare "$T/bf3/ckpt/step_00000003" "$(ck bf16)" --tol 3e-3 --rms
check "bf16: bytes sent per step = (world-1) x (2 x gathered + 4 x reduced) + the loss all-reduce" 0 "" -- $PY -c "
import json
plan = json.load(open('$T/p3b.json'))
numel = [u['numel'] for u in plan['units']]
world, emb = 3, numel[0]
gathered = sum(numel) + emb + sum(numel[:-1])
reduced = sum(numel) + emb
want = (world - 1) * (2 * gathered + 4 * reduced) + 2 * (world - 1) * 8 * 5  # 5 doubles: RS + AG
got = sum(json.loads(open(f'$T/bf3/rank{r}.jsonl').readline())['bytes_sent'] for r in range(world))
assert got == want, (got, want)
"
$C plan --cluster examples/clusters/local-cpu.yaml --model tiny-gpt --batch 8 --precision bf16 -o "$T/pmb.json" >/dev/null
run_ranks "$T/pmb.json" "$T/memb" --steps 2
check "bf16: each rank's peak device memory equals the plan's predicted peak_bytes" 0 "" -- $PY -c "
import json
plan = json.load(open('$T/pmb.json'))
assert plan['inputs']['precision'] == 'bf16'
for r, rk in enumerate(plan['ranks']):
    peak = json.loads(open(f'$T/memb/rank{r}.jsonl').readlines()[-1])['peak_bytes']
    assert peak == rk['predicted']['peak_bytes'], (r, peak, rk['predicted']['peak_bytes'])
"
# CEPHALO_ADAMW=half keeps a 16-bit copy of each shard (2 bytes per shard parameter): the planner
# reads the same variable and counts it, so the plan and the workers still agree to the byte
CEPHALO_ADAMW=half $C plan --cluster examples/clusters/local-cpu.yaml --model tiny-gpt --batch 8 --precision bf16 \
  -o "$T/pmh.json" >/dev/null
CEPHALO_ADAMW=half run_ranks "$T/pmh.json" "$T/memh" --steps 2
check "bf16, CEPHALO_ADAMW=half: each rank's peak equals the predicted peak, 2 bytes per shard parameter above the default's" 0 "" -- $PY -c "
import json
base, half = json.load(open('$T/pmb.json')), json.load(open('$T/pmh.json'))
for r, rk in enumerate(half['ranks']):
    peak = json.loads(open(f'$T/memh/rank{r}.jsonl').readlines()[-1])['peak_bytes']
    assert peak == rk['predicted']['peak_bytes'], (r, peak, rk['predicted']['peak_bytes'])
    b = base['ranks'][r]
    assert rk['predicted']['state_bytes'] == 18 * rk['state_params'], (r, rk)
    assert b['predicted']['state_bytes'] == 16 * b['state_params'], (r, b)
"

# ---- 16-bit activations (CEPHALO_ACTS=16, docs/cuda.md): the invariant and the memory ----
CEPHALO_ACTS=16 one bf16a --precision bf16
check "bf16, CEPHALO_ACTS=16: loss within 1% of bf16 alone at every step" 0 "" -- \
  losses_within 0.01 3 "$T/bf16.jsonl" "$T/bf16a.jsonl"
check "bf16, CEPHALO_ACTS=16: rounds more than bf16 alone (the parameters differ)" 1 "max relative parameter difference" -- \
  $PT compare "$(ck bf16a)" "$(ck bf16)" --tol 0
CEPHALO_ACTS=16 run_ranks "$T/p3b.json" "$T/bf3a" "${args[@]}" --ckpt-dir "$T/bf3a/ckpt"
check "bf16, CEPHALO_ACTS=16 on 3 uneven ranks = 1 rank: losses within 1e-5" 0 "" -- \
  losses_within 1e-5 3 "$T/bf16a.jsonl" "$T/bf3a/rank0.jsonl"
check "bf16, CEPHALO_ACTS=16 on 3 uneven ranks = 1 rank: parameters within 3e-3 in norm per unit" 0 "" -- \
  $PT compare "$T/bf3a/ckpt/step_00000003" "$(ck bf16a)" --tol 3e-3 --rms
# the planner reads the same variable: with recompute none the kept activations take 2 bytes a
# value (and the unit at work one fp32 copy: a saving from three blocks on, so demo-gpt's four),
# and plan and workers agree to the byte
for acts in 32 16; do
  CEPHALO_ACTS=$acts $C plan --cluster examples/clusters/local-cpu.yaml --model examples/models/demo-gpt.yaml --batch 8 --precision bf16 \
    --recompute none -o "$T/pma$acts.json" >/dev/null
  CEPHALO_ACTS=$acts run_ranks "$T/pma$acts.json" "$T/mema$acts" --steps 2
done
check "bf16, recompute none: each rank's peak equals the predicted peak with CEPHALO_ACTS=16 and 32, lower with 16" 0 "" -- $PY -c "
import json
p16, p32 = json.load(open('$T/pma16.json')), json.load(open('$T/pma32.json'))
for r, rk in enumerate(p16['ranks']):
    assert rk['recompute'] == 'none', rk
    for acts, plan in (('16', p16), ('32', p32)):
        peak = json.loads(open(f'$T/mema{acts}/rank{r}.jsonl').readlines()[-1])['peak_bytes']
        want = plan['ranks'][r]['predicted']['peak_bytes']
        assert peak == want, (acts, r, peak, want)
    assert rk['predicted']['peak_bytes'] < p32['ranks'][r]['predicted']['peak_bytes'], r
"
CEPHALO_ACTS=8 check "a bad \$CEPHALO_ACTS is refused, naming the choices" 2 "CEPHALO_ACTS is '8', expected 16" -- \
  "$W" train --data synthetic --model tiny-gpt --batch 2 --steps 1
CEPHALO_ACTS=8 check "... by the planner too" 2 "CEPHALO_ACTS is '8', expected 16" -- \
  $C plan --cluster examples/clusters/local-cpu.yaml --model tiny-gpt --batch 8 --precision bf16
# a plan records the switches its memory counts (inputs.engine); a worker whose environment
# differs refuses it before training, naming the variable, instead of using memory the plan
# did not count
check "the plan records its switches (inputs.engine)" 0 "" -- $PY -c "
import json
e16, e32, eh = (json.load(open(f))['inputs']['engine'] for f in ('$T/pma16.json', '$T/pma32.json', '$T/pmh.json'))
assert e16['activation_bits'] == 16 and e32['activation_bits'] == 32 and eh['state_bytes_per_param'] == 18, (e16, e32, eh)
"
for sw in "CEPHALO_ACTS=16 pma32 activation_bits is 32 but 16" "CEPHALO_ACTS=32 pma16 activation_bits is 16 but 32" \
          "CEPHALO_ADAMW=half pmb state_bytes_per_param is 16 but 18" "CEPHALO_ADAMW=tensor pmh state_bytes_per_param is 18 but 16"; do
  read -r var plan want <<<"$sw"
  check "$var with a plan made without it is refused, naming the variable" 2 \
    "inputs.engine.$want in this worker's environment: the plan was made with another \$${var%%=*}" -- \
    env "$var" CEPHALO_PLAN="$T/$plan.json" RANK=0 WORLD_SIZE=3 "$W" train --data synthetic --steps 1
done
$PY -c "
import json
p = json.load(open('$T/pma32.json')); p['inputs']['engine']['activation_bits'] = 24
json.dump(p, open('$T/pm-bits24.json', 'w'))
"
check "a plan's activation_bits other than 16 or 32 is refused as such" 2 \
  "pm-bits24.json: inputs.engine.activation_bits is 24, expected 16 or 32" -- \
  env CEPHALO_PLAN="$T/pm-bits24.json" RANK=0 WORLD_SIZE=3 "$W" train --data synthetic --steps 1

# ---- bad input ----
check "--precision fp8 is refused" 2 "--precision: 'fp8' is not fp32, bf16 or fp16" -- \
  "$W" train --data synthetic --model tiny-gpt --batch 2 --precision fp8
check "--offload maybe is refused" 2 "--offload: 'maybe' is not on or off" -- \
  "$W" train --data synthetic --model tiny-gpt --batch 2 --offload maybe
check "--device cuda on the CPU-only worker names cephalo-worker-cuda" 2 "cephalo-worker-cuda" -- \
  "$W" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --device cuda

# ---- stopping on SIGTERM (a pod deleted): every rank stops after the same step, checkpointed ----
start_ranks "$T/p3.json" "$T/stop" --steps 100000 --lr 2e-3 --seed 5 --ckpt-dir "$T/stop/ckpt"
# until rank 2 has logged 3 steps, while the ranks live (a busy machine takes longer than an idle one)
end=$((SECONDS + 600))
while [ $SECONDS -lt $end ] && [ "$(cat "$T/stop/rank2.jsonl" 2>/dev/null | wc -l)" -lt 3 ]; do
  kill -0 "${PIDS[0]}" "${PIDS[1]}" "${PIDS[2]}" 2>/dev/null || break
  sleep 0.1
done
kill -TERM "${PIDS[1]}" # one rank only, as when one pod of the gang is deleted first
stop_rcs=""
for p in "${PIDS[@]}"; do wait "$p"; stop_rcs="$stop_rcs $?"; done
check "SIGTERM to one rank: every rank exits 143 after the step in flight" 0 "" -- test "$stop_rcs" = " 143 143 143"
stopped_at() { sed -n 's/.*stopped after step \([0-9]*\) on .*, with a checkpoint of that step.*/\1/p' "$T/stop/rank$1.err"; }
check "... all at the same step, with its checkpoint ('latest')" 0 "" -- bash -c \
  "[ -n '$(stopped_at 0)' ] && [ '$(stopped_at 0)' = '$(stopped_at 1)' ] && [ '$(stopped_at 1)' = '$(stopped_at 2)' ] && grep -q 'step_0*$(stopped_at 0)' '$T/stop/ckpt/latest'"
check "... the signalled rank names SIGTERM, the others a peer's" 0 "a peer's SIGTERM" -- cat "$T/stop/rank0.err"
n_stop=$(stopped_at 0)
run_ranks "$T/p3.json" "$T/stop2" --steps $((n_stop + 2)) --lr 2e-3 --seed 5 --ckpt-dir "$T/stop/ckpt" --resume auto
first=$($PY -c "import json; print(json.loads(open('$T/stop2/rank0.jsonl').readline())['step'])" 2>/dev/null)
check "resuming continues from the stop's step (the log counts steps from 0)" 0 "" -- test "$first" = "$n_stop"
RANK=0 WORLD_SIZE=3 MASTER_ADDR=127.0.0.1 MASTER_PORT=$(free_port) CEPHALO_PLAN=$T/p3.json CEPHALO_COMM_TIMEOUT=60 \
  "$W" train --data synthetic --quiet --steps 5 2>/dev/null &
early=$!
sleep 0.5
kill -TERM "$early"
t0=$SECONDS
wait "$early"
early_rc=$?
check "SIGTERM before training (waiting for peers) ends the worker at once" 0 "" -- \
  test "$early_rc" = 143 -a $((SECONDS - t0)) -le 2

# ---- cephalo-worker-cuda without a GPU (built wherever nvcc is; CI has no GPU) ----
WC=$B/bin/cephalo-worker-cuda
if [ -x "$WC" ]; then
  "$WC" train --data synthetic --quiet --model tiny-gpt --batch 12 --microbatch 4 "${args[@]}" --ckpt-dir "$T/wc" 2>"$T/wc.err"
  check "cephalo-worker-cuda on the CPU device: bit-identical to cephalo-worker" 0 "" -- \
    $PT compare "$(ck wc)" "$(ck ref)" --tol 0
  check "cephalo-worker-cuda --device cuda without a GPU: a clear error" 2 "cuda device: no GPU is visible" -- \
    "$WC" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --device cuda
  nccl_on_cpu() {
    CEPHALO_COMM_BACKEND=nccl run_ranks "$T/p3.json" "$T/ncclcpu" --steps 1 >/dev/null
    cat "$T"/ncclcpu/rank*.err
  }
  W=$WC check "the nccl backend with CPU devices is refused on every rank" 0 "the nccl backend needs the cuda device" -- nccl_on_cpu
else
  echo "# cephalo-worker-cuda not built (no nvcc): its checks skipped"
fi
