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
printf 'nodes:\n  - name: n\n    gpus: [{type: A100-40GB, count: 2}, {type: L4, count: 2}]\n' >"$T/ampere.yaml"
check "bf16 on compute capability 8.0+" 0 "bf16" -- "$BIN" plan --cluster "$T/ampere.yaml" --model llama-3b --batch 64 --precision bf16
check "model file" 0 "my-gpt" -- "$BIN" plan --cluster $A --model examples/models/my-gpt.yaml --batch 32
check "profiled costs" 0 "measured" -- "$BIN" plan --cluster $A --model bert-large --seq 512 --batch 128 --profile examples/profiles/cluster-a-bert-large.json

# bad input: exit 2 with a message naming the problem
check "missing --cluster" 2 "--cluster FILE is required" -- "$BIN" plan --model gpt2-124m --batch 8
check "batch zero" 2 "--batch: '0' is not an integer in [1, 65536]" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 0
check "batch negative" 2 "--batch: '-4'" -- "$BIN" plan --cluster $A --model gpt2-124m --batch -4
check "batch not a number" 2 "--batch: 'lots'" -- "$BIN" plan --cluster $A --model gpt2-124m --batch lots
check "batch < devices" 2 "cannot be split over 8 devices" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 5
check "unknown model" 2 "did you mean 'gpt2-124m'" -- "$BIN" plan --cluster $A --model gpt2-125m --batch 8
check "unknown option" 2 "unknown option '--bacth'" -- "$BIN" plan --cluster $A --model gpt2-124m --bacth 8
check "bad precision names the choices" 2 "--precision: 'fp8' is not fp32, bf16 or fp16" -- "$BIN" plan --cluster $A --model gpt2-124m --batch 8 --precision fp8
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

# precisions a GPU lacks (docs/cost-model.md, "Precision"): bf16 needs compute capability 8.0;
# fp16 runs everywhere (tensor cores from 7.0, Pascal at its fp32 rate)
B=examples/clusters/cluster-b.yaml
prec_of() { # PLAN.json
  python3 -c 'import json, sys; p = json.load(open(sys.argv[1])); print("precision", p["inputs"]["precision"], "feasible", p["feasible"])' "$1"; }
# the optimizer's fast room DPs (slack windows, pruning) against its quadratic reference
# (CEPHALO_PLAN_EXHAUSTIVE_DP=1) on a memory-bound plan where constraint III binds: the same plan
"$BIN" plan --cluster $B --model gpt-6.7b --seq 1024 --mem-cap 0.5 --batch 4096 -o "$T/fast.json" >/dev/null 2>&1
CEPHALO_PLAN_EXHAUSTIVE_DP=1 "$BIN" plan --cluster $B --model gpt-6.7b --seq 1024 --mem-cap 0.5 --batch 4096 -o "$T/ref.json" >/dev/null 2>&1
check "the fast room DP plans what the quadratic reference plans (uneven state, the same JSON)" 0 "same uneven" -- python3 -c '
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
print("same" if a == b else "differ", "uneven" if a["uneven"] else "even")' "$T/fast.json" "$T/ref.json"
"$BIN" plan --cluster $B --model gpt-1.3b --batch 128 --precision fp16 -o "$T/b16.json" >/dev/null 2>&1
check "fp16 on cluster B (V100, T4, A10G): the plan JSON says fp16" 0 "precision fp16 feasible True" -- prec_of "$T/b16.json"
"$BIN" plan --cluster $A --model bert-large --batch 64 --precision fp16 -o "$T/a16.json" >/dev/null 2>&1
check "fp16 on cluster A (P40, P100, L4, A6000): the plan JSON says fp16" 0 "precision fp16 feasible True" -- prec_of "$T/a16.json"
check "fp16 plan table" 0 "batch 128, seq 512, fp16, 64 devices on 8 nodes" -- "$BIN" plan --cluster $B --model gpt-1.3b --batch 128 --precision fp16
check "bf16 on cluster B is refused, naming the GPUs and fp16" 2 \
  "--precision bf16: V100-16GB (compute capability 7.0) and T4 (compute capability 7.5) have no bf16 (it needs compute capability 8.0 or later); use --precision fp16 (tensor cores) or fp32" -- \
  "$BIN" plan --cluster $B --model gpt-1.3b --batch 128 --precision bf16
check "bf16 on cluster A is refused, naming the Pascal GPUs" 2 \
  "--precision bf16: P40 (compute capability 6.1) and P100 (compute capability 6.0) have no bf16" -- \
  "$BIN" plan --cluster $A --model bert-large --batch 64 --precision bf16
check "compare refuses it too" 2 "and T4 (compute capability 7.5) have no bf16" -- "$BIN" compare --cluster $B --model gpt-1.3b --batch 128 --precision bf16
check "fp16 on Pascal: the fp32 rate and half the gathers; L4 and A6000 at their tensor rate" 0 "fp16 ok" -- bash -c "
  '$BIN' plan --cluster $A --model bert-large --batch 64 --precision fp32 --dump-costs '$T/d32.json' >/dev/null &&
  '$BIN' plan --cluster $A --model bert-large --batch 64 --precision fp16 --dump-costs '$T/d16.json' >/dev/null &&
  python3 - '$T/d32.json' '$T/d16.json' <<'PY'
import json, sys
d32, d16 = (json.load(open(f)) for f in sys.argv[1:3])
def fwd(d, dev):  # forward phase of microbatch 4, one microbatch
    g = [g for g in d['groups'] if g['device'] == dev][0]
    return [c[2] for c in g['candidates'] if c[0] == 4 and c[1] == 1][0]
for dev in ('P40', 'P100'):  # no tensor cores: the same compute, only the traffic halves
    assert 0.8 < fwd(d16, dev) / fwd(d32, dev) <= 1, (dev, fwd(d16, dev), fwd(d32, dev))
for dev in ('L4', 'A6000'):  # fp16 tensor cores at twice the TF32 rate
    assert fwd(d16, dev) / fwd(d32, dev) < 0.75, (dev, fwd(d16, dev), fwd(d32, dev))
print('fp16 ok')
PY"
check "models --precision fp16: 16-bit activations" 0 "fp16 activations" -- "$BIN" models gpt2-124m --precision fp16
check "models --precision fp8 names the choices" 2 "--precision: 'fp8' is not fp32, bf16 or fp16" -- "$BIN" models gpt2-124m --precision fp8
check "gpus: compute capability and fp16 column" 0 "T4             Turing    7.5     15.0      8.1        -     65.0        -" -- "$BIN" gpus
printf 'model: tiny-gpt\nbatch: 4\nsteps: 1\nprecision: fp16\ndevices:\n  - {type: cpu, threads: 1, memory: 256M, count: 2}\ndata: synthetic\n' >"$T/fp16-job.yaml"
check "a job file with precision: fp16 plans in fp16" 0 "fp16, 2 devices" -- "$BIN" run "$T/fp16-job.yaml" --dry-run --run-dir "$T/fp16-run"
check "... and the plan it writes says so" 0 '"precision":	"fp16"' -- cat "$T/fp16-run/plan.json"
printf 'model: tiny-gpt\nbatch: 4\nsteps: 1\nprecision: fp8\ndevices:\n  - {type: cpu, threads: 1, memory: 256M}\ndata: synthetic\n' >"$T/fp8-job.yaml"
check "a job file with precision: fp8 is refused, naming the line and the choices" 2 "fp8-job.yaml:4: precision: 'fp8' (expected fp32, bf16 or fp16)" -- \
  "$BIN" run "$T/fp8-job.yaml" --dry-run --run-dir "$T/fp8-run"
check "the gpt-mixed example's pool (L4, A10G, T4) plans in fp16" 0 "fp16, 7 devices on 3 nodes" -- \
  "$BIN" plan --cluster examples/clusters/gpt-mixed.yaml --model gpt2-124m --seq 1024 --batch 64 --precision fp16
check "... and refuses bf16 for its T4" 2 "T4 (compute capability 7.5) has no bf16" -- \
  "$BIN" plan --cluster examples/clusters/gpt-mixed.yaml --model gpt2-124m --seq 1024 --batch 64 --precision bf16

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
