#!/usr/bin/env bash
# CLI tests of `cephalo profile` (docs/profile.md): a quick profile of tiny-gpt on two CPU
# devices parses with the planner's loader, has increasing microbatches, compute memory equal to
# planner/engine_mem.c's formula (fp32, sharded rank), collectives for the world; progress lines;
# the store merge replaces and keeps entries; plans with the profile (or the store) say
# "measured"; another model's profile and a stale version are refused.
set -u
B=${BUILD:-build/rel}/bin
C=$B/cephalo
W=$B/cephalo-worker
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
unset CEPHALO_WORKER
export OMP_WAIT_POLICY=PASSIVE CEPHALO_PROFILE_STORE=$T/store.json

cat >"$T/c2.yaml" <<'YAML'
nodes:
  - name: local
    network_gbps: 100
    gpus: [{type: cpu, count: 2, threads: 1, memory_gib: 0.5}]
YAML

check "help" 0 "usage: cephalo profile" -- "$C" profile --help
check "listed in cephalo --help" 0 "profile   measure the cost model" -- "$C" --help
check "no --devices" 2 "--devices is required" -- "$C" profile --model tiny-gpt
check "bad model" 2 "--model" -- "$C" profile --devices cpu:1t:256M --model nope
check "worker: needs -o" 2 "-o FILE is required" -- "$W" profile --model tiny-gpt

check "profile tiny-gpt on 2 devices, with progress" 0 "[1/4] microbatch 1: block fwd" -- \
  "$C" profile --devices cpu:1t:512M,cpu:1t:512M --model tiny-gpt --max-micro 4 --quick -o "$T/p.json"
check "progress names the collectives" 0 "collectives over 2 ranks" -- \
  "$C" profile --devices cpu:1t:512Mx2 --model tiny-gpt --max-micro 2 --quick -o "$T/p2.json"
check "an fp16 profile: entries say fp16 and plan fp16 jobs as measured" 0 "" -- bash -c "
  CEPHALO_PROFILE_STORE=none '$C' profile --devices cpu:1t:512Mx2 --model tiny-gpt --max-micro 2 --quick --precision fp16 -o '$T/p16.json' 2>/dev/null &&
  python3 -c \"import json; p = json.load(open('$T/p16.json')); assert {e['precision'] for e in p['entries']} == {'fp16'}, p['entries']\" &&
  '$C' plan --cluster '$T/c2.yaml' --model tiny-gpt --batch 8 --precision fp16 --profile '$T/p16.json' | grep -q 'fp16, 2 devices on 1 nodes; costs: profiled'"
check "worker profile: --precision fp8 is refused" 2 "--precision: 'fp8' is not fp32, bf16 or fp16" -- \
  "$W" profile --model tiny-gpt --precision fp8 -o "$T/x.json"
# the step check: a short real training run against the plan made from the fresh profile
"$C" profile --devices cpu:1t:512Mx2 --model tiny-gpt --max-micro 2 --quick -o "$T/p3.json" 2>"$T/p3.err"
check "the step check trains on the devices at two batches and compares with the predictions" 0 "" -- \
  bash -c "grep -q '\[3/3\] step check: 8 training steps at batch 2 and 8 on the 2 devices, twice each' '$T/p3.err' && grep -qE 'step check: measured [0-9.]+ and [0-9.]+ ms per step \(runs: [0-9.]+, [0-9.]+ and [0-9.]+, [0-9.]+\) against [0-9.]+ and [0-9.]+ predicted: times scaled by [0-9.]+, [0-9.]+ ms added per step' '$T/p3.err'"
check "the step check: each batch's measured time is the faster of its two runs" 0 "" -- python3 -c "
import re
m = re.search(r'measured ([0-9.]+) and ([0-9.]+) ms per step \(runs: ([0-9.]+), ([0-9.]+) and ([0-9.]+), ([0-9.]+)\)', open('$T/p3.err').read())
small, large, s1, s2, l1, l2 = map(float, m.groups())
assert small == min(s1, s2) and large == min(l1, l2), m.group(0)
"
check "--check-batch: the step check's larger batch" 0 "step check: 8 training steps at batch 2 and 6 on the 2 devices" -- \
  "$C" profile --devices cpu:1t:512Mx2 --model tiny-gpt --max-micro 2 --quick --check-batch 6 -o "$T/p4.json"
check "--check-batch not above the device count is refused" 2 "--check-batch 2: expected more than the 2 devices" -- \
  "$C" profile --devices cpu:1t:512Mx2 --model tiny-gpt --check-batch 2 -o "$T/p5.json"
check "... and records the line through both on every entry (measured = overhead + scale x predicted)" 0 "" -- python3 -c "
import json, re
p = json.load(open('$T/p3.json'))
g = re.search(r'measured ([0-9.]+) and ([0-9.]+) ms per step \(runs: [^)]*\) against ([0-9.]+) and ([0-9.]+) predicted: times scaled by ([0-9.]+), ([0-9.]+) ms added', open('$T/p3.err').read())
m0, m1, p0, p1, scale, over = map(float, g.groups())
for e in p['entries']:
    assert abs(e['step_scale'] - scale) < 1e-3 and abs(e['step_overhead_ms'] - over) < 1e-2, e
    assert 0.1 <= scale <= 10 and over >= 0
    # the line passes through the larger batch's point (the overhead is fitted to it)
    assert abs(over + e['step_scale'] * p1 - m1) < 0.02 * m1 + 0.02, (over, scale, p1, m1)
assert all('train_overhead_ms' not in c for c in p['comm'])
"

n=$((n + 1))
if python3 - "$T/p.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
assert p["format"] == "cephalo-profile" and p["version"] == 2
e = p["entries"][0]
assert e["device"] == "cpu-1t" and e["model"] == "tiny-gpt" and e["seq"] == 64, e
mb = e["microbatch"]
assert mb == sorted(set(mb)) and mb[0] == 1 and len(mb) == 4, mb
for k in ("block", "embedding", "head"):
    assert all(x > 0 for x in e[k]["fwd_ms"] + e[k]["bwd_ms"]), k
# version 2: the backward phases of recompute none, measured without the second forward
for k in ("block", "embedding"):
    assert len(e[k]["bwd_keep_ms"]) == len(mb) and all(x > 0 for x in e[k]["bwd_keep_ms"]), k
assert "bwd_keep_ms" not in e["head"]
# planner/engine_mem.c, fp32, a sharded rank on the CPU (tiny-gpt: d 64, 4 heads, d_ff 256, V 256, T 64)
d, ff, V, T, h = 64, 256, 256, 64, 4
slot = max(V * d + T * d, 4 * d * d + 4 * d + 2 * d * ff + ff + d + 4 * d)
for m, got in zip(mb, e["compute_bytes"]):
    N = m * T
    # the head's logits and row losses: the whole microbatch (far below the 256 MiB cap)
    ws = 7 * N * d + 2 * N * 3 * d + 4 * N * ff + 4 * N + m * h * T + N * V + N
    # + the step's loss and squared norm (2 doubles)
    want = ws * 4 + 4 * N * d * 4 + 2 * N * 4 + 4 * slot * 4 + 16
    assert got == want, (m, got, want)
ops = sorted((c["world"], c["op"]) for c in p["comm"])
assert ops == [(2, "allgather"), (2, "reduce_scatter")], ops
for c in p["comm"]:
    assert len(c["bytes"]) == len(c["ms"]) == len(c["uneven_ms"]) >= 2
PY
then echo "ok $n - the profile: microbatches, compute memory = engine_mem, collectives"; else echo "not ok $n - the profile's contents"; fi

check "plan with --profile says measured" 0 "measured" -- \
  "$C" plan --cluster "$T/c2.yaml" --model tiny-gpt --batch 8 --profile "$T/p.json"
check "plan notes the profile used" 0 "costs from --profile $T/p.json: measured for 1 of 1 device group, collectives measured" -- \
  "$C" plan --cluster "$T/c2.yaml" --model tiny-gpt --batch 8 --profile "$T/p.json"
check "plan JSON: ranks measured" 0 '"measured":	true' -- \
  "$C" plan --cluster "$T/c2.yaml" --model tiny-gpt --batch 8 --profile "$T/p.json" --format json
check "plan uses the store" 0 "costs from the profile store $T/store.json" -- \
  "$C" plan --cluster "$T/c2.yaml" --model tiny-gpt --batch 8
check "store without the model: estimates" 0 "estimated" -- \
  "$C" plan --cluster "$T/c2.yaml" --model tiny-llama --batch 8
check "another model's profile is refused" 2 "has no entry for model tiny-llama (it has: tiny-gpt)" -- \
  "$C" plan --cluster "$T/c2.yaml" --model tiny-llama --batch 8 --profile "$T/p.json"
sed 's/"version":\t2/"version":\t7/' "$T/p.json" >"$T/stale.json"
check "stale version is refused" 2 "stale.json: version 7 is not supported (this build reads versions 1 to 2)" -- \
  "$C" plan --cluster "$T/c2.yaml" --model tiny-gpt --batch 8 --profile "$T/stale.json"
sed 's/"cephalo-profile"/"something-else"/' "$T/p.json" >"$T/other.json"
check "another format is refused" 2 "other.json: format: expected \"cephalo-profile\"" -- \
  "$C" plan --cluster "$T/c2.yaml" --model tiny-gpt --batch 8 --profile "$T/other.json"

# the store: tiny-llama added, tiny-gpt replaced, nothing lost
check "store: a second model" 0 "merged into the profile store" -- \
  "$C" profile --devices cpu:1t:256M --model tiny-llama --max-micro 2 --quick
check "store: re-profile replaces" 0 "replaced" -- \
  "$C" profile --devices cpu:1t:256M --model tiny-gpt --max-micro 2 --quick
n=$((n + 1))
if python3 - "$T/store.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
keys = sorted((e["device"], e["model"]) for e in p["entries"])
assert keys == [("cpu-1t", "tiny-gpt"), ("cpu-1t", "tiny-llama")], keys
g = [e for e in p["entries"] if e["model"] == "tiny-gpt"][0]
assert g["microbatch"] == [1, 2], g["microbatch"]   # the re-profile's entry
assert len(p["comm"]) == 2                            # the 2-rank collectives kept
PY
then echo "ok $n - the store keeps one entry per device type and model"; else echo "not ok $n - the store's contents"; fi
check "--store none and no -o: nothing to write" 2 "nothing to write" -- \
  "$C" profile --devices cpu:1t:256M --model tiny-gpt --store none
echo "1..$n"
