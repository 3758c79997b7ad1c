#!/bin/bash
# test_recompute.sh - recompute none (docs/cost-model.md, "Recompute"): a rank that keeps every
# unit's intermediates instead of recomputing them in the backward trains bit for bit as one that
# recomputes (the CPU device is deterministic: the same operations on the same values), on uneven
# sharded ranks, a replicated plan and per-microbatch accumulation; the planner chooses the mode
# per rank from its memory, and each rank's measured peak equals the plan's prediction in both
# (also with vocabulary padding, which leaves the bits as they were).
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
args=(--steps 3 --lr 2e-3 --seed 5)

# same_files A B: every checkpoint file of step 3 identical byte for byte (a sharded step is a
# directory with one file per rank)
same_files() {
  local a=$1 b=$2 f n=0
  for f in "$a"/*; do
    cmp -s "$f" "$b/$(basename "$f")" || { echo "differs: $(basename "$f")"; return 1; }
    n=$((n + 1))
  done
  [ "$n" -gt 1 ] # the index and at least one shard
}

# modes PLAN NAME [worker args...]: the ranks once with every rank's recompute full, once none
# (in the plan: the worker refuses a --recompute that is not its plan's)
modes() {
  local plan=$1 name=$2 m
  shift 2
  for m in full none; do
    $PT recompute "$plan" "$T/$name-$m.json" $m
    run_ranks "$T/$name-$m.json" "$T/$name-$m" "${args[@]}" --ckpt-dir "$T/$name-$m/ckpt" "$@" ||
      { tail -n 3 "$T/$name-$m"/rank*.err; return 1; }
  done
}

# ---- none = full bit for bit: 3 uneven ranks (microbatches 1, 3 and 2), random shards ----
for model in tiny-gpt tiny-llama tiny-bert tiny-vit; do
  $C plan --cluster "$(cluster_of 3)" --model $model --batch 12 -o "$T/base-$model.json" >/dev/null
  $PT rewrite "$T/base-$model.json" "$T/p-$model.json" --ranks 5:1,3:3,4:2 --shards random --seed 7
  if modes "$T/p-$model.json" "$model"; then
    check "$model on 3 uneven ranks: recompute none = full, checkpoints byte for byte" 0 "" -- \
      same_files "$T/$model-none/ckpt/step_00000003" "$T/$model-full/ckpt/step_00000003"
    check "$model: the same losses logged" 0 "" -- $PY -c "
import json
f = [json.loads(l)['loss'] for l in open('$T/$model-full/rank0.jsonl')]
k = [json.loads(l)['loss'] for l in open('$T/$model-none/rank0.jsonl')]
assert f == k and len(f) == 3, (f, k)"
  else
    n=$((n + 1)); echo "not ok $n - $model on 3 ranks trains with both recompute modes"
  fi
done

# per-microbatch accumulation: one microbatch's intermediates kept at a time
$PT rewrite "$T/base-tiny-gpt.json" "$T/pm.json" --ranks 5:1,3:3,4:2 --shards random --seed 3
modes "$T/pm.json" permicro --accumulate per-micro
check "per-microbatch accumulation: recompute none = full, byte for byte" 0 "" -- \
  same_files "$T/permicro-none/ckpt/step_00000003" "$T/permicro-full/ckpt/step_00000003"

# a replicated plan: the whole model on each rank, gradients all-reduced
$C plan --cluster "$(cluster_of 3)" --model tiny-llama --batch 12 --strategy whale -o "$T/pw.json" >/dev/null
modes "$T/pw.json" whale
check "replicated plan (whale): recompute none = full, byte for byte" 0 "" -- \
  cmp "$T/whale-none/ckpt/step_00000003.safetensors" "$T/whale-full/ckpt/step_00000003.safetensors"

# ---- the planner's choice per rank, and memory predicted = measured ----
# two small devices and a large one: the small ones recompute, the large one keeps
mixed() { # mixed GIB: the cluster file
  printf 'nodes:\n  - name: local\n    gpus:\n      - {type: cpu, count: 2, threads: 1, memory_gib: %s}\n      - {type: cpu, threads: 2, memory_gib: 0.05}\n' "$1" >"$T/mixed-$1.yaml"
  echo "$T/mixed-$1.yaml"
}
$C plan --cluster "$(mixed 0.004)" --model tiny-gpt --batch 24 -o "$T/mix.json" >"$T/mix.txt"
check "a mixed cluster: the small devices recompute, the large one keeps its activations" 0 "" -- $PY -c "
import json
assert [r['recompute'] for r in json.load(open('$T/mix.json'))['ranks']] == ['full', 'full', 'none']"
check "the plan table shows each rank's mode" 0 "" -- bash -c "grep -c ' full ' '$T/mix.txt' | grep -qx 2 && grep -q ' none ' '$T/mix.txt'"

# peak_ok PLAN OUT: each rank's measured peak = the plan's predicted peak_bytes
peak_ok() {
  $PY -c "
import json
plan = json.load(open('$1'))
for r, rk in enumerate(plan['ranks']):
    peak = json.loads(open(f'$2/rank{r}.jsonl').readlines()[-1])['peak_bytes']
    assert peak == rk['predicted']['peak_bytes'], (r, rk['recompute'], peak, rk['predicted']['peak_bytes'])
"
}
# planned (mixed), then every rank forced to each mode; several models and batches, microbatches
# above 1 where memory makes the planner split
for spec in "tiny-gpt 24 0.004 auto" "tiny-gpt 24 0.003 none" "tiny-gpt 24 0.003 full" "tiny-llama 24 0.003 none" \
  "tiny-bert 12 0.004 none" "tiny-vit 12 0.004 full" "tiny-vit 24 0.004 none" "tiny-llama 16 0.006 auto"; do
  set -- $spec
  p="$T/mem-$1-$2-$3-$4.json"
  $C plan --cluster "$(mixed $3)" --model $1 --batch $2 --recompute $4 -o "$p" >/dev/null
  modes_in=$($PY -c "import json; print(' '.join('%d:%d:%s' % (r['microbatch'], r['microbatches'], r['recompute']) for r in json.load(open('$p'))['ranks']))")
  if run_ranks "$p" "$T/run-$1-$2-$3-$4" --steps 2; then
    check "$1 batch $2, devices of $3 GiB, recompute $4 ($modes_in): each rank's peak = the plan's prediction" 0 "" -- \
      peak_ok "$p" "$T/run-$1-$2-$3-$4"
  else
    n=$((n + 1)); echo "not ok $n - $1 batch $2 recompute $4 trains"; tail -n 3 "$T/run-$1-$2-$3-$4"/rank*.err | sed 's/^/#   /'
  fi
done
check "some plan keeps more than one microbatch per rank (kept memory grows with l)" 0 "" -- $PY -c "
import glob, json
ranks = [r for f in glob.glob('$T/mem-*.json') for r in json.load(open(f))['ranks']]
assert any(r['recompute'] == 'none' and r['microbatches'] > 1 for r in ranks)"

# ---- vocabulary padding (CEPHALO_VOCAB_PAD=1, docs/cuda.md): a vocabulary of 250 gets logits rows
# of stride 256; the planner (which reads the variable too) counts it, the ranks allocate it, and
# the parameters do not change ----
printf 'base: tiny-gpt\nname: gpt-v250\nvocab: 250\n' >"$T/v250.yaml"
for pad in 0 1; do
  CEPHALO_VOCAB_PAD=$pad $C plan --cluster "$(mixed 0.004)" --model "$T/v250.yaml" --batch 12 -o "$T/v$pad.json" >/dev/null
done
CEPHALO_VOCAB_PAD=1 run_ranks "$T/v1.json" "$T/vrun1" --steps 2 --data synthetic
check "vocabulary padding: each rank's peak = the padded plan's prediction" 0 "" -- peak_ok "$T/v1.json" "$T/vrun1"
check "... which is above the unpadded plan's" 0 "" -- $PY -c "
import json
a, b = (json.load(open('$T/v%d.json' % p))['ranks'] for p in (0, 1))
assert sum(r['predicted']['peak_bytes'] for r in b) > sum(r['predicted']['peak_bytes'] for r in a)"
# the same plan under both: without its inputs.engine, which a worker with the other setting
# refuses (test_modes.sh)
$PY -c "import json; p = json.load(open('$T/v0.json')); p['inputs'].pop('engine'); json.dump(p, open('$T/v0-any.json', 'w'))"
for pad in 0 1; do
  CEPHALO_VOCAB_PAD=$pad run_ranks "$T/v0-any.json" "$T/vsame$pad" --steps 2 --data synthetic --ckpt-dir "$T/vsame$pad/ckpt"
done
check "vocabulary padding: the same plan's checkpoint bit for bit with and without" 0 "" -- \
  same_files "$T/vsame0/ckpt/step_00000002" "$T/vsame1/ckpt/step_00000002"

# ---- bad input ----
check "--recompute some is refused" 2 "--recompute: 'some' is not none or full" -- \
  "$W" train --data synthetic --model tiny-gpt --batch 4 --recompute some
check "cephalo plan --recompute some is refused" 2 "--recompute: 'some' is not auto, none or full" -- \
  "$C" plan --cluster "$(cluster_of 3)" --model tiny-gpt --batch 12 --recompute some


printf 'nodes:\n  - name: n\n    gpus: [{type: T4}, {type: P100, memory_gib: 6}]\n' >"$T/small.yaml"
check "a plan infeasible only because recompute none is forced says so" 3 "with recompute none (every unit's activations kept" -- \
  "$C" plan --cluster "$T/small.yaml" --model gpt2-774m --batch 8 --recompute none
check "... which recompute auto plans" 0 "" -- "$C" plan --cluster "$T/small.yaml" --model gpt2-774m --batch 8

# ---- evaluation between steps: its forward keeps nothing, training goes on as before ----
for m in full none; do
  "$W" train --data synthetic --quiet --model tiny-bert --batch 6 --microbatch 2 --steps 2 --val-data synthetic --val-every 1 \
    --val-samples 8 --recompute $m --log "$T/val-$m.jsonl" 2>"$T/val-$m.err"
done
check "validation losses and training losses with recompute none = full" 0 "" -- $PY -c "
import json
f = [(o['loss'], o['val_loss']) for o in map(json.loads, open('$T/val-full.jsonl'))]
k = [(o['loss'], o['val_loss']) for o in map(json.loads, open('$T/val-none.jsonl'))]
assert f == k and len(f) == 2, (f, k)"
