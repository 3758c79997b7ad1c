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

cat <<'MSG'

The costs above are analytic estimates from the GPU catalog unless a profile is given. Later
milestones turn this demo into real training on an emulated heterogeneous cluster.
MSG
