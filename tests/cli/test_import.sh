#!/bin/bash
# test_import.sh - `cephalo-worker train --data synthetic --init-from DIR` (docs/import.md): Hugging Face model
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
  # Llama-3.1/3.2's rope_scaling, scaled down: with hd 16 and original 32 positions the 8
  # frequencies fall in all three of its bands (kept, blended, divided by the factor)
  [llama31-bf16-rope-llama3]="--arch llama --dtype bf16 --kv 2 --rope-theta 10000 --rope-scaling llama3 --factor 8 --orig 32"
  [llama-rope-linear]="--arch llama --dtype f32 --kv 2 --rope-scaling linear --factor 4"
  [mistral-window]="--arch mistral --dtype bf16 --kv 1 --window 64"
  [qwen2-bf16-tied]="--arch qwen2 --dtype bf16 --kv 2 --tied --rope-theta 1000000 --eps 1e-6"
  [qwen2-f32-sharded-llama3]="--arch qwen2 --dtype f32 --kv 1 --shards 3 --rope-scaling llama3 --orig 64"
  # torch.save's pytorch_model.bin (strided and offset views among its tensors), one file or sharded
  [llama-bin-bf16]="--arch llama --dtype bf16 --kv 2 --format bin"
  [qwen2-bin-f16-sharded]="--arch qwen2 --dtype f16 --kv 2 --shards 3 --format bin --rope-scaling linear --factor 2"
  [gpt2-bin-f32]="--arch gpt2 --dtype f32 --format bin"
)
# under the sanitizers one model of each architecture and file format (tests/cli/lib.sh, SAN_LIGHT)
SAN_IMPORTS="gpt2-bf16-sharded llama-f16-tied llama-rope-linear llama31-bf16-rope-llama3 mistral-window qwen2-bin-f16-sharded"
for name in $(printf '%s\n' "${!MODELS[@]}" | sort); do
  d=$T/$name
  # shellcheck disable=SC2086
  $HF make "$d" ${MODELS[$name]} --seed 3 >/dev/null
  san_skip "$name" $SAN_IMPORTS && continue
  if "$W" train --data synthetic --quiet --init-from "$d" --batch 2 --seq 24 --steps 1 --dump "$d.dump" 2>"$d.err"; then
    n=$((n + 1)); out=$($HF check "$d" "$d.dump" 2>&1); rc=$?
    if [ $rc -eq 0 ]; then echo "ok $n - $name: ${out#ok - }"; else echo "not ok $n - $name: ${out#not ok - }" | head -3; fi
  else
    n=$((n + 1)); echo "not ok $n - $name: the worker fails"; tail -n 3 "$d.err" | sed 's/^/#   /'
  fi
done

# fine-tuning an imported model: the whole oracle (step-0 gradients, 5 AdamW steps; docs/worker-model.md)
# with the fields import brings: rope_theta 500000, a tied Llama head, eps 1e-6
# and the Llama relatives: q/k/v biases (Qwen2) get their gradients, scaled RoPE its backward
for name in llama-f16-tied gpt2-bf16-sharded qwen2-bf16-tied llama31-bf16-rope-llama3 mistral-window; do
  san_skip "$name" qwen2-bf16-tied llama31-bf16-rope-llama3 && continue # biases; scaled RoPE's backward
  d=$T/$name
  if "$W" train --data synthetic --quiet --init-from "$d" --batch 4 --microbatch 2 --steps 5 --seed 7 --lr 1e-3 --warmup 2 --seq 32 \
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
$C plan --cluster "$(cluster_of 3)" --model "$T/qwen2-f32-sharded-llama3/config.json" --batch 12 -o "$T/pq.json" >/dev/null
check "... and Qwen2's q/k/v biases and the llama3 rope_scaling, with the parameter count the worker lays out" 0 "" -- $PY -c "
import json; p = json.load(open('$T/pq.json')); m = p['inputs']['model_spec']
assert m['qkv_bias'] is True and m['rope_scaling'] == {'rope_type': 'llama3', 'factor': 8, 'low_freq_factor': 1,
       'high_freq_factor': 4, 'original_max_position_embeddings': 64}, m
d, L, V, ff, kv = m['d_model'], m['n_layer'], m['vocab'], m['d_ff'], m['n_kv_head'] * m['d_model'] // m['n_head']
want = V * d + L * (2 * d * d + 2 * d * kv + d + 2 * kv + 3 * d * ff + 2 * d) + d + V * d
got = sum(u['numel'] for u in p['units'])
assert got == want, (got, want)"

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
  "$W" train --data synthetic --quiet --model "$model" --batch 4 --steps 3 --lr 1e-2 --seed 11 --ckpt-dir "$T/orig-$model" 2>/dev/null
  "$W" export --checkpoint "$T/orig-$model" -o "$T/exp-$model" >/dev/null
  "$W" train --data synthetic --quiet --init-from "$T/exp-$model" --batch 4 --steps 0 --ckpt-dir "$T/back-$model" 2>"$T/back-$model.err"
  check "$model: export then --init-from --steps 0 gives the trained parameters bit for bit" 0 "" -- \
    same_params "$T/orig-$model/step_00000003.safetensors" "$T/back-$model/step_00000000.safetensors"
done
# and the other way: Hugging Face f32 files -> import -> export give the same tensors and config
d=$T/rt
$HF make "$d" --arch llama --dtype f32 --kv 2 --tied --rope-theta 500000 --eps 1e-6 --shards 2 --seed 9 >/dev/null
"$W" train --data synthetic --quiet --init-from "$d" --batch 2 --steps 0 --ckpt-dir "$T/rt-ckpt" 2>/dev/null
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

# Qwen2 (biases, llama3 rope_scaling, sharded) and Mistral (a window) the same way: the config keys
# that make them what they are come back too
for name_dtype in qwen2-f32-sharded-llama3:float32 mistral-window:bfloat16; do
  name=${name_dtype%:*} d=$T/${name_dtype%:*}
  "$W" train --data synthetic --quiet --init-from "$d" --batch 2 --steps 0 --ckpt-dir "$T/rt-$name" 2>/dev/null
  "$W" export --checkpoint "$T/rt-$name" -o "$T/rt-$name-exp" --dtype "${name_dtype#*:}" >/dev/null 2>&1
  check "$name files -> import -> export: same tensors bit for bit, same config keys" 0 "" -- $PY -c "
import glob, json, os, sys; sys.path.insert(0, 'tests/ref'); import st, numpy as np
a = {}
for f in glob.glob('$d/*.safetensors'):
    a.update(st.read(f)[0])
b, _ = st.read('$T/rt-$name-exp/model.safetensors')
assert sorted(a) == sorted(b), (sorted(set(a) ^ set(b)))
for k in a:
    assert a[k].dtype == b[k].dtype and np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), k
ca, cb = json.load(open('$d/config.json')), json.load(open('$T/rt-$name-exp/config.json'))
for k in ('architectures', 'model_type', 'hidden_size', 'num_key_value_heads', 'rope_theta', 'rope_scaling',
          'tie_word_embeddings', 'sliding_window' if ca['model_type'] == 'mistral' else 'use_sliding_window'):
    assert ca[k] == cb[k], (k, ca[k], cb[k])
"
  check "... and the export is a directory transformers loads (check_hf_dir.py)" 0 "" \
    -- $PY tests/ref/check_hf_dir.py "$T/rt-$name-exp" --no-tokenizer
done

# pytorch_model.bin holds the same values as model.safetensors: the same model made in both
# formats imports to the same parameters bit for bit (strided and offset views included)
for fmt in safetensors bin; do
  $HF make "$T/both-$fmt" --arch qwen2 --dtype bf16 --kv 2 --shards 2 --seed 12 --format $fmt >/dev/null
  "$W" train --data synthetic --quiet --init-from "$T/both-$fmt" --batch 2 --steps 0 --ckpt-dir "$T/both-$fmt-ck" 2>/dev/null
done
check "pytorch_model-*.bin import = model-*.safetensors import, bit for bit" 0 "" -- \
  same_params "$T/both-safetensors-ck/step_00000000.safetensors" "$T/both-bin-ck/step_00000000.safetensors"
# more than 65535 entries: torch.save writes the zip64 end-of-directory record, which is read
mkdir -p "$T/z64" && cp "$T/llama-bin-bf16/config.json" "$T/z64/"
$PY -c "
import torch
sd = torch.load('$T/llama-bin-bf16/pytorch_model.bin')
for i in range(66000):
    sd['extra.%d' % i] = torch.zeros(1)
torch.save(sd, '$T/z64/pytorch_model.bin')"
check "a pytorch_model.bin of 66,023 zip entries (zip64): every tensor read, the 66,000 extra ones named" 0 \
  "pytorch_model.bin: --allow-unused-weights: 66000 tensors the model does not use left out" \
  -- "$W" train --data synthetic --init-from "$T/z64" --batch 2 --steps 1 --allow-unused-weights
# both in one directory: safetensors is read (as transformers prefers it); the .bin is not opened
cp "$T/both-bin"/pytorch_model* "$T/both-safetensors/" && echo garbage >"$T/both-safetensors/pytorch_model-00001-of-00002.bin"
check "safetensors and .bin side by side: the safetensors are read" 0 "" \
  -- "$W" train --data synthetic --quiet --init-from "$T/both-safetensors" --batch 2 --steps 1

# ---- fine-tuning an imported model on 3 uneven ranks = 1 rank ----
# as test_fsdp.sh: fp32, sums in another order (params_agree, tests/cli/lib.sh)
train_args=(--steps 3 --lr 2e-3 --seed 5)
for name in gpt2-bf16-sharded llama3-bf16-sharded llama-f16-tied qwen2-f32-sharded-llama3; do
  san_skip "$name" llama3-bf16-sharded && continue
  d=$T/$name
  "$W" train --data synthetic --quiet --init-from "$d" --batch 12 --microbatch 4 "${train_args[@]}" --ckpt-dir "$T/ref-$name" 2>"$T/ref-$name.err"
  $C plan --cluster "$(cluster_of 3)" --model "$d/config.json" --batch 12 -o "$T/base-$name.json" >/dev/null
  $PT rewrite "$T/base-$name.json" "$T/p-$name.json" --ranks 5:1,3:3,4:2 --shards random --seed 3
  out=$T/run-$name
  if run_ranks "$T/p-$name.json" "$out" "${train_args[@]}" --init-from "$d" --ckpt-dir "$out/ckpt"; then
    check "$name: fine-tuned on 3 ranks (5:1,3:3,4:2, random shards) = 1 rank" 0 "" \
      -- params_agree "$out/ckpt/step_00000003" "$T/ref-$name/step_00000003.safetensors" 2e-3 3
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
  "$W" train --data synthetic --quiet --init-from "$d" --batch 8 --seq 16 --steps 1 --log "$T/big1.jsonl" 2>/dev/null
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
printf 'init_from: hf\nbatch: 6\nsteps: 2\nseq: 16\ndevices:\n  - {type: cpu, threads: 1, memory: 256M, count: 2}\ndata: synthetic\n' >"$T/jobs/ft.yaml"
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
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
rm -rf "$bad" && cp -r "$T/gpt2-f32" "$bad"
$PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import hf_models, st
W, _ = st.read('$bad/model.safetensors'); del W['transformer.h.1.mlp.c_fc.bias']
hf_models.write_st('$bad/model.safetensors', W, 'f32')"
check "a missing tensor: named" 2 "tensor 'transformer.h.1.mlp.c_fc.bias' not found" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
rm -f "$bad/model.safetensors"
check "no weights at all" 2 "no model.safetensors, model.safetensors.index.json, pytorch_model.bin or pytorch_model.bin.index.json" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
rm -rf "$bad" && cp -r "$T/llama3-bf16-sharded" "$bad" && rm "$bad/model-00002-of-00002.safetensors"
check "a shard the index lists is missing" 2 "model-00002-of-00002.safetensors" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
echo '{"metadata": {}}' >"$bad/model.safetensors.index.json"
check "an index without weight_map" 2 "model.safetensors.index.json: missing field 'weight_map'" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
echo '{"weight_map": {"lm_head.weight": "../model.safetensors"}}' >"$bad/model.safetensors.index.json"
check "an index naming a file outside the directory" 2 "weight_map.lm_head.weight: \"../model.safetensors\" is not a file name in the model directory" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
# pytorch_model.bin: only torch.save's state-dict pickles are read, and nothing in them is run
rm -rf "$bad" && mkdir -p "$bad" && cp "$T/llama-bin-bf16/config.json" "$bad/"
$PY -c "
import zipfile
z = zipfile.ZipFile('$bad/pytorch_model.bin', 'w', zipfile.ZIP_STORED)
z.writestr('archive/data.pkl', b'\\x80\\x02cos\\nsystem\\nq\\x00X\\x04\\x00\\x00\\x00echoq\\x01\\x85R.')
z.close()"
check "a pickle calling os.system is refused, naming the global and its byte, and not run" 2 \
  "pytorch_model.bin: data.pkl: global 'os.system' at byte 2 is not one a state dict holds: the reader runs no code" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
$PY -c "
import zipfile
z = zipfile.ZipFile('$bad/pytorch_model.bin', 'w', zipfile.ZIP_STORED)
z.writestr('archive/data.pkl', b'\\x80\\x02]q\\x00.')
z.close()"
check "an opcode torch.save does not write for a state dict (EMPTY_LIST) is refused" 2 \
  "data.pkl: opcode 0x5d (']'), not one torch.save writes for a state dict at byte 2" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
head -c 3000 "$T/llama-bin-bf16/pytorch_model.bin" >"$bad/pytorch_model.bin"
check "a truncated pytorch_model.bin" 2 "pytorch_model.bin: no end-of-central-directory record (a corrupt or truncated torch.save archive)" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
$PY -c "
import torch; torch.save({'x': torch.zeros(2)}, '$bad/pytorch_model.bin', _use_new_zipfile_serialization=False)"
check "the legacy (pre-1.6) torch.save format is refused, saying so" 2 "the legacy torch.save format (before PyTorch 1.6) is not read" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
$PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import hf_models, torch, collections
sd = torch.load('$T/llama-bin-bf16/pytorch_model.bin')
torch.save({'state_dict': sd}, '$bad/pytorch_model.bin')"
check "a checkpoint holding a state dict, rather than a state dict, is refused" 2 "'state_dict' is not a tensor" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
cfg() { # DIR PYTHON-STATEMENT: edits DIR/config.json (as c)
  $PY -c "import json; c = json.load(open('$1/config.json')); $2; json.dump(c, open('$1/config.json', 'w'))"
}
rm -rf "$bad" && cp -r "$T/llama-f32-gqa" "$bad"
check "--init-from without --data: refused, never a fine-tune on synthetic tokens" 2 \
  "give --data SPEC, the training data: token shards (cephalo data), a CIMG image file for ViT, or 'synthetic' for random tokens (nothing else fine-tunes --init-from's model)" -- \
  "$W" train --quiet --init-from "$bad" --batch 2 --steps 1
check "--init-from without --batch: the remedy named is --batch, not --model" 2 \
  "give --batch B (samples per step) for --init-from's model $bad" -- "$W" train --data synthetic --quiet --init-from "$bad" --steps 1
cfg "$bad" "c['rope_scaling'] = {'rope_type': 'yarn', 'factor': 8.0}"
check "a rope_scaling we do not implement is refused, not ignored" 2 \
  "config.json: rope_scaling.rope_type is \"yarn\"; Cephalo implements rope_scaling linear and llama3" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
cfg "$bad" "c['rope_scaling'] = {'type': 'dynamic', 'factor': 2.0}"
check "... the older key 'type' too" 2 "config.json: rope_scaling.type is \"dynamic\"" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
cfg "$bad" "c['rope_scaling'] = {'rope_type': 'llama3', 'factor': 8.0}"
check "... and a llama3 one without its numbers" 2 "rope_scaling of type llama3 needs rope_scaling.low_freq_factor" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
cfg "$bad" "c['rope_scaling'] = None; c['attention_bias'] = True"
check "Llama's attention_bias (o_proj too) is refused" 2 "config.json: attention_bias is set; biases on all four" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
cfg "$bad" "c['attention_bias'] = False; c['architectures'] = ['GemmaForCausalLM']"
check "an architecture we do not implement" 2 "architecture 'GemmaForCausalLM' cannot be imported (supported: GPT2LMHeadModel, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM)" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
rm -rf "$T/qsw" && cp -r "$T/qwen2-bf16-tied" "$T/qsw"
cfg "$T/qsw" "c['use_sliding_window'] = True"
check "Qwen2 with use_sliding_window is refused" 2 "config.json: use_sliding_window is set; Qwen2's sliding-window attention is not implemented" \
  -- "$W" train --data synthetic --quiet --init-from "$T/qsw" --batch 2 --steps 1
swmsg="sequence length 65 exceeds model mistral-window's sliding_window of 64 (config.json)"
check "Mistral: a sequence longer than its sliding_window is refused (train)" 2 "$swmsg" \
  -- "$W" train --data synthetic --quiet --init-from "$T/mistral-window" --batch 2 --seq 65 --steps 1
check "... cephalo plan too" 2 "$swmsg" \
  -- $C plan --cluster "$(cluster_of 2)" --model "$T/mistral-window/config.json" --batch 4 --seq 65
check "... the window itself is fine" 0 "" -- "$W" train --data synthetic --quiet --init-from "$T/mistral-window" --batch 1 --seq 64 --steps 1
# sample grows the sequence: it stops at the window (max_position_embeddings is 128), and says so
check "... sample stops at the window, said" 0 \
  "--max-new-tokens 100 capped to 59: the model sees its sliding_window of 64 positions (attention over a sliding window is not implemented" \
  -- "$W" sample --init-from "$T/mistral-window" --prompt hello --max-new-tokens 100 --temperature 0
check "... 64 tokens in all, stop \"window\"" 0 "64 window" -- bash -c "'$W' sample --init-from '$T/mistral-window' --prompt hello \
  --max-new-tokens 100 --temperature 0 --json 2>/dev/null | $PY -c 'import json,sys; o=json.loads(sys.stdin.read()); print(o[\"prompt_tokens\"] + o[\"new_tokens\"], o[\"stop\"])'"
check "... a prompt that fills the window: refused" 2 "the prompt has 70 tokens; the model sees its sliding_window of 64 positions" \
  -- "$W" sample --init-from "$T/mistral-window" --prompt "$(printf 'x%.0s' $(seq 70))" --max-new-tokens 2
cfg "$bad" "c['architectures'] = ['LlamaForCausalLM']; c['sliding_window'] = 16"
check "a sliding_window in a Llama config is refused (Mistral's is read)" 2 "config.json: sliding_window is set" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
cfg "$bad" "del c['sliding_window']"
cfg "$bad" "c['architectures'] = ['LlamaForCausalLM']; del c['hidden_size']"
check "a missing config field" 2 "config.json: missing field 'hidden_size'" \
  -- "$W" train --data synthetic --quiet --init-from "$bad" --batch 2 --steps 1
check "--model must be the model config.json describes: the fields that differ, both values" 2 \
  "config.json describes another model than the tiny-llama being trained (the plan's or --model's): n_kv_head 1 vs 2" \
  -- "$W" train --data synthetic --quiet --model tiny-llama --init-from "$T/llama3-bf16-sharded" --batch 2 --steps 1
check "a checkpoint directory is no Hugging Face model" 2 "orig-tiny-gpt/config.json: cannot open" \
  -- "$W" train --data synthetic --quiet --init-from "$T/orig-tiny-gpt" --batch 2 --steps 1
check "cephalo plan --model DIR/config.json with a bad config names the field" 2 "config.json: missing field 'hidden_size'" \
  -- $C plan --cluster "$(cluster_of 2)" --model "$bad/config.json" --batch 4

# ---- a sharded directory is read as its index says (model.safetensors.index.json's weight_map) ----
edit_shards() { # DIR DTYPE CODE: the code edits W (file -> {name: array}, every shard) and M (the
  # weight_map); every shard is rewritten in DTYPE, and the index
  $PY - "$@" <<'EOF'
import json, sys
sys.path.insert(0, "tests/ref")
import hf_models, st, numpy as np
d, dtype, code = sys.argv[1:4]
ix = json.load(open(d + "/model.safetensors.index.json"))
M = ix["weight_map"]
W = {f: st.read(d + "/" + f)[0] for f in sorted(set(M.values()))}
exec(code)
for f, t in W.items():
    hf_models.write_st(d + "/" + f, t, dtype)
json.dump(ix, open(d + "/model.safetensors.index.json", "w"))
EOF
}
sh=$T/shards
$HF make "$sh" --arch llama --dtype f32 --kv 2 --shards 2 --seed 4 >/dev/null
S1=model-00001-of-00002.safetensors S2=model-00002-of-00002.safetensors
# model.norm.weight is in shard 2; shard 1, read first, gets another copy of it
cp -r "$sh" "$T/dupcopy"
edit_shards "$T/dupcopy" f32 "W['$S1']['model.norm.weight'] = W['$S2']['model.norm.weight'] * 0 + 7"
check "a tensor in two shards: loaded from the shard the index names; the other copy is said to be unread" 0 \
  "$S1: tensor 'model.norm.weight' is also in this shard, but the index places it in $T/dupcopy/$S2: that copy is read" \
  -- "$W" train --data synthetic --init-from "$T/dupcopy" --batch 2 --steps 0 --ckpt-dir "$T/dupcopy-ck"
"$W" export --checkpoint "$T/dupcopy-ck" -o "$T/dupcopy-exp" >/dev/null 2>&1
check "... its values are the indexed shard's" 0 "" -- $PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import st, numpy as np
a = st.read('$T/dupcopy-exp/model.safetensors')[0]['model.norm.weight']
b = st.read('$sh/$S2')[0]['model.norm.weight']
assert np.array_equal(a, b), (a[:4], b[:4])"
# a key twice in weight_map (Python's json keeps the last, cJSON the first: two readers, two models)
cp -r "$sh" "$T/dupkey"
$PY -c "
import json; ix = json.load(open('$T/dupkey/model.safetensors.index.json'))
text = json.dumps(ix).replace('\"weight_map\": {', '\"weight_map\": {\"model.norm.weight\": \"$S1\", ', 1)
open('$T/dupkey/model.safetensors.index.json', 'w').write(text)"
check "a tensor named twice in weight_map is refused" 2 \
  "model.safetensors.index.json: weight_map: field 'model.norm.weight' appears twice" \
  -- "$W" train --data synthetic --quiet --init-from "$T/dupkey" --batch 2 --steps 1
cp -r "$sh" "$T/unlisted"
edit_shards "$T/unlisted" f32 "W['$S1']['model.extra.weight'] = W['$S2']['model.norm.weight']"
check "a tensor of a shard that the index does not list is refused" 2 \
  "$S1: tensor 'model.extra.weight' is not in the weight_map of $T/unlisted/model.safetensors.index.json" \
  -- "$W" train --data synthetic --quiet --init-from "$T/unlisted" --batch 2 --steps 1
cp -r "$sh" "$T/misplaced"
edit_shards "$T/misplaced" f32 "M['model.embed_tokens.weight'] = '$S2'"
check "the index naming a shard that lacks the tensor (another shard has it) is refused" 2 \
  "weight_map places tensor 'model.embed_tokens.weight' in $T/misplaced/$S2, which does not hold it" \
  -- "$W" train --data synthetic --quiet --init-from "$T/misplaced" --batch 2 --steps 1
cp "$T/llama-f32-gqa/config.json" "$T/dupcfg.json"
mkdir -p "$T/dupcfg" && cp "$T/llama-f32-gqa/model.safetensors" "$T/dupcfg/"
sed 's/"num_hidden_layers": 2,/"num_hidden_layers": 2, "num_hidden_layers": 1,/' "$T/dupcfg.json" >"$T/dupcfg/config.json"
check "a field twice in config.json is refused (transformers would read the last, we the first)" 2 \
  "config.json: field 'num_hidden_layers' appears twice" -- "$W" train --data synthetic --quiet --init-from "$T/dupcfg" --batch 2 --steps 1

# ---- weights the config does not describe: an error naming them, for every command that loads them ----
cp -r "$T/llama-f32-gqa" "$T/short"
cfg "$T/short" "c['num_hidden_layers'] = 1"
unused="tensors the model does not use: 'model.layers.1."
check "config.json with fewer layers than the weights: train refuses, naming the tensors" 2 "$unused" \
  -- "$W" train --data synthetic --quiet --init-from "$T/short" --batch 2 --steps 1
check "... eval --init-from too" 2 "$unused" -- "$W" eval --init-from "$T/short" --data synthetic --samples 2
check "... sample --init-from too" 2 "$unused" -- "$W" sample --init-from "$T/short" --max-new-tokens 2
printf 'init_from: short\nbatch: 2\nsteps: 1\ndevices:\n  - {type: cpu, threads: 1, memory: 256M, count: 1}\ndata: synthetic\n' >"$T/short.yaml"
check "... a job with init_from too" 1 "$unused" -- $C run "$T/short.yaml" --run-dir "$T/short-run"
check "--allow-unused-weights loads it and says what it left out" 0 \
  "--allow-unused-weights: 9 tensors the model does not use left out (config.json describes a Llama model with 1 layer)" \
  -- "$W" train --data synthetic --init-from "$T/short" --batch 2 --steps 1 --allow-unused-weights
check "... as eval does" 0 "--allow-unused-weights: 9 tensors" \
  -- "$W" eval --init-from "$T/short" --data synthetic --samples 2 --allow-unused-weights
rm -rf "$T/short" && cp -r "$T/gpt2-bf16-sharded" "$T/short"
cfg "$T/short" "c['n_layer'] = 1"
check "a sharded GPT-2 directory with fewer layers in its config: refused, naming the tensors" 2 \
  "model.safetensors.index.json: 12 tensors the model does not use: 'transformer.h.1." \
  -- "$W" train --data synthetic --quiet --init-from "$T/short" --batch 2 --steps 1
# a checkpoint whose metadata describes fewer layers than its tensors hold
"$W" train --data synthetic --quiet --model tiny-gpt --batch 2 --steps 1 --ckpt-dir "$T/ck2" 2>/dev/null
mkdir -p "$T/ck1"
$PY -c "
import json, sys; sys.path.insert(0, 'tests/ref'); import st
t, meta = st.read('$T/ck2/step_00000001.safetensors')
m = json.loads(meta['cephalo.model']); m['n_layer'] = 1; m['name'] = 'tiny-gpt-1'; meta['cephalo.model'] = json.dumps(m)
st.write('$T/ck1/step_00000001.safetensors', t, meta)
open('$T/ck1/latest', 'w').write('step_00000001.safetensors\n')"
printf 'base: tiny-gpt\nname: tiny-gpt-1\nn_layer: 1\n' >"$T/tiny-gpt-1.yaml"
cku="step_00000001.safetensors: 3 tensors the model does not use: 'param.block.1', 'adam_m.block.1', 'adam_v.block.1'"
check "a checkpoint holding more layers than its metadata: eval refuses, naming the tensors" 2 "$cku" \
  -- "$W" eval --checkpoint "$T/ck1" --data synthetic --samples 2
check "... sample too" 2 "$cku" -- "$W" sample --checkpoint "$T/ck1" --max-new-tokens 2
check "... export too" 2 "$cku" -- "$W" export --checkpoint "$T/ck1" -o "$T/ck1-exp"
check "... and a resume" 2 "$cku" -- "$W" train --data synthetic --quiet --model "$T/tiny-gpt-1.yaml" --batch 2 --steps 2 --resume "$T/ck1"
check "... --allow-unused-weights exports it, saying so" 0 "--allow-unused-weights: 3 tensors the model does not use left out" \
  -- "$W" export --checkpoint "$T/ck1" -o "$T/ck1-exp" --allow-unused-weights
# and a --dump's parameter file (export and sample read those too)
"$W" train --data synthetic --quiet --model tiny-gpt --batch 2 --steps 1 --dump "$T/dump2" 2>/dev/null
$PY -c "
import json, sys; sys.path.insert(0, 'tests/ref'); import st
t, meta = st.read('$T/dump2/init.safetensors')
m = json.loads(meta['cephalo.model']); m['n_layer'] = 1; meta['cephalo.model'] = json.dumps(m)
st.write('$T/dump1.safetensors', t, meta)"
check "... a --dump file holding more layers than its metadata: export refuses, naming the tensors" 2 \
  "dump1.safetensors: 12 tensors the model does not use: 'block.1.ln_1.weight'" \
  -- "$W" export --checkpoint "$T/dump1.safetensors" -o "$T/dump1-exp"

# ---- weights that are not finite: named with the tensor and element on load, not seen later as a loss of nan ----
rm -rf "$T/nan" && cp -r "$T/llama-f32-gqa" "$T/nan"
$PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import hf_models, st, numpy as np
W, _ = st.read('$T/nan/model.safetensors'); W['model.layers.1.mlp.up_proj.weight'][3, 17] = np.nan
hf_models.write_st('$T/nan/model.safetensors', W, 'f32')"
nanmsg="model.safetensors: tensor 'model.layers.1.mlp.up_proj.weight' holds nan at [3, 17]"
check "a NaN in imported weights: train names the tensor and element" 2 "$nanmsg" \
  -- "$W" train --data synthetic --quiet --init-from "$T/nan" --batch 2 --steps 1
check "... eval --init-from too" 2 "$nanmsg" -- "$W" eval --init-from "$T/nan" --data synthetic --samples 2
check "... sample --init-from too" 2 "$nanmsg" -- "$W" sample --init-from "$T/nan" --max-new-tokens 2
rm -rf "$T/inf" && cp -r "$T/gpt2-bf16-sharded" "$T/inf"
edit_shards "$T/inf" bf16 "W[M['transformer.h.0.attn.c_attn.weight']]['transformer.h.0.attn.c_attn.weight'][5, 100] = -np.inf"
check "-inf in a sharded bf16 GPT-2 (a Conv1D weight, transposed on load) is named as stored" 2 \
  "tensor 'transformer.h.0.attn.c_attn.weight' holds -inf at [5, 100]" \
  -- "$W" train --data synthetic --quiet --init-from "$T/inf" --batch 2 --steps 1
$C plan --cluster "$(cluster_of 3)" --model "$T/inf/config.json" --batch 6 -o "$T/pinf.json" >/dev/null
run_ranks "$T/pinf.json" "$T/infrun" --steps 1 --init-from "$T/inf"
check "... on 3 ranks: the rank that reads it names it, and every rank stops" 0 "" -- bash -c "
grep -l \"holds -inf at \[5, 100\]\" '$T/infrun'/rank*.err && ! grep -q '\"step\"' '$T/infrun'/rank*.jsonl 2>/dev/null"
# a checkpoint with an inf (its CRC rewritten: the file is sound, the value is not)
mkdir -p "$T/cknan"
$PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import st, numpy as np
t, meta = st.read('$T/ck2/step_00000001.safetensors')
t['param.block.0'][70] = np.inf
st.write('$T/cknan/step_00000001.safetensors', t, meta)
open('$T/cknan/latest', 'w').write('step_00000001.safetensors\n')"
cknan="step_00000001.safetensors: tensor 'param.block.0' holds inf in ln_1.bias at [6]"
check "inf in a checkpoint: a resume names the tensor, the model's tensor in it and the element" 2 "$cknan" \
  -- "$W" train --data synthetic --quiet --model tiny-gpt --batch 2 --steps 2 --resume "$T/cknan"
check "... eval --checkpoint too" 2 "$cknan" -- "$W" eval --checkpoint "$T/cknan" --data synthetic --samples 2
check "... sample --checkpoint too" 2 "$cknan" -- "$W" sample --checkpoint "$T/cknan" --max-new-tokens 2
check "... export too" 2 "$cknan" -- "$W" export --checkpoint "$T/cknan" -o "$T/cknan-exp"

# ---- issue 38: a loss of nan before any update is not the learning rate's doing ----
# finite weights far beyond a model's scale: the step-0 forward overflows; nothing had been updated
$HF make "$T/huge" --arch gpt2 --std 1e20 --seed 3 >/dev/null
out=$("$W" train --data synthetic --quiet --init-from "$T/huge" --batch 2 --seq 24 --steps 2 2>&1)
check "a loss of nan at step 0: not blamed on --lr; the weights are checked and the causes named in order" 0 \
  "step 0: the loss is nan before any update of this run, so the learning rate is not the cause: the forward pass gave it on the weights this run started from (--init-from $T/huge: all finite, the largest magnitude" -- echo "$out"
check "... 1. the weights' scale, 2. the data" 0 \
  "The likely causes, in order: 1. weights too large for the forward pass (the largest is" -- echo "$out"
assert "... never 'lower --lr'" test -z "$(grep 'lower --lr' <<<"$out")"
$HF make "$T/big300" --arch gpt2 --std 300 --seed 3 >/dev/null
check "... in fp16, its range is named first" 1 \
  "The likely causes, in order: 1. fp16's range (65504) in the forward pass: train in bf16 (--precision bf16)" \
  -- "$W" train --data synthetic --quiet --init-from "$T/big300" --batch 2 --seq 24 --steps 2 --precision fp16
$HF make "$T/big30" --arch gpt2 --std 30 --seed 3 >/dev/null
check "a loss above the divergence bound from the first step: the weights do not fit, not --lr" 1 \
  "before any update), so the learning rate is not the cause: the weights it started from (--init-from $T/big30) do not fit this data" \
  -- "$W" train --data synthetic --quiet --init-from "$T/big30" --batch 2 --seq 24 --steps 3 --diverge-steps 2

# ---- a Llama model's seq within its max_seq, wherever a seq meets a model (docs/run.md) ----
llseq="exceeds model tiny-llama's context of 128 positions"
check "train --seq beyond a Llama model's max_seq is refused" 2 "--seq: sequence length 256 $llseq" \
  -- "$W" train --data synthetic --quiet --model tiny-llama --batch 2 --seq 256 --steps 1
check "... with --init-from (max_position_embeddings 128)" 2 "exceeds model llama-f32-gqa's context of 128 positions" \
  -- "$W" train --data synthetic --quiet --init-from "$T/llama-f32-gqa" --batch 2 --seq 129 --steps 1
check "... eval --seq" 2 "exceeds model llama-f32-gqa's context" -- "$W" eval --init-from "$T/llama-f32-gqa" --data synthetic --seq 200
check "... cephalo plan --seq" 2 "$llseq" -- $C plan --cluster "$(cluster_of 2)" --model tiny-llama --batch 4 --seq 256
printf 'model: tiny-llama\nbatch: 2\nsteps: 1\nseq: 256\ndevices:\n  - {type: cpu, threads: 1, memory: 256M, count: 1}\ndata: synthetic\n' >"$T/llseq.yaml"
check "... a job file's seq" 2 "llseq.yaml:4: seq: sequence length 256 $llseq" -- $C run "$T/llseq.yaml" --dry-run --run-dir "$T/llseq-run"
printf 'init_from: llama-f32-gqa\nbatch: 2\nsteps: 1\nseq: 200\ndevices:\n  - {type: cpu, threads: 1, memory: 256M, count: 1}\ndata: synthetic\n' >"$T/llseq-hf.yaml"
check "... a job file's seq with init_from (the config's max_position_embeddings)" 2 \
  "llseq-hf.yaml:4: seq: sequence length 200 exceeds model llama-f32-gqa's context of 128 positions" \
  -- $C run "$T/llseq-hf.yaml" --dry-run --run-dir "$T/llseq-hf-run"
$C plan --cluster "$(cluster_of 2)" --model tiny-llama --batch 4 --seq 64 -o "$T/llp.json" >/dev/null
$PY -c "
import json; p = json.load(open('$T/llp.json')); p['inputs']['seq'] = 256; json.dump(p, open('$T/llp.json', 'w'))"
check "... a plan's inputs.seq, read by the worker" 2 "llp.json: inputs.seq: sequence length 256 $llseq" \
  -- env CEPHALO_PLAN="$T/llp.json" RANK=0 WORLD_SIZE=2 "$W" train --data synthetic --quiet --steps 1
check "... cephalo-worker profile --seq" 2 "$llseq" -- "$W" profile --model tiny-llama --seq 256 -o "$T/llprof.json"
check "max_seq itself is fine" 0 "" -- "$W" train --data synthetic --quiet --model tiny-llama --batch 1 --seq 128 --steps 1

echo "# $n checks"
