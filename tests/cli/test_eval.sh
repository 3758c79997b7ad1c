#!/bin/bash
# test_eval.sh - the validation loss (docs/worker.md, "Validation"): `train --val-data` logs it on
# the steps it is due, the same number on 1 rank and on an uneven 3-rank plan (sharded, other
# microbatches); `cephalo-worker eval` of a checkpoint (file, sharded step directory, checkpoint
# directory, latest, an exported Hugging Face directory; on 1 rank or on every rank of an uneven
# plan) gives the number the training logged; a float64 PyTorch computation on the checkpoint's
# parameters (tests/ref/val_loss.py) agrees; evaluating changes nothing in the training (losses and checkpoints bit for bit); BERT and ViT
# evaluate too; /metrics has cephalo_train_val_loss; `cephalo run` passes the job's `validation`
# and shows the loss in its summary; bad options and files give clear errors.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
B=${BUILD:-build/rel}
C=$B/bin/cephalo
W=$PWD/$B/bin/cephalo-worker
T=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
PY=/usr/bin/python3 # Debian's, with numpy and torch (the oracle)
PT="$PY tests/fsdp/plan_tool.py"
export OMP_NUM_THREADS=1
unset CEPHALO_METRICS_PORT CEPHALO_PLAN
. tests/cli/ranks.sh
# Across plans the same sample's loss may differ in the last float bits (other microbatch sizes
# in the matrix products, sums over ranks in another order): 1e-6 relative. Against float64
# PyTorch: the fp32 forward's rounding, 1e-5 relative.
PLAN_TOL=1e-6
ORACLE_TOL=1e-5

# rel_close A B TOL: |A-B| <= TOL*|B|
rel_close() { $PY -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=t*abs(b) else 1)" "$1" "$2" "$3"; }
# field FILE KEY: the KEY values of a JSON-lines log, one per line, as written ("-" when absent)
field() { $PY -c "
import re, sys
for line in open(sys.argv[1]):
    m = re.search(r'\"%s\":([^,}]*)' % sys.argv[2], line)
    print(m.group(1) if m else '-')" "$1" "$2"; }
# same_col A B KEY: the KEY columns of two logs are equal and hold numbers
same_col() {
  local a b
  a=$(field "$1" "$3") && b=$(field "$2" "$3") && [ "$a" = "$b" ] && grep -q '[0-9]' <<<"$a"
}
# same_ckpt A B: two checkpoints hold the same tensors, bit for bit (sha256 over every tensor)
same_ckpt() {
  local a b
  a=$($PT gather "$1") && b=$($PT gather "$2") && [ -n "$a" ] && [ "$a" = "$b" ]
}
json_key() { $PY -c "import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])" "$1"; }
# ok_if NAME COND_RC [details]: one check from a condition already evaluated
ok_if() {
  n=$((n + 1))
  if [ "$2" -eq 0 ]; then echo "ok $n - $1"; else echo "not ok $n - $1"; [ -n "${3:-}" ] && echo "#   $3"; fi
}

# ---- data: llm.c shards with a validation split, and a small validation shard for the oracle ----
"$C" data -o "$T/sh" --val-fraction 0.1 README.md docs/worker.md docs/data.md docs/run.md >/dev/null 2>&1
# 13 windows of 32+1 tokens: every window is a validation sample (--samples beyond 13)
$PY - "$T/small.bin" <<'EOF'
import sys, numpy as np
toks = np.frombuffer(open("docs/fsdp.md", "rb").read()[: 32 * 13 + 1], np.uint8).astype(np.uint16)
head = np.zeros(256, np.int32); head[:3] = (20240520, 1, len(toks))
open(sys.argv[1], "wb").write(head.tobytes() + toks.tobytes())
EOF
VAL="$T/sh/val_*.bin"
common=(--steps 4 --lr 2e-3 --seed 5 --data "$T/sh/train_*.bin") # the plans say --seq 32
val=(--val-data "$VAL" --val-every 2 --val-samples 23)

# ---- one rank: the log, the progress line ----
"$W" train --model tiny-gpt --batch 12 --microbatch 4 --seq 32 "${common[@]}" "${val[@]}" --log "$T/g1.jsonl" \
  --ckpt-dir "$T/g1ck" --ckpt-every 2 2>"$T/g1.err"
check "train --val-data runs" 0 "" -- test -s "$T/g1ck/step_00000004.safetensors"
check "val_loss after steps 2 and 4 only (--val-every 2)" 0 "" -- \
  test "$(field "$T/g1.jsonl" val_loss | sed -E 's/^[0-9]+\.[0-9]+$/X/' | tr '\n' ' ')" = "- X - X "
assert "val_ppl = exp(val_loss)" $PY -c "
import json, math, sys
for l in open('$T/g1.jsonl'):
    o = json.loads(l)
    if 'val_loss' in o and abs(math.exp(o['val_loss']) - o['val_ppl']) > 1e-6 * o['val_ppl']: sys.exit(1)"
check "progress line shows the validation loss" 0 "| val " -- grep -F "step 4/4" "$T/g1.err"
check "start-up summary describes the validation set" 0 "validation: 23 samples" -- cat "$T/g1.err"

# ---- evaluation leaves the training as it was, bit for bit ----
"$W" train --quiet --model tiny-gpt --batch 12 --microbatch 4 --seq 32 "${common[@]}" --log "$T/g0.jsonl" \
  --ckpt-dir "$T/g0ck" --ckpt-every 2
check "1 rank: the same training losses with and without --val-data" 0 "" -- same_col "$T/g0.jsonl" "$T/g1.jsonl" loss
for s in 2 4; do
  check "1 rank: checkpoint step $s identical with and without --val-data" 0 "" -- \
    same_ckpt "$T/g0ck/step_0000000$s.safetensors" "$T/g1ck/step_0000000$s.safetensors"
done

# ---- 1 rank against an uneven 3-rank plan (tiny-llama: untied head, GQA) ----
"$W" train --quiet --model tiny-llama --batch 12 --microbatch 4 --seq 32 "${common[@]}" "${val[@]}" --log "$T/l1.jsonl" \
  --ckpt-dir "$T/l1ck"
"$C" plan --cluster "$(cluster_of 3)" --model tiny-llama --batch 12 --seq 32 -o "$T/base.json" >/dev/null
$PT rewrite "$T/base.json" "$T/p3.json" --ranks "5:1,3:3,4:2" --shards random --seed 3
run_ranks "$T/p3.json" "$T/l3" "${common[@]}" "${val[@]}" --ckpt-dir "$T/l3/ck"
ok_if "3 ranks: training with validation runs" $?
for r in 1 2; do
  check "3 ranks: rank $r logs rank 0's validation losses" 0 "" -- same_col "$T/l3/rank0.jsonl" "$T/l3/rank$r.jsonl" val_loss
done
v1=($(field "$T/l1.jsonl" val_loss | grep -v -- -)) v3=($(field "$T/l3/rank0.jsonl" val_loss | grep -v -- -))
for i in 0 1; do
  rel_close "${v3[$i]:-0}" "${v1[$i]:-1}" $PLAN_TOL
  ok_if "1 rank = 3 uneven ranks: val_loss after step $((2 * i + 2)) (${v1[$i]:-?} vs ${v3[$i]:-?}, $PLAN_TOL)" $?
done
run_ranks "$T/p3.json" "$T/l3n" "${common[@]}" --ckpt-dir "$T/l3n/ck"
check "3 ranks: the same training losses with and without --val-data" 0 "" -- same_col "$T/l3n/rank0.jsonl" "$T/l3/rank0.jsonl" loss
check "3 ranks: the same final checkpoint with and without --val-data" 0 "" -- \
  same_ckpt "$T/l3n/ck/step_00000004" "$T/l3/ck/step_00000004"

# ---- cephalo-worker eval of a checkpoint = the logged val_loss ----
e1=$("$W" eval --checkpoint "$T/g1ck/step_00000002.safetensors" --data "$VAL" --samples 23 --json | json_key val_loss)
g1=$(field "$T/g1.jsonl" val_loss | sed -n 2p)
check "eval of step 2 (a file) = the val_loss logged after step 2" 0 "" -- rel_close "$e1" "$g1" $PLAN_TOL
e3=$("$W" eval --checkpoint "$T/l3/ck/step_00000004" --data "$VAL" --samples 23 --microbatch 3 --json | json_key val_loss)
check "eval of a 3-rank sharded step directory = its logged val_loss ($e3)" 0 "" -- rel_close "$e3" "${v3[1]:-1}" $PLAN_TOL
el1=$("$W" eval --checkpoint "$T/l1ck" --data "$VAL" --samples 23 --json | json_key val_loss)
for c in "$T/l3/ck" "$T/l3/ck/latest" "$T/l1ck"; do
  e=$("$W" eval --checkpoint "$c" --data "$VAL" --samples 23 --json | json_key val_loss)
  check "eval --checkpoint ${c#$T/} = the 3-rank checkpoint's" 0 "" -- rel_close "$e" "$e3" $PLAN_TOL
done
# eval_ranks PLAN OUT eval-args...: every rank of PLAN evaluates; rank 0's stdout in OUT
eval_ranks() {
  local plan=$1 out=$2 world port r rc=0 pids=()
  shift 2
  world=$(world_of "$plan") port=$(free_port)
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$W" eval --plan "$plan" "$@" >"$out.$r" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  cp "$out.0" "$out"
  return $rc
}
eval_ranks "$T/p3.json" "$T/e3.json" --checkpoint "$T/l1ck" --data "$VAL" --samples 23 --json
ok_if "eval of the 1-rank checkpoint on the 3-rank plan runs" $? "$(tail -2 "$T/e3.json.0")"
check "eval: only rank 0 prints" 0 "" -- test ! -s "$T/e3.json.1" -a ! -s "$T/e3.json.2"
e31=$(json_key val_loss <"$T/e3.json")
check "one checkpoint, 1 rank and 3 uneven ranks: the same val loss ($e31)" 0 "" -- rel_close "$e31" "$el1" $PLAN_TOL
check "eval: the text line" 0 "val loss " -- "$W" eval --checkpoint "$T/l1ck" --data "$VAL" --samples 23
check "eval --json: step, samples, targets" 0 '"step":4,"data":' -- "$W" eval --checkpoint "$T/l1ck" --data "$VAL" --samples 23 --json
check "eval --samples beyond the windows: each window once" 0 '"samples":13,"targets":416' -- \
  "$W" eval --checkpoint "$T/l1ck" --data "$T/small.bin" --samples 1000 --json

# ---- the PyTorch oracle: every window of the small shard, float64 ----
for c in "$T/g1ck/step_00000004.safetensors" "$T/l3/ck/step_00000004"; do
  mine=$("$W" eval --checkpoint "$c" --data "$T/small.bin" --samples 100 --json | json_key val_loss)
  ref=$($PY tests/ref/val_loss.py "$c" 32 "$T/small.bin")
  check "oracle: ${c#$T/} ($mine vs float64 $ref, $ORACLE_TOL)" 0 "" -- rel_close "$mine" "$ref" $ORACLE_TOL
done

# ---- eval --init-from: a Hugging Face directory (the exported checkpoint) ----
"$W" export --checkpoint "$T/l1ck" -o "$T/hf" >/dev/null 2>&1
eh=$("$W" eval --init-from "$T/hf" --data "$VAL" --samples 23 --seq 32 --json | json_key val_loss)
el=$("$W" eval --checkpoint "$T/l1ck" --data "$VAL" --samples 23 --json | json_key val_loss)
check "eval --init-from (exported) = eval --checkpoint ($eh)" 0 "" -- rel_close "$eh" "$el" $PLAN_TOL

# ---- BERT (masked LM, fixed masks) and ViT (images) ----
"$W" train --quiet --model tiny-bert --batch 8 --microbatch 4 --seq 32 "${common[@]}" --val-data "$VAL" --val-samples 10 \
  --log "$T/b.jsonl" --ckpt-dir "$T/bck"
vb=$(field "$T/b.jsonl" val_loss | tail -1)
eb=$("$W" eval --checkpoint "$T/bck" --data "$VAL" --samples 10 --json | json_key val_loss)
check "BERT: eval = the logged val_loss ($vb)" 0 "" -- rel_close "$eb" "$vb" $PLAN_TOL
"$W" train --data synthetic --quiet --model tiny-vit --batch 8 --microbatch 4 --steps 2 --val-data synthetic --val-samples 12 \
  --log "$T/v.jsonl" --ckpt-dir "$T/vck"
vv=$(field "$T/v.jsonl" val_loss | tail -1)
ev=$("$W" eval --checkpoint "$T/vck" --data synthetic --samples 12 --json | json_key val_loss)
check "ViT: eval = the logged val_loss ($vv)" 0 "" -- rel_close "$ev" "$vv" $PLAN_TOL

# ---- /metrics: cephalo_train_val_loss ----
port=$(free_port)
"$W" train --data synthetic --quiet --model tiny-gpt --batch 4 --steps 100000 --val-data "$VAL" --val-every 3 --val-samples 4 \
  --metrics-port "$port" --metrics-addr 127.0.0.1 2>/dev/null &
mpid=$!
# scrape: /metrics into $T/metrics.txt; succeeds once it has a validation loss
cat >"$T/scrape.sh" <<EOF
$PY -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://127.0.0.1:$port/metrics', timeout=2).read().decode())" >"$T/metrics.txt" &&
grep -q '^cephalo_train_val_loss{' "$T/metrics.txt"
EOF
wait_for 20 bash "$T/scrape.sh"
ok_if "/metrics: cephalo_train_val_loss" $?
check "/metrics: cephalo_train_val_step is a multiple of --val-every" 0 "" -- \
  awk '/^cephalo_train_val_step\{/ {found = 1; bad = $2 % 3} END {exit !found || bad}' "$T/metrics.txt"
kill -TERM $mpid 2>/dev/null; wait $mpid 2>/dev/null

# ---- cephalo run: the job's validation reaches the workers and the summary ----
mkdir -p "$T/job/shards"
cp "$T"/sh/*.bin "$T/job/shards/"
cat >"$T/job/val.yaml" <<'EOF'
name: val
model: tiny-gpt
data: shards/train_*.bin
seq: 32
batch: 6
steps: 4
optimizer: {lr: 2e-3}
validation: {data: shards/val_*.bin, every: 2, samples: 9}
devices:
  - {type: cpu, threads: 1, memory: 256M, count: 2}
EOF
check "run --dry-run: --val-data resolved against the job file" 0 "--val-data '$T/job/shards/val_*.bin' --val-every 2 --val-samples 9" -- \
  "$C" run "$T/job/val.yaml" --dry-run --run-dir "$T/job/r"
check "run: the summary has the validation loss" 0 "validation loss " -- "$C" run "$T/job/val.yaml" --run-dir "$T/job/r" --quiet
assert "run: summary.json has final_val_loss and two val_loss points" $PY -c "
import json, sys
s = json.load(open('$T/job/r/summary.json'))
sys.exit(0 if isinstance(s['final_val_loss'], float) and [p['step'] for p in s['val_loss']] == [2, 4] else 1)"
printf 'name: v\nmodel: tiny-gpt\nbatch: 4\nsteps: 2\nvalidation: {every: 2}\ndevices: [{type: cpu, threads: 1, memory: 256M}]\ndata: synthetic\n' >"$T/job/nodata.yaml"
check "run: validation without data" 2 "validation: missing field 'data'" -- "$C" run "$T/job/nodata.yaml" --dry-run --run-dir "$T/job/r2"
printf 'name: v\nmodel: tiny-gpt\nbatch: 4\nsteps: 2\nvalidation: {data: x.bin, every: -1}\ndevices: [{type: cpu, threads: 1, memory: 256M}]\ndata: synthetic\n' >"$T/job/neg.yaml"
check "run: validation.every out of range" 2 "validation.every" -- "$C" run "$T/job/neg.yaml" --dry-run --run-dir "$T/job/r3"

# ---- errors ----
"$C" plan --cluster "$(cluster_of 1)" --model tiny-gpt --batch 4 -o "$T/p1gpt.json" >/dev/null
tg=(train --data synthetic --quiet --model tiny-gpt --batch 4 --steps 1)
check "--val-every without --val-data" 2 "--val-every needs --val-data" -- "$W" "${tg[@]}" --val-every 5
check "--val-samples without --val-data" 2 "--val-samples needs --val-data" -- "$W" "${tg[@]}" --val-samples 5
check "--val-samples 0" 2 "--val-samples: '0' is not an integer in [1," -- "$W" "${tg[@]}" --val-data "$VAL" --val-samples 0
check "--val-every -1" 2 "--val-every: '-1' is not an integer" -- "$W" "${tg[@]}" --val-data "$VAL" --val-every -1
check "--val-data: a missing file" 2 "--val-data: $T/none.bin" -- "$W" "${tg[@]}" --val-data "$T/none.bin"
head -c 100 /etc/passwd >"$T/junk.bin"
check "--val-data: not a shard" 2 "--val-data: $T/junk.bin" -- "$W" "${tg[@]}" --val-data "$T/junk.bin"
$PY - "$T/big.bin" <<'EOF'
import sys, numpy as np
toks = np.arange(200, 300, dtype=np.uint16)
head = np.zeros(256, np.int32); head[:3] = (20240520, 1, len(toks))
open(sys.argv[1], "wb").write(head.tobytes() + toks.tobytes())
EOF
$PY - "$T/short.bin" <<'EOF'
import sys, numpy as np
head = np.zeros(256, np.int32); head[:3] = (20240520, 1, 5)
open(sys.argv[1], "wb").write(head.tobytes() + np.arange(1, 6, dtype=np.uint16).tobytes())
EOF
check "--val-data: no window of seq+1 tokens" 2 "--val-data: data: no training sample: every shard is shorter than seq+1" -- \
  "$W" "${tg[@]}" --seq 8 --val-data "$T/short.bin"
check "--val-data: a token beyond the vocabulary fails at the start" 2 "not below the model's vocabulary size 256" -- \
  "$W" "${tg[@]}" --seq 8 --val-data "$T/big.bin" --val-samples 100
check "eval: no --data" 2 "--data: give the validation data" -- "$W" eval --checkpoint "$T/l1ck"
check "eval: neither --checkpoint nor --init-from" 2 "give --checkpoint PATH or --init-from DIR" -- "$W" eval --data "$VAL"
check "eval: both --checkpoint and --init-from" 2 "give --checkpoint PATH or --init-from DIR" -- \
  "$W" eval --checkpoint "$T/l1ck" --init-from "$T/hf" --data "$VAL"
check "eval: a missing checkpoint" 2 "--checkpoint: $T/nope" -- "$W" eval --checkpoint "$T/nope" --data "$VAL"
check "eval: a directory without checkpoints" 2 "no checkpoint in this directory" -- "$W" eval --checkpoint "$T/sh" --data "$VAL"
check "eval: --samples abc" 2 "--samples: 'abc' is not an integer" -- "$W" eval --checkpoint "$T/l1ck" --data "$VAL" --samples abc
check "eval: --seq with a plan" 2 "--seq and --microbatch come from the plan" -- \
  "$W" eval --plan "$T/p3.json" --seq 16 --checkpoint "$T/l1ck" --data "$VAL"
check "eval: several ranks without a plan" 2 "WORLD_SIZE is 3: evaluating across ranks needs a plan" -- \
  env WORLD_SIZE=3 "$W" eval --checkpoint "$T/l1ck" --data "$VAL"
check "eval: a checkpoint of another model than the plan's" 2 "the checkpoint is of model tiny-llama" -- \
  "$W" eval --plan "$T/p1gpt.json" --checkpoint "$T/l1ck" --data "$VAL"
check "eval: a missing --data file" 2 "--data: $T/none.bin" -- "$W" eval --checkpoint "$T/l1ck" --data "$T/none.bin"
check "eval --help" 0 "usage: cephalo-worker eval" -- "$W" eval --help
