#!/usr/bin/env bash
# CLI tests of `cephalo`: outputs, exit codes (0 feasible, 3 infeasible, 2 bad input) and the
# messages bad input gets. Prints "ok N - name" / "not ok N - name" lines.
set -u
BIN=${BUILD:-build/rel}/bin/cephalo
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
A=examples/clusters/cluster-a.yaml

check "help" 0 "usage: cephalo" -- "$BIN" --help
check "plan --help" 0 "--dump-costs" -- "$BIN" plan --help
check "no command" 2 "usage" -- "$BIN"
check "unknown command" 2 "unknown command 'plam'" -- "$BIN" plam
check "plan table" 0 "predicted:" -- "$BIN" plan --cluster $A --model bert-large --batch 256
check "plan says estimates" 0 "costs: analytic estimates" -- "$BIN" plan --cluster $A --model bert-large --batch 256
check "plan json" 0 '"format":' -- "$BIN" plan --cluster $A --model gpt2-124m --batch 64 --format json
check "plan -o" 0 "" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 64 -o "$T/plan.json"
check "plan file is JSON" 0 "" -- python3 -m json.tool "$T/plan.json"
check "strategy fsdp" 0 "fsdp plan" -- "$BIN" plan --cluster $A --model bert-large --batch 64 --strategy fsdp
check "compare table" 0 "whale" -- "$BIN" compare --cluster $A --model gpt-2.7b --batch 128
check "compare json" 0 '"strategies"' -- "$BIN" compare --cluster $A --model gpt-2.7b --batch 128 --format json
check "models list" 0 "llama-7b" -- "$BIN" models
check "gpus list" 0 "A6000" -- "$BIN" gpus
check "model detail" 0 "block           12         7087872" -- "$BIN" models gpt2-124m
check "model detail unknown" 2 "unknown model 'nope'" -- "$BIN" models nope
check "bf16" 0 "bf16" -- "$BIN" plan --cluster $A --model llama-3b --batch 64 --precision bf16
check "model file" 0 "my-gpt" -- "$BIN" plan --cluster $A --model examples/models/my-gpt.yaml --batch 32
check "profiled costs" 0 "measured" -- "$BIN" plan --cluster $A --model bert-large --seq 512 --batch 128 --profile examples/profiles/cluster-a-bert-large.json

# bad input: exit 2 with a message naming the problem
check "missing --cluster" 2 "--cluster FILE is required" -- "$BIN" plan --model gpt2-124m --batch 8
check "batch zero" 2 "--batch: '0' is not a positive integer" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 0
check "batch negative" 2 "--batch: '-4'" -- "$BIN" plan --cluster $A --model gpt2-124m --batch -4
check "batch not a number" 2 "--batch: 'lots'" -- "$BIN" plan --cluster $A --model gpt2-124m --batch lots
check "batch < devices" 2 "cannot be split over 8 devices" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 5
check "unknown model" 2 "did you mean 'gpt2-124m'" -- "$BIN" plan --cluster $A --model gpt2-125m --batch 8
check "unknown option" 2 "unknown option '--bacth'" -- "$BIN" plan --cluster $A --model gpt2-124m --bacth 8
check "bad precision" 2 "expected fp32 or bf16" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 8 --precision fp16
check "bad mem-cap" 2 "--mem-cap" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 8 --mem-cap 1.5
check "seq too long" 2 "exceeds model gpt2-124m's 1024 learned positions" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 8 --seq 4096
check "missing cluster file" 2 "nope.yaml: cannot open" -- "$BIN" plan --cluster "$T/nope.yaml" --model gpt2-124m --batch 8
printf 'nodes:\n  - name: a\n    gpus: [{type: L5, count: 2}]\n' >"$T/badgpu.yaml"
check "unknown GPU" 2 "badgpu.yaml:3: nodes[0].gpus[0].type: unknown GPU type 'L5' (did you mean 'L4'" -- "$BIN" plan --cluster "$T/badgpu.yaml" --model gpt2-124m --batch 8
printf 'nodes:\n  - name: a\n    gpus: [{type: L4, count: 2}\n' >"$T/broken.yaml"
check "malformed YAML" 2 "broken.yaml:" -- "$BIN" plan --cluster "$T/broken.yaml" --model gpt2-124m --batch 8
printf '{"format": "cephalo-profile", "version": 1, "entries": [}' >"$T/broken.json"
check "malformed profile" 2 "broken.json:1" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 8 --profile "$T/broken.json"
printf 'arch: gpt\nn_layer: 2\nd_model: 66\nn_head: 4\nvocab: 256\nmax_seq: 64\n' >"$T/badmodel.yaml"
check "impossible model" 2 "n_head 4 must divide d_model 66" -- "$BIN" plan --cluster $A --model "$T/badmodel.yaml" --batch 8

# infeasible: exit 3 with how much memory is missing and where
check "state does not fit" 3 "missing in all" -- "$BIN" plan --cluster $A --model llama-7b --batch 64 --mem-cap 0.4
printf 'nodes:\n  - name: small\n    gpus: [{type: T4, count: 1}, {type: P100, count: 1, memory_gib: 2}]\n' >"$T/small.yaml"
check "device too small" 3 "rank 1 (P100 on small): compute memory at microbatch 1" -- "$BIN" plan --cluster "$T/small.yaml" --model gpt2-774m --batch 8
check "compare infeasible" 3 "OOM" -- "$BIN" compare --cluster $A --model llama-7b --batch 64 --mem-cap 0.4

# --dump-costs: the optimum re-checked independently by exhaustive search in Python
printf 'nodes:\n  - name: n\n    gpus: [{type: L4}, {type: P100}, {type: A6000, memory_gib: 10}]\n' >"$T/three.yaml"
for model in gpt2-774m bert-large; do
  "$BIN" plan --cluster "$T/three.yaml" --model $model --batch 12 --seq 512 --dump-costs "$T/costs.json" -o "$T/p.json" >/dev/null 2>&1
  check "dump-costs re-check ($model)" 0 "exhaustive optimum" -- python3 tests/cli/recheck_dump.py "$T/costs.json" "$T/p.json"
done
