#!/usr/bin/env bash
# CLI tests of `cephalo-worker`: training from a plan or from flags, the JSON-lines log,
# checkpoints and resume (an interrupted run continues exactly), bad input with exit code 2 and a
# message naming the file or field, and the Hugging Face export. Prints "ok N - ..." lines.
set -u
B=${BUILD:-build/rel}/bin
W=$B/cephalo-worker
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"

TINY=(--model tiny-gpt --batch 4 --microbatch 2 --seq 32 --threads 2 --lr 1e-3)

check "help" 0 "usage: cephalo-worker train" -- "$W" --help
# train --help states the defaults of common/worker_cmd.c's table, each beside its own option
check "train --help: the table's defaults, each beside its option" 0 "" -- bash -c "
  h=\$('$W' train --help) &&
  grep -q -- '--lr X  *peak learning rate (default 0.0003)' <<<\"\$h\" &&
  grep -q -- 'constant (lr throughout); default cosine' <<<\"\$h\" &&
  grep -q -- 'AdamW (default 0.9, 0.95, 1e-08)' <<<\"\$h\" &&
  grep -q -- 'DIR/retention.json keeps, else 3)' <<<\"\$h\" &&
  grep -q -- \"or 'none' (start afresh); default none\" <<<\"\$h\" &&
  grep -q -- '--val-samples N  *validation samples (default 64;' <<<\"\$h\""
check "no command" 2 "usage" -- "$W"
check "unknown command" 2 "unknown command 'trian'" -- "$W" trian
check "unknown option" 2 "unknown option '--bogus'" -- "$W" train --data synthetic --bogus 1
check "no model" 2 "--model and --batch, or --init-from DIR and --batch" -- "$W" train --data synthetic
check "no batch: the remedy is --batch" 2 "give --batch B (samples per step) for --model tiny-gpt" -- "$W" train --data synthetic --model tiny-gpt
# synthetic tokens only when named: no default data, with or without --init-from
check "no --data: refused, naming the choices" 2 "give --data SPEC, the training data: token shards (cephalo data)" -- \
  "$W" train --model tiny-gpt --batch 4 --steps 1
check "unknown model" 2 "tiny-gpt" -- "$W" train --data synthetic --model tiny-gtp --batch 4
check "batch not a multiple" 2 "not a multiple of --microbatch" -- "$W" train --data synthetic --model tiny-gpt --batch 5 --microbatch 2
check "bad number" 2 "--lr: 'fast'" -- "$W" train --data synthetic "${TINY[@]}" --lr fast
check "warmup not below steps: the one rule of job files and CephaloJobs (common/worker_cmd.c)" 2 \
  "--warmup: 5 must be below --steps (5): the warmup must end before the last step" -- "$W" train --data synthetic "${TINY[@]}" --steps 5 --warmup 5
check "seq too long" 2 "exceeds" -- "$W" train --data synthetic --model tiny-gpt --batch 2 --seq 4096
check "bad size" 2 "--memory: '12Q'" -- "$W" train --data synthetic "${TINY[@]}" --memory 12Q
check "memory too small" 2 "out of memory" -- "$W" train --data synthetic "${TINY[@]}" --memory 256K --steps 1
check "host pool beyond this machine" 2 "host offload pool" -- "$W" train --data synthetic --model gpt2-124m --batch 65536 --microbatch 1 --steps 1

# Training from flags: progress on stderr, one JSON line per step.
check "train from flags" 0 "step 3/3" -- "$W" train --data synthetic "${TINY[@]}" --steps 3 --log "$T/log.jsonl"
assert "log has 3 JSON lines" python3 -c "
import json,sys
rows=[json.loads(l) for l in open('$T/log.jsonl')]
assert len(rows)==3 and [r['step'] for r in rows]==[0,1,2]
assert all(r['loss']>0 and r['tokens_per_s']>0 and r['grad_norm']>0 for r in rows)"

# Training from a plan (CEPHALO_PLAN, RANK, WORLD_SIZE).
cat >"$T/one.yaml" <<'Y'
nodes:
  - name: local
    gpus: [{type: cpu, count: 1, threads: 2, memory_gib: 1}]
Y
"$B/cephalo" plan --cluster "$T/one.yaml" --model tiny-llama --batch 4 --seq 32 -o "$T/plan1.json" >/dev/null
check "train from a plan" 0 "model tiny-llama" -- env CEPHALO_PLAN="$T/plan1.json" RANK=0 WORLD_SIZE=1 "$W" train --data synthetic --steps 2
check "plan with flags too" 2 "come from the plan" -- env CEPHALO_PLAN="$T/plan1.json" "$W" train --data synthetic --model tiny-gpt --steps 2
# --precision and --recompute beside a plan: the plan's value, or refused naming both
rec1=$(/usr/bin/python3 -c "import json; print(json.load(open('$T/plan1.json'))['ranks'][0]['recompute'])")
other_rec=$([ "$rec1" = full ] && echo none || echo full)
check "plan with its own --precision and --recompute: accepted" 0 "" -- env CEPHALO_PLAN="$T/plan1.json" "$W" train --data synthetic \
  --steps 1 --quiet --precision fp32 --recompute "$rec1"
check "plan with another --precision: refused, naming both" 2 "--precision bf16: the plan $T/plan1.json was made for fp32 (give fp32, or plan again with --precision bf16)" -- \
  env CEPHALO_PLAN="$T/plan1.json" "$W" train --data synthetic --steps 1 --precision bf16
check "plan with another --recompute: refused, naming both" 2 "--recompute $other_rec: the plan $T/plan1.json has rank 0 recompute $rec1" -- \
  env CEPHALO_PLAN="$T/plan1.json" "$W" train --data synthetic --steps 1 --recompute "$other_rec"
check "plan world size mismatch" 2 "WORLD_SIZE is 2" -- env RANK=0 WORLD_SIZE=2 "$W" train --data synthetic --plan "$T/plan1.json"
"$B/cephalo" plan --cluster examples/clusters/local-cpu.yaml --model tiny-gpt --batch 8 -o "$T/plan3.json" >/dev/null
check "multi-rank needs MASTER_PORT" 2 "MASTER_PORT is not set" -- env -u MASTER_PORT RANK=1 WORLD_SIZE=3 "$W" train --data synthetic --plan "$T/plan3.json"
check "bad RANK" 2 "\$RANK is 'x'" -- env RANK=x "$W" train --data synthetic --plan "$T/plan1.json"
check "not a plan" 2 "cephalo-plan" -- "$W" train --data synthetic --plan examples/profiles/cluster-a-bert-large.json
echo '{"format": "cephalo-plan", "inputs": ' >"$T/broken.json"
check "truncated plan" 2 "broken.json" -- "$W" train --data synthetic --plan "$T/broken.json"

# Checkpoints: 4 steps straight vs 2 steps, stop, resume to 4: the same losses, bit for bit.
"$W" train --data synthetic "${TINY[@]}" --steps 4 --quiet --log "$T/straight.jsonl" --ckpt-dir "$T/ck0"
check "checkpoint every 2" 0 "" -- "$W" train --data synthetic "${TINY[@]}" --steps 4 --ckpt-every 2 --quiet --ckpt-dir "$T/ck" --log "$T/a.jsonl"
assert "checkpoint files and latest" test -s "$T/ck/step_00000002.safetensors" -a -s "$T/ck/step_00000004.safetensors" -a "$(cat "$T/ck/latest" 2>/dev/null)" = step_00000004.safetensors
rm -f "$T/ck/step_00000004.safetensors"
echo step_00000002.safetensors >"$T/ck/latest"
check "resume auto" 0 "resumed from" -- "$W" train --data synthetic "${TINY[@]}" --steps 4 --ckpt-dir "$T/ck" --resume auto --log "$T/b.jsonl"
assert "resumed run continues exactly" python3 -c "
import json
s=[json.loads(l) for l in open('$T/straight.jsonl')]
b=[json.loads(l) for l in open('$T/b.jsonl')]
assert [r['step'] for r in b]==[2,3], b
assert [r['loss'] for r in b]==[r['loss'] for r in s[2:]], (b, s)"
assert "final checkpoints are identical" cmp "$T/ck/step_00000004.safetensors" "$T/ck0/step_00000004.safetensors"
head -c 3000 "$T/ck/step_00000002.safetensors" >"$T/cut.safetensors"
check "truncated checkpoint" 2 "cut.safetensors" -- "$W" train --data synthetic "${TINY[@]}" --resume "$T/cut.safetensors"
check "checkpoint of another model" 2 "not the tiny-llama" -- "$W" train --data synthetic --model tiny-llama --batch 2 --seq 32 --resume "$T/ck/step_00000002.safetensors"
check "resume with another seed warns" 0 "sample order differs" -- "$W" train --data synthetic "${TINY[@]}" --steps 3 --seed 9 --quiet --resume "$T/ck/step_00000002.safetensors"
# the cosine from lr 1e-3 to 1e-4 over 4 steps (no warmup given: the default) has step 2 at 5.5e-4;
# over 8 steps, step 2 is at 8.6e-4
check "resume with a longer --steps says the schedule is re-stretched, with both rates" 0 \
  "schedule differs from the interrupted run's (steps 4 -> 8): from step 2 on it follows the new one, lr 0.000" \
  -- "$W" train --data synthetic "${TINY[@]}" --steps 8 --quiet --resume "$T/ck/step_00000002.safetensors"
"$W" train --data synthetic "${TINY[@]}" --steps 4 --quiet --resume "$T/ck/step_00000002.safetensors" 2>"$T/same.err" >/dev/null
assert "resume with the run's own settings: no schedule warning" eval '! grep -q "schedule differs" "$T/same.err"'
check "resume auto without a checkpoint starts fresh" 0 "step 1/1" -- "$W" train --data synthetic "${TINY[@]}" --steps 1 --ckpt-dir "$T/empty" --resume auto

# Data: text -> shards -> training; a vocabulary too small for the data is refused.
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 200) >"$T/text.txt"
"$B/cephalo" data -o "$T/shards" "$T/text.txt" >/dev/null
check "train on shards" 0 "step 2/2" -- "$W" train "${TINY[@]}" --steps 2 --data "$T/shards"
cat >"$T/small-vocab.yaml" <<'Y'
base: tiny-gpt
name: small-vocab
vocab: 100
Y
check "token beyond the vocabulary" 2 "vocab" -- "$W" train --model "$T/small-vocab.yaml" --batch 2 --seq 32 --steps 1 --data "$T/shards"
check "missing data" 2 "nowhere.bin" -- "$W" train "${TINY[@]}" --steps 1 --data "$T/nowhere.bin"
printf 'junk' >"$T/junk.bin"
check "corrupt shard" 2 "junk.bin" -- "$W" train "${TINY[@]}" --steps 1 --data "$T/junk.bin"
cat >"$T/bad-heads.yaml" <<'Y'
base: tiny-gpt
name: bad-heads
n_head: 5
Y
check "impossible model shape" 2 "n_head" -- "$W" train --data synthetic --model "$T/bad-heads.yaml" --batch 2

# Export with Hugging Face names.
check "export gpt" 0 "model.safetensors" -- "$W" export --checkpoint "$T/ck0/step_00000004.safetensors" -o "$T/hf"
assert "export config" python3 -c "
import json; c=json.load(open('$T/hf/config.json')); assert c['model_type']=='gpt2' and c['n_layer']==2"
check "export of a non-checkpoint" 2 "plan1.json" -- "$W" export --checkpoint "$T/plan1.json" -o "$T/hf2"
check "export of a checkpoint directory follows its latest" 0 "model.safetensors" -- \
  "$W" export --checkpoint "$T/ck0" -o "$T/hf-dir"
assert "... the same file as exporting the checkpoint it names" cmp "$T/hf/model.safetensors" "$T/hf-dir/model.safetensors"
mkdir -p "$T/no-ckpt"
check "export of a directory without checkpoints says what it expected" 2 "no checkpoint in this directory" -- \
  "$W" export --checkpoint "$T/no-ckpt" -o "$T/hf3"
# the weights before step 0: a --steps 0 checkpoint, and a --dump's init.safetensors, export alike
check "--steps 0 writes the initial weights as checkpoint step 0" 0 "step_00000000" -- bash -c \
  "'$W' train --data synthetic ${TINY[*]} --steps 0 --ckpt-dir '$T/ck-init' && ls '$T/ck-init'"
"$W" train --data synthetic "${TINY[@]}" --steps 1 --quiet --dump "$T/dump-init" >/dev/null 2>&1
check "export of a --dump's init.safetensors" 0 "model.safetensors" -- \
  "$W" export --checkpoint "$T/dump-init/init.safetensors" -o "$T/hf-init-dump"
check "export of the step-0 checkpoint" 0 "model.safetensors" -- "$W" export --checkpoint "$T/ck-init" -o "$T/hf-init"
assert "... both the same weights, bit for bit" cmp "$T/hf-init/model.safetensors" "$T/hf-init-dump/model.safetensors"
