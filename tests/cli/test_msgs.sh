#!/usr/bin/env bash
# CLI tests of the messages and refusals of issue 15: outputs that would overwrite an input, node
# names in the plan table (UTF-8, embedded NULs) and the hints of an infeasible plan; and of issue
# 38: a model directory's name however its path is spelled, the operator's metrics address.
# Prints "ok N - name" / "not ok N - name" lines.
set -u
BIN=${BUILD:-build/rel}/bin/cephalo
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
export CEPHALO_PROFILE_STORE=none

# lacks NAME NEEDLE -- command...   (passes when the output, whatever the exit status, lacks NEEDLE)
lacks() {
  local name=$1 needle=$2
  shift 3
  n=$((n + 1))
  local out
  out=$("$@" 2>&1)
  if grep -qF -- "$needle" <<<"$out"; then
    echo "not ok $n - $name (output has: $needle)"; grep -F -- "$needle" <<<"$out" | head -3 | sed 's/^/#   /'
  else
    echo "ok $n - $name"
  fi
}

# ---- outputs that are inputs: refused before anything is written (exit 2) ----
printf 'nodes:\n  - name: n\n    gpus: [{type: L4, count: 2}]\n' >"$T/c2.yaml"
cp "$T/c2.yaml" "$T/c2.orig"
cp examples/models/my-gpt.yaml "$T/m.yaml"
cp examples/profiles/cluster-a-bert-large.json "$T/prof.json"
ln -s c2.yaml "$T/link.yaml"
ln "$T/c2.yaml" "$T/hard.yaml"
mkdir "$T/sub"
P=(plan --cluster "$T/c2.yaml" --model gpt2-124m --batch 8)
check "-o the cluster file" 2 "$T/c2.yaml: this is the input --cluster" -- "$BIN" "${P[@]}" -o "$T/c2.yaml"
assert "the cluster file is unchanged" cmp "$T/c2.yaml" "$T/c2.orig"
check "-o ./ spelling of the cluster" 2 "this is the input --cluster" -- "$BIN" "${P[@]}" -o "$T/./c2.yaml"
check "-o dir/.. spelling of the cluster" 2 "this is the input --cluster" -- "$BIN" "${P[@]}" -o "$T/sub/../c2.yaml"
check "-o a symlink to the cluster" 2 "-o $T/link.yaml: this is the input --cluster" -- "$BIN" "${P[@]}" -o "$T/link.yaml"
check "-o a hard link to the cluster" 2 "this is the input --cluster" -- "$BIN" "${P[@]}" -o "$T/hard.yaml"
check "-o relative to the cwd" 2 "this is the input --cluster" -- bash -c "cd '$T' && '$PWD/$BIN' plan --cluster c2.yaml --model gpt2-124m --batch 8 -o ./c2.yaml"
assert "the cluster file is still unchanged" cmp "$T/c2.yaml" "$T/c2.orig"
check "--dump-costs the cluster file" 2 "--dump-costs $T/c2.yaml: this is the input --cluster" -- "$BIN" "${P[@]}" --dump-costs "$T/c2.yaml"
check "compare --dump-costs the cluster" 2 "this is the input --cluster" -- "$BIN" compare --cluster "$T/c2.yaml" --model gpt2-124m --batch 8 --dump-costs "$T/link.yaml"
check "-o the model file" 2 "this is the input --model $T/m.yaml" -- "$BIN" plan --cluster "$T/c2.yaml" --model "$T/m.yaml" --batch 8 -o "$T/m.yaml"
check "-o the profile" 2 "this is the input --profile" -- "$BIN" "${P[@]}" --profile "$T/prof.json" -o "$T/prof.json"
echo '{}' >"$T/store.json"
check "-o the profile store the plan reads" 2 "this is the input the profile store" -- env CEPHALO_PROFILE_STORE="$T/store.json" "$BIN" "${P[@]}" -o "$T/store.json"
check "-o and --dump-costs the same file" 2 "this is also the output -o" -- "$BIN" "${P[@]}" -o "$T/p.json" --dump-costs "$T/./p.json"
check "-o a new file still works" 0 "" -- "$BIN" "${P[@]}" -o "$T/new.json"
check "-o an existing output is overwritten" 0 "" -- "$BIN" "${P[@]}" -o "$T/new.json"
check "profile -o the model file" 2 "this is the input --model" -- "$BIN" profile --devices cpu:1t:256M --model "$T/m.yaml" -o "$T/m.yaml" --store none
check "profile -o the store" 2 "this is also the output --store" -- "$BIN" profile --devices cpu:1t:256M --model gpt2-124m -o "$T/new-store.json" --store "$T/./new-store.json"
check "profile --store the model file" 2 "this is the input --model" -- "$BIN" profile --devices cpu:1t:256M --model "$T/m.yaml" --store "$T/m.yaml"
mkdir -p "$T/shards"
printf 'text' >"$T/shards/train_000000.bin"
check "data input among the output shards" 2 "this input is train_000000.bin, a file of the data directory -o" -- "$BIN" data -o "$T/shards" "$T/shards/train_000000.bin"
check "data --images still writes" 0 "" -- "$BIN" data --images -o "$T/i.cimg" --synthetic 2 --classes 2 --size 4

# ---- node names: UTF-8 in the table, NUL refused ----
printf 'nodes:\n  - name: "n\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9-\xe6\x97\xa5\xe6\x9c\xac"\n    gpus: [{type: L4, count: 2}]\n' >"$T/utf8.yaml"
"$BIN" plan --cluster "$T/utf8.yaml" --model gpt2-124m --batch 8 >"$T/utf8.out" 2>&1
assert "plan table is valid UTF-8" iconv -f UTF-8 -t UTF-8 "$T/utf8.out"
check "plan table shows the whole name" 0 "$(printf 'n\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9-\xe6\x97\xa5\xe6\x9c\xac')" -- cat "$T/utf8.out"
# columns line up: the device column starts at the same code point in the header and the rows
assert "plan table columns line up" python3 -c '
import sys
lines = open(sys.argv[1], encoding="utf-8").read().splitlines()
head = next(l for l in lines if l.lstrip().startswith("rank"))
rows = [l for l in lines if l.split()[:1] in (["0"], ["1"])]
col = head.index("device")
sys.exit(0 if rows and all(r[col:col + 2] == "L4" for r in rows) else 1)' "$T/utf8.out"
printf 'nodes:\n  - name: "a\\0b"\n    gpus: [{type: L4, count: 2}]\n' >"$T/nul.yaml"
check "NUL in a node name" 2 "nul.yaml:2: nodes[0].name: contains a NUL character" -- "$BIN" plan --cluster "$T/nul.yaml" --model gpt2-124m --batch 8
printf 'nodes:\n  - name: a\n    gpus: [{type: "L4\\u0000x", count: 2}]\n' >"$T/nul2.yaml"
check "NUL in a GPU type" 2 "nul2.yaml:3: nodes[0].gpus[0].type: contains a NUL character" -- "$BIN" plan --cluster "$T/nul2.yaml" --model gpt2-124m --batch 8
printf 'nodes:\n  - name: a\n    gpus: [{type: L4, count: "2\\0"}]\n' >"$T/nul3.yaml"
check "NUL in a number" 2 "nul3.yaml:3: nodes[0].gpus[0].count: contains a NUL character" -- "$BIN" plan --cluster "$T/nul3.yaml" --model gpt2-124m --batch 8

# ---- infeasible hints name only what applies to the model ----
printf 'nodes:\n  - name: tiny\n    gpus: [{type: L4, memory_gib: 0.05}, {type: L4}]\n' >"$T/tiny.yaml"
check "ViT infeasible hint" 3 "a model file with image: below 224, --precision bf16, or leave this device out" -- "$BIN" plan --cluster "$T/tiny.yaml" --model vit-g --batch 2
lacks "ViT hint has no --seq" "--seq" -- "$BIN" plan --cluster "$T/tiny.yaml" --model vit-g --batch 2
check "GPT infeasible hint" 3 "shorter --seq, --precision bf16, or leave this device out" -- "$BIN" plan --cluster "$T/tiny.yaml" --model gpt2-774m --batch 2
check "bf16 hint only in fp32" 3 "(shorter --seq or leave this device out)" -- "$BIN" plan --cluster "$T/tiny.yaml" --model gpt2-774m --batch 2 --precision bf16
check "16-bit hints only in fp32 (fp16 too)" 3 "(shorter --seq or leave this device out)" -- "$BIN" plan --cluster "$T/tiny.yaml" --model gpt2-774m --batch 2 --precision fp16
printf 'nodes:\n  - name: tiny\n    gpus: [{type: T4, memory_gib: 0.05}, {type: T4}]\n' >"$T/tiny-t4.yaml"
check "a T4 (no bf16) is hinted fp16" 3 "shorter --seq, --precision fp16, or leave this device out" -- "$BIN" plan --cluster "$T/tiny-t4.yaml" --model gpt2-774m --batch 2

# ---- issue 38: messages that misled ----
# a model directory is named by its own name, however the path is spelled (a trailing slash named
# it hf-model, "." too; the other cases: tests/unit/test_paths.c)
mkdir -p "$T/hf"
printf '{"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 128, "vocab_size": 256}\n' >"$T/hf/config.json"
check "--model hf/ is named hf" 0 "hf: gpt, 2 layers" -- "$BIN" models "$T/hf/"
check "--model hf/. too" 0 "hf: gpt, 2 layers" -- "$BIN" models "$T/hf/."
ABS=$(cd "$(dirname "$BIN")" && pwd)/cephalo
check "--model . inside it too" 0 "hf: gpt, 2 layers" -- bash -c "cd '$T/hf' && '$ABS' models ."
lacks "never hf-model" "hf-model" -- "$BIN" models "$T/hf/"
# the operator's metrics address: the reason bind(2) gives, not a guess that it is in use
OP=${BUILD:-build/rel}/bin/cephalo-operator
printf 'apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: "http://127.0.0.1:1"}\nusers:\n- name: u\n  user: {token: t}\ncontexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\n' >"$T/kc.yaml"
check "operator --metrics-addr on an address not of this host: why, not 'in use?'" 2 \
  "--metrics-addr: cannot listen on 192.0.2.1:9999: Cannot assign requested address" -- \
  "$OP" --kubeconfig "$T/kc.yaml" --metrics-addr 192.0.2.1:9999 --leader-elect=false
