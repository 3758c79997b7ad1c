#!/usr/bin/env bash
# `make demo`: the planner on the Cephalo paper's Cluster A (2 nodes: 2xL4 + A6000 + P40,
# 2xP40 + 2xP100, 50 Gbps): a plan table, then every strategy side by side for a few models.
set -euo pipefail
BIN=${BUILD:-build/rel}/bin/cephalo
A=examples/clusters/cluster-a.yaml
rule() { printf '\n== %s ==\n' "$*"; }

rule "cluster ($A)"
grep -v '^#' "$A"

rule "cephalo plan --cluster $A --model llama-3b --batch 256"
"$BIN" plan --cluster "$A" --model llama-3b --batch 256

for model in bert-large gpt-2.7b llama-3b vit-g; do
  rule "cephalo compare --cluster $A --model $model --batch 256"
  "$BIN" compare --cluster "$A" --model "$model" --batch 256 || true
done

rule "with measured costs: cephalo plan ... --model bert-large --profile examples/profiles/cluster-a-bert-large.json"
"$BIN" plan --cluster "$A" --model bert-large --batch 256 --profile examples/profiles/cluster-a-bert-large.json

# Training, one rank on this CPU: the project's own docs as a byte-level corpus, a small GPT
# planned on one emulated CPU device, 60 steps with the layered microbatch order.
WORKER=${BUILD:-build/rel}/bin/cephalo-worker
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
cat >"$D/one-cpu.yaml" <<'Y'
nodes:
  - name: local
    gpus: [{type: cpu, count: 1, threads: 2, memory_gib: 1}]
Y
rule "cephalo data + cephalo-worker train: tiny-gpt on this repository's docs, one CPU rank"
"$BIN" data -o "$D/shards" README.md docs/*.md
"$BIN" plan --cluster "$D/one-cpu.yaml" --model tiny-gpt --batch 16 --seq 128 -o "$D/plan.json"
CEPHALO_PLAN="$D/plan.json" RANK=0 WORLD_SIZE=1 "$WORKER" train --data "$D/shards/train_*.bin" \
  --steps 60 --lr 3e-3 --warmup 5 --log "$D/train.jsonl"

cat <<'MSG'

The costs above are analytic estimates from the GPU catalog unless a profile is given. The
training ran one rank; the next milestone trains across emulated heterogeneous CPU devices with
uneven FSDP shards.
MSG
