#!/bin/bash
# test_fsdp.sh - training across ranks over the socket backend (docs/architecture.md): the invariant (any
# plan gives the parameters of one rank on the global batch), collectives per step, memory
# against the planner's prediction, failures, and resuming under another plan and world size.
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
# fp32, sums in another order: params_agree (tests/cli/lib.sh; docs/fsdp.md, "The invariant")

. tests/cli/ranks.sh

train_args=(--steps 3 --lr 2e-3 --seed 5)

# ---- the invariant: 2, 3 and 4 ranks with uneven batches, microbatches and shards ----
declare -A RANKS=([2]="7:7,5:1" [3]="5:1,3:3,4:2" [4]="6:2,0:1,3:1,3:3")
for model in tiny-gpt tiny-llama tiny-bert tiny-vit; do
  "$W" train --data synthetic --quiet --model "$model" --batch 12 --microbatch 4 "${train_args[@]}" \
    --ckpt-dir "$T/ref-$model" 2>"$T/ref-$model.err"
  for world in 2 3 4; do
    $C plan --cluster "$(cluster_of $world)" --model "$model" --batch 12 -o "$T/base.json" >/dev/null
    $PT rewrite "$T/base.json" "$T/p-$model-$world.json" --ranks "${RANKS[$world]}" --shards random --seed $world
    out=$T/run-$model-$world
    if run_ranks "$T/p-$model-$world.json" "$out" "${train_args[@]}" --ckpt-dir "$out/ckpt"; then
      check "$model on $world ranks (${RANKS[$world]}, random shards) = 1 rank on the global batch" 0 "" \
        -- params_agree "$out/ckpt/step_00000003" "$T/ref-$model/step_00000003.safetensors" 2e-3 3
    else
      n=$((n + 1)); echo "not ok $n - $model on $world ranks trains"; tail -n 3 "$out"/rank*.err | sed 's/^/#   /'
    fi
  done
done

# the Hugging Face export reads a sharded step directory (every rank's file) as one model
"$W" export --checkpoint "$T/run-tiny-llama-3/ckpt/step_00000003" -o "$T/hf-3" >/dev/null 2>&1
"$W" export --checkpoint "$T/ref-tiny-llama" -o "$T/hf-1" >/dev/null 2>&1
# per Hugging Face tensor (a part of a unit) the invariant's bound, params_agree: rms(a - b) within
# 1e-2 of AdamW's largest move, lr x steps; a shard read into the wrong place is off by O(1) steps
check "export of a 3-rank sharded checkpoint = export of the 1-rank one (rms per tensor < 1e-2 x lr*steps)" 0 "" -- $PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import st, numpy as np
a, _ = st.read('$T/hf-3/model.safetensors'); b, _ = st.read('$T/hf-1/model.safetensors')
assert sorted(a) == sorted(b), (sorted(a), sorted(b))
for k in a:
    x, y = np.asarray(a[k], dtype=np.float64), np.asarray(b[k], dtype=np.float64)
    assert x.shape == y.shape, k
    d = np.sqrt(np.mean((x - y) ** 2)) / (2e-3 * 3)
    assert d <= 1e-2, (k, d)
"

# a replicated plan (whale): every rank holds the whole state, gradients all-reduced
$C plan --cluster "$(cluster_of 3)" --model tiny-gpt --batch 12 --strategy whale -o "$T/pw.json" >/dev/null
if run_ranks "$T/pw.json" "$T/whale" "${train_args[@]}" --ckpt-dir "$T/whale/ckpt"; then
  check "replicated (whale) on 3 ranks = 1 rank; one whole-model checkpoint file" 0 "" \
    -- params_agree "$T/whale/ckpt/step_00000003.safetensors" "$T/ref-tiny-gpt/step_00000003.safetensors" 2e-3 3
  check "replicated: no gathers, one all-reduce per unit + the loss's" 0 "" -- $PY -c "
import json
o = json.loads(open('$T/whale/rank1.jsonl').readline())
assert o['gathers'] == 0 and o['reduce_scatters'] == 0 and o['allreduces'] == 4 + 1, o"
else
  n=$((n + 1)); echo "not ok $n - replicated (whale) on 3 ranks trains"; tail -n 3 "$T/whale"/rank*.err | sed 's/^/#   /'
fi

# the same loss on every rank, and equal to the single rank's
check "every rank logs the global loss" 0 "" -- $PY -c "
import json
ref = [json.loads(l)['loss'] for l in open('$T/run-tiny-gpt-3/rank0.jsonl')]
for r in (1, 2):
    assert [json.loads(l)['loss'] for l in open(f'$T/run-tiny-gpt-3/rank{r}.jsonl')] == ref
"

# ---- collectives per step: independent of the number of microbatches ----
count_ok() { # LOG UNITS TIED: gathers = 2*units - 1 + tied, reduce-scatters = units + tied
  $PY -c "
import json, sys
units, tied = $2, $3
for l in open('$1'):
    o = json.loads(l)
    assert o['gathers'] == 2 * units - 1 + tied, o
    assert o['reduce_scatters'] == units + tied, o
"
}
for spec in "4:1,4:1,4:1" "4:4,4:2,4:1"; do
  $C plan --cluster "$(cluster_of 3)" --model tiny-gpt --batch 12 -o "$T/base.json" >/dev/null
  $PT rewrite "$T/base.json" "$T/pc.json" --ranks "$spec" --shards even
  run_ranks "$T/pc.json" "$T/count-$spec" --steps 2
  check "tiny-gpt, microbatches $spec: 8 gathers and 5 reduce-scatters per step" 0 "" -- count_ok "$T/count-$spec/rank1.jsonl" 4 1
done
$C plan --cluster "$(cluster_of 2)" --model tiny-llama --batch 8 -o "$T/base.json" >/dev/null
$PT rewrite "$T/base.json" "$T/pl.json" --ranks "4:1,4:4" --shards random
run_ranks "$T/pl.json" "$T/count-llama" --steps 2
check "tiny-llama (untied head): 7 gathers and 4 reduce-scatters per step" 0 "" -- count_ok "$T/count-llama/rank0.jsonl" 4 0

# bytes: each ring collective sends (world-1)/world of the unit from every rank
check "bytes sent per step = (world-1) x 4 x (gathered + reduced parameters) + the loss all-reduce" 0 "" -- $PY -c "
import json
plan = json.load(open('$T/pc.json'))
numel = [u['numel'] for u in plan['units']]
world, emb, head = 3, numel[0], numel[-1]
gathered = sum(numel) + emb + sum(numel[:-1])   # forward (+ tied embedding), backward
reduced = sum(numel) + emb                       # every unit, the embedding twice (tied head)
want = (world - 1) * 4 * (gathered + reduced) + 2 * (world - 1) * 8 * 5  # 5 doubles (loss, norm², stop, non-finite, targets): RS + AG
got = sum(json.loads(open(f'$T/count-4:1,4:1,4:1/rank{r}.jsonl').readline())['bytes_sent'] for r in range(world))
assert got == want, (got, want)
"

# ---- memory: the engine's peak equals the planner's prediction, per rank ----
$C plan --cluster examples/clusters/local-cpu.yaml --model tiny-gpt --batch 8 -o "$T/pm.json" >/dev/null
run_ranks "$T/pm.json" "$T/mem" --steps 2
check "each rank's peak device memory equals the plan's predicted peak_bytes" 0 "" -- $PY -c "
import json
plan = json.load(open('$T/pm.json'))
for r, rk in enumerate(plan['ranks']):
    peak = json.loads(open(f'$T/mem/rank{r}.jsonl').readlines()[-1])['peak_bytes']
    assert peak == rk['predicted']['peak_bytes'], (r, peak, rk['predicted']['peak_bytes'])
"

# ---- resume: same plan (bit-identical), another plan and world size (the invariant) ----
$C plan --cluster "$(cluster_of 3)" --model tiny-gpt --batch 12 -o "$T/base.json" >/dev/null
$PT rewrite "$T/base.json" "$T/r3.json" --ranks "5:1,3:3,4:2" --shards random --seed 11
run_ranks "$T/r3.json" "$T/straight" --steps 4 --lr 2e-3 --ckpt-dir "$T/straight/ckpt" --ckpt-every 2
check "a sharded checkpoint is a directory with an index" 0 "" -- test -f "$T/straight/ckpt/step_00000002/index.json"
check "'latest' names the last step directory" 0 "step_00000004" -- cat "$T/straight/ckpt/latest"
mkdir -p "$T/again/ckpt" && cp -r "$T/straight/ckpt/step_00000002" "$T/again/ckpt/" && echo step_00000002 >"$T/again/ckpt/latest"
run_ranks "$T/r3.json" "$T/again" --steps 4 --lr 2e-3 --ckpt-dir "$T/again/ckpt" --resume auto
check "resumed under the same plan: bit-identical to the straight run" 0 "" -- \
  bash -c "[ \"\$($PT gather $T/again/ckpt/step_00000004)\" = \"\$($PT gather $T/straight/ckpt/step_00000004)\" ]"
$C plan --cluster "$(cluster_of 2)" --model tiny-gpt --batch 12 -o "$T/base.json" >/dev/null
$PT rewrite "$T/base.json" "$T/r2.json" --ranks "8:4,4:2" --shards random --seed 12
mkdir -p "$T/other/ckpt" && cp -r "$T/straight/ckpt/step_00000002" "$T/other/ckpt/" && echo step_00000002 >"$T/other/ckpt/latest"
run_ranks "$T/r2.json" "$T/other" --steps 4 --lr 2e-3 --ckpt-dir "$T/other/ckpt" --resume auto
check "3-rank checkpoint resumed on 2 ranks with another plan continues the run" 0 "" -- \
  params_agree "$T/other/ckpt/step_00000004" "$T/straight/ckpt/step_00000004" 2e-3 4
"$W" train --data synthetic --quiet --model tiny-gpt --batch 12 --steps 4 --lr 2e-3 --ckpt-dir "$T/single" \
  --resume "$T/straight/ckpt/step_00000002" 2>"$T/single.err"
check "3-rank checkpoint resumed on 1 rank continues the run" 0 "" -- \
  params_agree "$T/single/step_00000004.safetensors" "$T/straight/ckpt/step_00000004" 2e-3 4
check "a 1-rank checkpoint resumes on 3 ranks" 0 "" -- run_ranks "$T/r3.json" "$T/up" --steps 5 --lr 2e-3 \
  --ckpt-dir "$T/up/ckpt" --resume "$T/single/step_00000004.safetensors"
check "one rank's file alone is refused with a hint" 2 "give its step directory" -- "$W" train --data synthetic --quiet --model tiny-gpt \
  --batch 12 --steps 4 --resume "$T/other/ckpt/step_00000002/rank-00000.safetensors"
rm "$T/other/ckpt/step_00000002/rank-00001.safetensors"
check "a missing shard file is named" 2 "rank-00001.safetensors" -- "$W" train --data synthetic --quiet --model tiny-gpt --batch 12 \
  --steps 4 --resume "$T/other/ckpt/step_00000002"

# ---- failures: a rank killed mid-step, a rank stalled ----
$C plan --cluster "$(cluster_of 3)" --model tiny-gpt --batch 6 -o "$T/pf.json" >/dev/null
start_ranks "$T/pf.json" "$T/kill" --steps 100000
for _ in $(seq 100); do [ -s "$T/kill/rank1.jsonl" ] && break; sleep 0.1; done
kill -9 "${PIDS[1]}"
wait "${PIDS[1]}" 2>/dev/null
t0=$(date +%s)
rc0=0; wait "${PIDS[0]}" || rc0=$?
rc2=0; wait "${PIDS[2]}" || rc2=$?
dt=$(($(date +%s) - t0))
check "a rank killed mid-run: the others exit 1 (rc $rc0, $rc2) within 10 s (took ${dt}s)" 0 "" -- \
  test "$rc0" = 1 -a "$rc2" = 1 -a "$dt" -le 10
check "... with a message naming the dead rank" 0 "rank 1" -- cat "$T/kill/rank0.err" "$T/kill/rank2.err"

CEPHALO_COMM_TIMEOUT=2 start_ranks "$T/pf.json" "$T/stall" --steps 100000
for _ in $(seq 100); do [ -s "$T/stall/rank2.jsonl" ] && break; sleep 0.1; done
kill -STOP "${PIDS[2]}"
t0=$(date +%s)
rc0=0; wait "${PIDS[0]}" || rc0=$?
rc1=0; wait "${PIDS[1]}" || rc1=$?
dt=$(($(date +%s) - t0))
kill -9 "${PIDS[2]}" 2>/dev/null; kill -CONT "${PIDS[2]}" 2>/dev/null
wait "${PIDS[2]}" 2>/dev/null
check "a stalled rank: the others exit 1 within the 2 s timeout + slack (took ${dt}s)" 0 "" -- \
  test "$rc0" = 1 -a "$rc1" = 1 -a "$dt" -le 8
check "... with a timeout message" 0 "CEPHALO_COMM_TIMEOUT" -- cat "$T/stall/rank0.err" "$T/stall/rank1.err"

# ---- bad input ----
$PT rewrite "$T/pf.json" "$T/bad.json" --ranks "2:1,2:1,2:1" --shards even
python3 -c "
import json; p = json.load(open('$T/bad.json')); p['units'][1]['shard_sizes'][0] += 1
json.dump(p, open('$T/bad.json', 'w'))"
check "shard sizes that do not add up are refused" 2 "units[1].shard_sizes add up to" -- \
  env RANK=0 WORLD_SIZE=3 MASTER_PORT=1 CEPHALO_PLAN="$T/bad.json" "$W" train --data synthetic --quiet
check "a multi-rank job without MASTER_PORT is refused" 2 "MASTER_PORT" -- \
  env -u MASTER_PORT RANK=0 WORLD_SIZE=3 CEPHALO_PLAN="$T/pf.json" "$W" train --data synthetic --quiet
