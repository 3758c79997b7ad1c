#!/bin/bash
# test_import.sh - `cephalo-worker train --init-from DIR` (docs/import.md): Hugging Face model
# directories built here in Python (tests/ref/hf_models.py) are imported and the worker's step-0
# logits checked against a transformers-style forward on the same files; export then import is
# the identity bit for bit; fine-tuning an imported model on 3 uneven ranks equals 1 rank; a model
# larger than any rank's memory cap loads across ranks; bad directories give clear errors.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
B=${BUILD:-build/rel}
C=$B/bin/cephalo
W=$PWD/$B/bin/cephalo-worker
T=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
PY=/usr/bin/python3 # Debian's, with numpy and torch (the oracle)
HF="$PY tests/ref/hf_models.py"
PT="$PY tests/fsdp/plan_tool.py"
export OMP_NUM_THREADS=1
. tests/cli/ranks.sh

# ---- logits: the worker's step 0 on the imported weights = the oracle's forward on the files ----
# name: hf_models.py arguments (dtype, sharding, architecture features)
declare -A MODELS=(
  [gpt2-f32]="--arch gpt2 --dtype f32"
  [gpt2-bf16-sharded]="--arch gpt2 --dtype bf16 --shards 3 --eps 1e-6"
  [llama-f32-gqa]="--arch llama --dtype f32 --kv 2"
  [llama3-bf16-sharded]="--arch llama --dtype bf16 --kv 1 --rope-theta 500000 --shards 2 --eps 1e-5"
  [llama-f16-tied]="--arch llama --dtype f16 --kv 2 --tied --rope-theta 500000"
  [llama-bf16-untied-mha]="--arch llama --dtype bf16 --shards 4 --ff 160"
)
for name in $(printf '%s\n' "${!MODELS[@]}" | sort); do
  d=$T/$name
  # shellcheck disable=SC2086
  $HF make "$d" ${MODELS[$name]} --seed 3 >/dev/null
  if "$W" train --quiet --init-from "$d" --batch 2 --seq 24 --steps 1 --dump "$d.dump" 2>"$d.err"; then
    n=$((n + 1)); out=$($HF check "$d" "$d.dump" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then echo "ok $n - $name: ${out#ok - }"; else echo "not ok $n - $name: ${out#not ok - }" | head -3; fi
  else
    n=$((n + 1)); echo "not ok $n - $name: the worker fails"; tail -n 3 "$d.err" | sed 's/^/#   /'
  fi
done

# fine-tuning an imported model: the whole oracle (step-0 gradients, 5 AdamW steps; docs/worker-model.md)
# with the fields import brings: rope_theta 500000, a tied Llama head, eps 1e-6
for name in llama-f16-tied gpt2-bf16-sharded; do
  d=$T/$name
  if "$W" train --quiet --init-from "$d" --batch 4 --microbatch 2 --steps 5 --seed 7 --lr 1e-3 --warmup 2 --seq 32 \
      --dump "$d.odump" --log "$d.olog" 2>"$d.oerr"; then
    out=$($PY tests/ref/oracle.py "$d.odump" "$d.olog" 2>&1)
    while IFS= read -r line; do
      case $line in
        "ok - "*) n=$((n + 1)); echo "ok $n - $name (oracle): ${line#ok - }" ;;
        "not ok - "*) n=$((n + 1)); echo "not ok $n - $name (oracle): ${line#not ok - }" ;;
      esac
    done <<<"$out"
    grep -q '^ok - ' <<<"$out" || { n=$((n + 1)); echo "not ok $n - $name: oracle failed"; tail -n 3 <<<"$out" | sed 's/^/#   /'; }
  else
    n=$((n + 1)); echo "not ok $n - $name: the worker fails for the oracle run"; tail -n 3 "$d.oerr" | sed 's/^/#   /'
  fi
done

# the planner reads config.json too
check "cephalo plan --model DIR/config.json (a Llama-3-style import)" 0 "llama3-bf16-sharded" -- \
  $C plan --cluster "$(cluster_of 3)" --model "$T/llama3-bf16-sharded/config.json" --batch 12 -o "$T/p3.json"
check "the plan carries rope_theta, norm_eps and the tied head in its model spec" 0 "" -- $PY -c "
import json; m = json.load(open('$T/p3.json'))['inputs']['model_spec']
assert m['rope_theta'] == 500000 and m['norm_eps'] == 1e-5 and m['n_kv_head'] == 1, m"

# ---- export then import is the identity, bit for bit ----
same_params() { # CKPT_A CKPT_B: every param.* tensor identical in bits
  $PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import st, numpy as np
a, _ = st.read('$1'); b, _ = st.read('$2')
pa = sorted(k for k in a if k.startswith('param.')); pb = sorted(k for k in b if k.startswith('param.'))
assert pa == pb and pa, (pa, pb)
for k in pa:
    assert a[k].dtype == b[k].dtype == np.float32 and a[k].shape == b[k].shape, k
    assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k + ' differs'
"
}
for model in tiny-gpt tiny-llama; do
  "$W" train --quiet --model "$model" --batch 4 --steps 3 --lr 1e-2 --seed 11 --ckpt-dir "$T/orig-$model" 2>/dev/null
  "$W" export --checkpoint "$T/orig-$model" -o "$T/exp-$model" >/dev/null
  "$W" train --quiet --init-from "$T/exp-$model" --batch 4 --steps 0 --ckpt-dir "$T/back-$model" 2>"$T/back-$model.err"
  check "$model: export then --init-from --steps 0 gives the trained parameters bit for bit" 0 "" -- \
    same_params "$T/orig-$model/step_00000003.safetensors" "$T/back-$model/step_00000000.safetensors"
done
# and the other way: Hugging Face f32 files -> import -> export give the same tensors and config
d=$T/rt
$HF make "$d" --arch llama --dtype f32 --kv 2 --tied --rope-theta 500000 --eps 1e-6 --shards 2 --seed 9 >/dev/null
"$W" train --quiet --init-from "$d" --batch 2 --steps 0 --ckpt-dir "$T/rt-ckpt" 2>/dev/null
"$W" export --checkpoint "$T/rt-ckpt" -o "$T/rt-exp" >/dev/null
check "Llama-3-style (tied, GQA, rope_theta 500000) files -> import -> export: same tensors bit for bit, same config" 0 "" -- $PY -c "
import json, sys; sys.path.insert(0, 'tests/ref'); import st, numpy as np
a = {}
for f in ('model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'):
    a.update(st.read('$d/' + f)[0])
b, _ = st.read('$T/rt-exp/model.safetensors')
assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))
for k in a:
    assert np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32)), k
ca, cb = json.load(open('$d/config.json')), json.load(open('$T/rt-exp/config.json'))
for k in ('hidden_size', 'intermediate_size', 'num_attention_heads', 'num_key_value_heads', 'num_hidden_layers',
          'max_position_embeddings', 'vocab_size', 'rms_norm_eps', 'rope_theta', 'tie_word_embeddings'):
    assert ca[k] == cb[k], (k, ca[k], cb[k])
"

# ---- fine-tuning an imported model on 3 uneven ranks = 1 rank ----
TOL=1e-4 # as test_fsdp.sh: fp32, sums in another order, 3 AdamW steps
train_args=(--steps 3 --lr 2e-3 --seed 5)
for name in gpt2-bf16-sharded llama3-bf16-sharded llama-f16-tied; do
  d=$T/$name
  "$W" train --quiet --init-from "$d" --batch 12 --microbatch 4 "${train_args[@]}" --ckpt-dir "$T/ref-$name" 2>"$T/ref-$name.err"
  $C plan --cluster "$(cluster_of 3)" --model "$d/config.json" --batch 12 -o "$T/base-$name.json" >/dev/null
  $PT rewrite "$T/base-$name.json" "$T/p-$name.json" --ranks 5:1,3:3,4:2 --shards random --seed 3
  out=$T/run-$name
  if run_ranks "$T/p-$name.json" "$out" "${train_args[@]}" --init-from "$d" --ckpt-dir "$out/ckpt"; then
    check "$name: fine-tuned on 3 ranks (5:1,3:3,4:2, random shards) = 1 rank" 0 "" \
      -- $PT compare "$out/ckpt/step_00000003" "$T/ref-$name/step_00000003.safetensors" --tol $TOL
  else
    n=$((n + 1)); echo "not ok $n - $name on 3 ranks trains"; tail -n 3 "$out"/rank*.err | sed 's/^/#   /'
  fi
done

# ---- a model larger than any rank's memory: 14.7 M parameters (58.8 MB in fp32) on 8 ranks of
# 51.2 MiB (53.7 MB) each; every rank reads only its slices of the 4 bf16 shards ----
d=$T/big
$HF make "$d" --arch llama --layers 24 --d 256 --heads 4 --kv 2 --ff 512 --vocab 1024 --dtype bf16 --shards 4 --std 0.05 >/dev/null
printf 'nodes:\n  - name: local\n    gpus:\n      - {type: cpu, count: 8, threads: 1, memory_gib: 0.05}\n' >"$T/c8.yaml"
$C plan --cluster "$T/c8.yaml" --model "$d/config.json" --batch 8 --seq 16 -o "$T/pbig.json" >/dev/null
if run_ranks "$T/pbig.json" "$T/bigrun" --steps 1 --init-from "$d"; then
  check "8 ranks load a model larger than each one's memory cap: peak_bytes (= the plan's prediction) < cap < the model's fp32 bytes" 0 "" -- $PY -c "
import json
plan = json.load(open('$T/pbig.json'))
spec, params = plan['inputs']['model_spec'], 0
for r, rk in enumerate(plan['ranks']):
    peak = json.loads(open('$T/bigrun/rank%d.jsonl' % r).readlines()[-1])['peak_bytes']
    cap = rk['memory_bytes']
    assert 0 < peak < cap, (r, peak, cap)
    assert peak == rk['predicted']['peak_bytes'], (r, peak, rk['predicted']['peak_bytes'])
d, L, V, ff, kv = spec['d_model'], spec['n_layer'], spec['vocab'], spec['d_ff'], spec['n_kv_head'] * spec['d_model'] // spec['n_head']
params = V * d * 2 + d + L * (2 * d * d + 2 * d * kv + 3 * d * ff + 2 * d)
assert 4 * params > max(rk['memory_bytes'] for rk in plan['ranks']), (params, 'the model fits one rank')
"
  # host memory: reading only its slices, a rank's peak RSS grows by less than the files' size (the
  # whole model even in bf16) over the same plan's seeded start (measured: 7-10 MB of 29 MB)
  if run_ranks "$T/pbig.json" "$T/bigseed" --steps 1; then
    check "... and each rank's peak RSS grows by less than the whole model's bf16 files over a seeded start" 0 "" -- $PY -c "
import glob, json, os
files = sum(os.path.getsize(f) for f in glob.glob('$d/*.safetensors'))
for r in range(8):
    a = json.loads(open('$T/bigrun/rank%d.jsonl' % r).readline())['rss_peak_bytes']
    b = json.loads(open('$T/bigseed/rank%d.jsonl' % r).readline())['rss_peak_bytes']
    assert a - b < files, (r, a, b, files)
"
  fi
  "$W" train --quiet --init-from "$d" --batch 8 --seq 16 --steps 1 --log "$T/big1.jsonl" 2>/dev/null
  check "... and its first loss equals one unlimited rank's" 0 "" -- $PY -c "
import json
a = json.loads(open('$T/bigrun/rank0.jsonl').readlines()[0])['loss']
b = json.loads(open('$T/big1.jsonl').readlines()[0])['loss']
assert abs(a - b) <= 1e-6 * abs(b), (a, b)"
else
  n=$((n + 1)); echo "not ok $n - 8 ranks load a model larger than each one's memory"; tail -n 3 "$T/bigrun"/rank*.err | sed 's/^/#   /'
fi

# ---- job files: init_from (relative to the job file) gives the model and every worker's --init-from ----
mkdir -p "$T/jobs"
cp -r "$T/llama-f16-tied" "$T/jobs/hf"
printf 'init_from: hf\nbatch: 6\nsteps: 2\nseq: 16\ndevices:\n  - {type: cpu, threads: 1, memory: 256M, count: 2}\n' >"$T/jobs/ft.yaml"
check "a job with init_from (no model): the workers get --init-from" 0 "--init-from $T/jobs/hf" \
  -- $C run "$T/jobs/ft.yaml" --dry-run --run-dir "$T/jobs/r-dry"
check "... and it trains" 0 "" -- $C run "$T/jobs/ft.yaml" --run-dir "$T/jobs/r"
printf 'model: tiny-gpt\n' | cat - "$T/jobs/ft.yaml" >"$T/jobs/other.yaml"
check "a job whose model is not init_from's: the workers refuse" 1 "describes another model" \
  -- $C run "$T/jobs/other.yaml" --run-dir "$T/jobs/r-other"

# ---- errors name the file, the tensor and what was expected ----
bad=$T/bad
cp -r "$T/llama-f32-gqa" "$bad"
$PY - "$bad" <<'EOF'
import json, sys
sys.path.insert(0, "tests/ref")
import hf_models, st
d = sys.argv[1]
W, _ = st.read(d + "/model.safetensors")
W["model.layers.1.self_attn.k_proj.weight"] = W["model.layers.1.self_attn.k_proj.weight"][:16]
hf_models.write_st(d + "/model.safetensors", W, "f32")
EOF
check "a tensor of the wrong shape: named, with both shapes" 2 \
  "model.safetensors: tensor 'model.layers.1.self_attn.k_proj.weight': expected shape [32, 64] (from config.json), found [16, 64]" \
  -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
rm -rf "$bad" && cp -r "$T/gpt2-f32" "$bad"
$PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import hf_models, st
W, _ = st.read('$bad/model.safetensors'); del W['transformer.h.1.mlp.c_fc.bias']
hf_models.write_st('$bad/model.safetensors', W, 'f32')"
check "a missing tensor: named" 2 "tensor 'transformer.h.1.mlp.c_fc.bias' not found" \
  -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
rm -f "$bad/model.safetensors"
check "no weights at all" 2 "no model.safetensors or model.safetensors.index.json" \
  -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
rm -rf "$bad" && cp -r "$T/llama3-bf16-sharded" "$bad" && rm "$bad/model-00002-of-00002.safetensors"
check "a shard the index lists is missing" 2 "model-00002-of-00002.safetensors" \
  -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
echo '{"metadata": {}}' >"$bad/model.safetensors.index.json"
check "an index without weight_map" 2 "model.safetensors.index.json: missing field 'weight_map'" \
  -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
echo '{"weight_map": {"lm_head.weight": "../model.safetensors"}}' >"$bad/model.safetensors.index.json"
check "an index naming a file outside the directory" 2 "weight_map.lm_head.weight: \"../model.safetensors\" is not a file name in the model directory" \
  -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
cfg() { # DIR PYTHON-STATEMENT: edits DIR/config.json (as c)
  $PY -c "import json; c = json.load(open('$1/config.json')); $2; json.dump(c, open('$1/config.json', 'w'))"
}
rm -rf "$bad" && cp -r "$T/llama-f32-gqa" "$bad"
cfg "$bad" "c['rope_scaling'] = {'rope_type': 'llama3', 'factor': 8.0}"
check "rope_scaling is refused, not ignored" 2 "rope_scaling is set" -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
cfg "$bad" "c['rope_scaling'] = None; c['architectures'] = ['MistralForCausalLM']"
check "an architecture we do not implement" 2 "architecture 'MistralForCausalLM' cannot be imported" \
  -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
cfg "$bad" "c['architectures'] = ['LlamaForCausalLM']; del c['hidden_size']"
check "a missing config field" 2 "config.json: missing field 'hidden_size'" \
  -- "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
check "--model must be the model config.json describes: the fields that differ, both values" 2 \
  "config.json describes another model than the tiny-llama being trained (the plan's or --model's): n_kv_head 1 vs 2" \
  -- "$W" train --quiet --model tiny-llama --init-from "$T/llama3-bf16-sharded" --batch 2 --steps 1
check "a checkpoint directory is no Hugging Face model" 2 "orig-tiny-gpt/config.json: cannot open" \
  -- "$W" train --quiet --init-from "$T/orig-tiny-gpt" --batch 2 --steps 1
check "cephalo plan --model DIR/config.json with a bad config names the field" 2 "config.json: missing field 'hidden_size'" \
  -- $C plan --cluster "$(cluster_of 2)" --model "$bad/config.json" --batch 4

echo "# $n checks"
