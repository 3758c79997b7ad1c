#!/bin/bash
# test_tokid.sh - the tokenizer travels with the model (docs/tokenizer.md "Identity"): `cephalo
# data` records the tokenizer's identity in each shard header (and keeps tokenizer.json beside the
# shards); the identity does not depend on the file's formatting; training refuses data of another
# tokenizer, or of a larger vocabulary, before the first step, with both names, and accepts llm.c's
# shards (no identity); checkpoints record it and keep tokenizer.json; sample finds the model's
# tokenizer.json; export writes a directory with every file and key transformers reads
# (tests/ref/check_hf_dir.py), in the --dtype asked for, without an earlier export's stale files.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
B=${BUILD:-build/rel}
W=$PWD/$B/bin/cephalo-worker
C=$PWD/$B/bin/cephalo
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=/usr/bin/python3 # Debian's, with numpy (tests/ref/needs.py)
HF="$PY tests/ref/hf_models.py"
export OMP_NUM_THREADS=2

# mktok FILE KIND [pretty]: a byte-level BPE tokenizer.json of 259 tokens (GPT-2's byte
# characters, three merges) plus KIND's special tokens: gpt2 <|endoftext|> (259); llama3
# <|begin_of_text|> (259), <|end_of_text|> (260); swapped: gpt2 with two merges in another order.
# pretty: indented, keys in another order, merges as ["A", "B"] pairs (the same tokenizer).
mktok() {
  $PY - "$@" <<'EOF'
import json, sys
path, kind = sys.argv[1], sys.argv[2]
pretty = len(sys.argv) > 3
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, k = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + k); k += 1
chars = [chr(c) for b, c in sorted(zip(bs, cs))]
vocab = {ch: i for i, ch in enumerate(chars)}
merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he")]
if kind == "swapped":
    merges = [("h", "e"), ("\u0120", "t"), ("\u0120t", "he")]
for a, b in merges:
    vocab[a + b] = len(vocab)
special = ["<|begin_of_text|>", "<|end_of_text|>"] if kind == "llama3" else ["<|endoftext|>"]
added = []
for s in special:
    vocab[s] = len(vocab)
    added.append({"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True})
doc = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "post_processor": None, "decoder": {"type": "ByteLevel"},
       "model": {"type": "BPE", "dropout": None, "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}
if pretty:
    doc["model"]["merges"] = [[a, b] for a, b in merges]
    doc = dict(reversed(list(doc.items())))
    json.dump(doc, open(path, "w"), indent=3, ensure_ascii=True)
else:
    json.dump(doc, open(path, "w"), ensure_ascii=False)
EOF
}

# hdr FILE: the shard header's slots 3..7 as "marker kind vocab hash"
hdr() { $PY -c "
import struct, sys
h = struct.unpack('<256I', open(sys.argv[1], 'rb').read(1024))
print('%08x %d %d %016x' % (h[3], h[4], h[5], h[7] << 32 | h[6]))" "$1"; }

# checker DIR ARGS...: check_hf_dir.py's lines as numbered checks
checker() {
  local out line name=$1
  shift
  out=$($PY tests/ref/check_hf_dir.py "$@" 2>&1)
  while IFS= read -r line; do
    case $line in
      "ok - "*) n=$((n + 1)); echo "ok $n - $name: ${line#ok - }" ;;
      "not ok - "*) n=$((n + 1)); echo "not ok $n - $name: ${line#not ok - }" ;;
    esac
  done <<<"$out"
  grep -q '^ok - ' <<<"$out" || { n=$((n + 1)); echo "not ok $n - $name: the checker failed"; tail -n 3 <<<"$out" | sed 's/^/#   /'; }
}

# ---- shards record the tokenizer ----
mktok "$T/tok.json" gpt2
mktok "$T/pretty.json" gpt2 pretty
mktok "$T/swapped.json" swapped
mktok "$T/l3.json" llama3
$PY -c "print('the theory of the cat; the other theory. ' * 60)" >"$T/a.txt"
$HF make "$T/g" --arch gpt2 --vocab 260 --seed 8 >/dev/null
cp -r "$T/g" "$T/g0" # the same model without a tokenizer
cp "$T/tok.json" "$T/g/tokenizer.json"

"$C" data -o "$T/d" --tokenizer "$T/tok.json" --doc-sep '. ' "$T/a.txt" >"$T/d.out" 2>&1
name=$(grep -o 'tokenizer bpe-260-[0-9a-f]*' "$T/d.out" | cut -d' ' -f2)
check "data names the tokenizer" 0 "recorded in each shard's header" -- cat "$T/d.out"
check "the header holds the marker, kind, vocabulary and hash of that name" 0 "44494b54 2 260 ${name#bpe-260-}" -- hdr "$T/d/train_000000.bin"
assert "tokenizer.json is kept beside the shards" cmp "$T/tok.json" "$T/d/tokenizer.json"
"$C" data -o "$T/dp" --tokenizer "$T/pretty.json" --doc-sep '. ' "$T/a.txt" >"$T/dp.out" 2>&1
check "the same tokenizer written otherwise has the same identity" 0 "tokenizer $name," -- cat "$T/dp.out"
"$C" data -o "$T/ds" --tokenizer "$T/swapped.json" --doc-sep '. ' "$T/a.txt" >"$T/ds.out" 2>&1
other=$(grep -o 'tokenizer bpe-260-[0-9a-f]*' "$T/ds.out" | cut -d' ' -f2)
assert "another merge order is another identity" test -n "$other" -a "$other" != "$name"
"$C" data -o "$T/b" "$T/a.txt" >/dev/null 2>&1
check "byte shards record bytes-256" 0 "44494b54 1 256 0000000000000000" -- hdr "$T/b/train_000000.bin"
"$C" data -o "$T/l3d" --tokenizer "$T/l3.json" --bos --doc-sep '. ' "$T/a.txt" >/dev/null 2>&1
$PY -c "
import struct, sys
toks = [(i * 7) % 259 for i in range(600)]
open(sys.argv[1], 'wb').write(struct.pack('<256i', 20240520, 1, len(toks), *([0] * 253)) + struct.pack('<%dH' % len(toks), *toks))
" "$T/llmc.bin"

# ---- refused before the first step, with both names ----
TR=(train --batch 2 --seq 16 --lr 1e-3)
check "byte shards on a model with a BPE tokenizer: refused" 2 \
  "train_000000.bin: written with tokenizer bytes-256, but the model's tokenizer is $name ($T/g/tokenizer.json, --init-from)" -- \
  "$W" "${TR[@]}" --init-from "$T/g" --data "$T/b" --steps 1
check "another tokenizer of the same size: refused" 2 "written with tokenizer $other, but the model's tokenizer is $name" -- \
  "$W" "${TR[@]}" --init-from "$T/g" --data "$T/ds" --steps 1
"$W" "${TR[@]}" --init-from "$T/g0" --data "$T/l3d" --steps 1 >"$T/big.out" 2>&1
check "a larger vocabulary (Llama-3-like shards on a 260-token model): refused" 2 "(vocabulary 261), larger than the model's vocabulary 260" -- \
  "$W" "${TR[@]}" --init-from "$T/g0" --data "$T/l3d" --steps 1
assert "... before any step" bash -c "! grep -q '^step ' '$T/big.out'"
check "--val-data of another tokenizer: refused" 2 "--val-data $T/b/train_000000.bin: written with tokenizer bytes-256, but the model's tokenizer is $name" -- \
  "$W" "${TR[@]}" --init-from "$T/g" --data "$T/d" --val-data "$T/b" --steps 1
check "eval --init-from on another tokenizer's data: refused" 2 "written with tokenizer bytes-256, but the model's tokenizer is $name" -- \
  "$W" eval --init-from "$T/g" --data "$T/b" --samples 4 --seq 16
check "byte data names bytes-256" 0 "tokenizer bytes-256, recorded in each shard's header" -- "$C" data -o "$T/b2" "$T/a.txt"
check "llm.c shards (no identity) are accepted" 0 "" -- "$W" "${TR[@]}" --init-from "$T/g" --data "$T/llmc.bin" --steps 1 --quiet
check "a --init-from tokenizer larger than the model: refused" 2 "has 261 tokens but the model's vocabulary only 260" -- \
  bash -c "cp -r '$T/g0' '$T/gl3' && cp '$T/l3.json' '$T/gl3/tokenizer.json' && '$W' ${TR[*]} --init-from '$T/gl3' --data '$T/llmc.bin' --steps 1"

# ---- checkpoints record it and keep the file ----
check "matching data trains" 0 "" -- "$W" "${TR[@]}" --init-from "$T/g" --data "$T/d" --steps 2 --ckpt-dir "$T/ck" --quiet
assert "the checkpoint directory keeps tokenizer.json" cmp "$T/tok.json" "$T/ck/tokenizer.json"
check "the checkpoint's metadata names it" 0 "$name" -- $PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import st
_, meta = st.read('$T/ck/step_00000002.safetensors'); print(meta.get('cephalo.tokenizer'))"
check "resuming on another tokenizer's data: refused (the checkpoint's tokenizer)" 2 \
  "written with tokenizer bytes-256, but the model's tokenizer is $name ($T/ck/tokenizer.json, the checkpoint resumed from)" -- \
  "$W" "${TR[@]}" --init-from "$T/g0" --data "$T/b" --steps 3 --ckpt-dir "$T/ck" --resume auto
check "from scratch: the shards' tokenizer.json goes beside the checkpoints" 0 "" -- \
  "$W" "${TR[@]}" --init-from "$T/g0" --data "$T/d" --steps 1 --ckpt-dir "$T/ck2" --quiet
assert "... the same file" cmp "$T/tok.json" "$T/ck2/tokenizer.json"

# ---- sample finds the model's tokenizer ----
S=(sample --prompt "the theory" --max-new-tokens 12 --temperature 0)
"$W" "${S[@]}" --init-from "$T/g" --tokenizer "$T/tok.json" >"$T/s1.txt" 2>/dev/null
check "sample --init-from DIR uses DIR/tokenizer.json" 0 "" -- "$W" "${S[@]}" --init-from "$T/g"
"$W" "${S[@]}" --init-from "$T/g" >"$T/s2.txt" 2>/dev/null
assert "... the same text as with --tokenizer" cmp "$T/s1.txt" "$T/s2.txt"
check "eval --checkpoint on another tokenizer's data: refused" 2 "but the model's tokenizer is $name ($T/ck/tokenizer.json, the checkpoint's)" -- \
  "$W" eval --checkpoint "$T/ck" --data "$T/b" --samples 4
check "eval --checkpoint on its own data" 0 "" -- "$W" eval --checkpoint "$T/ck" --data "$T/d" --samples 4
check "sample --checkpoint uses the checkpoint's tokenizer.json" 0 "" -- "$W" "${S[@]}" --checkpoint "$T/ck"
check "sample --tokenizer other than the model's: refused" 2 "is tokenizer $other, but the model's own is $name" -- \
  "$W" "${S[@]}" --init-from "$T/g" --tokenizer "$T/swapped.json"
check "the same tokenizer formatted otherwise is fine" 0 "" -- "$W" "${S[@]}" --init-from "$T/g" --tokenizer "$T/pretty.json"

# ---- export: every file and key transformers reads ----
check "export" 0 "tokenizer.json, tokenizer_config.json, special_tokens_map.json" -- "$W" export --checkpoint "$T/ck" -o "$T/hf"
checker "float32 export" "$T/hf" --eos '<|endoftext|>'
check "export --dtype bfloat16" 0 "model.safetensors (bfloat16)" -- "$W" export --checkpoint "$T/ck" -o "$T/hf16" --dtype bfloat16
checker "bfloat16 export" "$T/hf16" --like "$T/hf"
check "export --dtype float16" 0 "model.safetensors (float16)" -- "$W" export --checkpoint "$T/ck" -o "$T/hfh" --dtype float16
checker "float16 export" "$T/hfh" --like "$T/hf"
check "--dtype double: refused" 2 "--dtype double: expected float32, bfloat16 or float16" -- \
  "$W" export --checkpoint "$T/ck" -o "$T/x" --dtype double
check "export --tokenizer other than the checkpoint's: refused" 2 "is tokenizer $other, but the checkpoint" -- \
  "$W" export --checkpoint "$T/ck" -o "$T/x" --tokenizer "$T/swapped.json"
check "the export trains on as it is (its tokenizer.json is the data's)" 0 "" -- \
  "$W" "${TR[@]}" --init-from "$T/hf" --data "$T/d" --steps 1 --quiet
check "a bfloat16 export imports" 0 "" -- "$W" "${TR[@]}" --init-from "$T/hf16" --data "$T/d" --steps 1 --quiet
check "a bfloat16 export refuses byte data too" 2 "but the model's tokenizer is $name" -- \
  "$W" "${TR[@]}" --init-from "$T/hf16" --data "$T/b" --steps 1

# ---- the checkpoint's record is the identity: a kept tokenizer.json of another tokenizer (replaced
# after the checkpoint was written) is refused by every command that loads the checkpoint, and
# one recorded without a file is still its tokenizer ----
cp -r "$T/ck" "$T/ckx" && cp "$T/swapped.json" "$T/ckx/tokenizer.json"
mism="is tokenizer $other, but the checkpoint $T/ckx/step_00000002.safetensors was trained with $name"
check "sample --checkpoint with a replaced tokenizer.json: refused" 2 "$T/ckx/tokenizer.json $mism" -- "$W" "${S[@]}" --checkpoint "$T/ckx"
check "eval --checkpoint with a replaced tokenizer.json: refused" 2 "$mism" -- "$W" eval --checkpoint "$T/ckx" --data "$T/d" --samples 4
check "export with a replaced tokenizer.json: refused" 2 "$mism" -- "$W" export --checkpoint "$T/ckx" -o "$T/x"
check "train --resume with a replaced tokenizer.json: refused" 2 "$mism" -- \
  "$W" "${TR[@]}" --init-from "$T/g0" --data "$T/ds" --steps 3 --ckpt-dir "$T/ckx" --resume auto
cp -r "$T/ck" "$T/cky" && rm "$T/cky/tokenizer.json"
check "sample --checkpoint recording a tokenizer whose file is gone: refused, naming it" 2 \
  "the checkpoint was trained with tokenizer $name (its metadata cephalo.tokenizer), but no tokenizer.json is kept beside it" -- \
  "$W" "${S[@]}" --checkpoint "$T/cky"
check "... --tokenizer of another tokenizer: refused against the record" 2 \
  "is tokenizer $other, but the model's own is $name (its checkpoint's metadata cephalo.tokenizer)" -- \
  "$W" "${S[@]}" --checkpoint "$T/cky" --tokenizer "$T/swapped.json"
check "... --tokenizer of the recorded one: samples" 0 "" -- "$W" "${S[@]}" --checkpoint "$T/cky" --tokenizer "$T/pretty.json"
check "eval --checkpoint without its file, on another tokenizer's data: refused by the record" 2 \
  "written with tokenizer bytes-256, but the model's tokenizer is $name (the checkpoint's)" -- \
  "$W" eval --checkpoint "$T/cky" --data "$T/b" --samples 4
check "train --resume without the file, on another tokenizer's data: refused by the record" 2 \
  "written with tokenizer bytes-256, but the model's tokenizer is $name (the checkpoint resumed from)" -- \
  "$W" "${TR[@]}" --init-from "$T/g0" --data "$T/b" --steps 3 --ckpt-dir "$T/cky" --resume auto
cp -r "$T/ck" "$T/ckz" && mkdir "$T/gs" && cp "$T/g0"/* "$T/gs/" && cp "$T/swapped.json" "$T/gs/tokenizer.json"
check "train --resume with --init-from of another tokenizer than the checkpoint's: refused" 2 \
  "--init-from $T/gs has tokenizer $other ($T/gs/tokenizer.json), but the checkpoint resumed from was trained with $name" -- \
  "$W" "${TR[@]}" --init-from "$T/gs" --data "$T/ds" --steps 3 --ckpt-dir "$T/ckz" --resume auto
mkdir "$T/ckw" && cp "$T/tok.json" "$T/ckw/tokenizer.json"
check "training a model of known tokenizer but no file into a directory keeping another's: refused at the start" 2 \
  "$T/ckw/tokenizer.json is tokenizer $name, but the model trained here is bytes-256, whose tokenizer.json this run does not have" -- \
  "$W" "${TR[@]}" --init-from "$T/g0" --data "$T/b" --steps 1 --ckpt-dir "$T/ckw"
# a model trained on bytes (vocabulary 260) records bytes-256: sample reads and writes bytes
check "a 260-token model trained on byte shards" 0 "" -- "$W" "${TR[@]}" --init-from "$T/g0" --data "$T/b" --steps 1 --ckpt-dir "$T/ckb" --quiet
check "sample --checkpoint of a model trained on bytes: bytes, whatever its vocabulary" 0 "" -- "$W" "${S[@]}" --checkpoint "$T/ckb"
check "... a --tokenizer for it: refused (it records bytes-256)" 2 "is tokenizer $name, but the model's own is bytes-256" -- \
  "$W" "${S[@]}" --checkpoint "$T/ckb" --tokenizer "$T/tok.json"

# stale files of an earlier export go; the user's stay
: >"$T/hf/model-00001-of-00002.safetensors"
echo '{}' >"$T/hf/model.safetensors.index.json"
echo notes >"$T/hf/README.md"
check "export again: stale shards and index removed" 0 "removed $T/hf/model.safetensors.index.json" -- \
  "$W" export --checkpoint "$T/ck" -o "$T/hf"
assert "... the shard is gone" test ! -e "$T/hf/model-00001-of-00002.safetensors"
assert "... README.md stays" test -e "$T/hf/README.md"
check "a model without a tokenizer" 0 "" -- "$W" "${TR[@]}" --init-from "$T/g0" --data "$T/llmc.bin" --steps 1 --ckpt-dir "$T/ck0" --quiet
check "its export says it has no tokenizer" 0 "the export has no tokenizer" -- "$W" export --checkpoint "$T/ck0" -o "$T/hf"
checker "export without a tokenizer over one with (stale tokenizer files removed)" "$T/hf" --no-tokenizer

# ---- Llama-3-like: generation stops at <|end_of_text|> ----
$HF make "$T/l" --arch llama --vocab 261 --kv 2 --seed 5 >/dev/null
cp "$T/l3.json" "$T/l/tokenizer.json"
check "llama with a Llama-3-like tokenizer trains" 0 "" -- "$W" "${TR[@]}" --init-from "$T/l" --data "$T/l3d" --steps 1 --ckpt-dir "$T/ckl" --quiet
check "its export" 0 "" -- "$W" export --checkpoint "$T/ckl" -o "$T/hfl" --dtype bfloat16
checker "llama export" "$T/hfl" --eos '<|end_of_text|>'
check "bos_token_id is <|begin_of_text|>" 0 "259" -- $PY -c "import json; print(json.load(open('$T/hfl/generation_config.json'))['bos_token_id'])"
echo "1..$n"
