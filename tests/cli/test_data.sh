#!/usr/bin/env bash
# CLI tests of `cephalo data`: byte-level token shards (headers, sizes, contents, shard splitting,
# --val-fraction, stdin), synthetic CIMG image files, and bad input (exit 2 with a message).
# Prints "ok N - name" / "not ok N - name" lines.
set -u
BIN=${BUILD:-build/rel}/bin/cephalo
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"

# shard_info FILE -> "magic version count size" from the header (od: little-endian host)
shard_info() {
  local h
  h=$(od -A n -t d4 -N 12 "$1" | tr -s ' ')
  echo "${h# } $(stat -c %s "$1")"
}

# expect NAME ACTUAL EXPECTED
expect() {
  n=$((n + 1))
  if [ "$2" == "$3" ]; then echo "ok $n - $1"; else echo "not ok $n - $1"; echo "#   got:      $2"; echo "#   expected: $3"; fi
}

# token stream of shards (as decimal uint16, one per line) -> bytes, to compare with the input
shard_tokens() {
  for f in "$@"; do od -A n -v -t u2 -j 1024 "$f"; done | tr -s ' ' '\n' | sed '/^$/d'
}

printf 'Hello, Cephalo!\nA heterogeneous cluster trains one model.\n' >"$T/a.txt"   # 58 bytes
printf 'second file \xc3\xa9\xff\n' >"$T/b.txt"                                   # 16 bytes
A_BYTES=$(stat -c %s "$T/a.txt")
B_BYTES=$(stat -c %s "$T/b.txt")
TOTAL=$((A_BYTES + B_BYTES))

check "data --help" 0 "usage: cephalo data -o OUTDIR" -- "$BIN" data --help
check "top-level help lists data" 0 "data      prepare training data" -- "$BIN" --help

# one shard holding everything
check "one file" 0 "1 file, $A_BYTES bytes -> $A_BYTES tokens" -- "$BIN" data -o "$T/one" "$T/a.txt"
expect "one shard header and size" "$(shard_info "$T/one/train_000000.bin")" "20240520 1 $A_BYTES $((1024 + 2 * A_BYTES))"
expect "only one shard" "$(ls "$T/one")" "train_000000.bin"
expect "tokens are the bytes" "$(shard_tokens "$T/one/train_000000.bin" | tr '\n' ' ')" \
  "$(od -A n -v -t u1 "$T/a.txt" | tr -s ' ' '\n' | sed '/^$/d' | tr '\n' ' ')"

# several files, several shards of 20 tokens, a validation split of the last 25%
check "shards and val" 0 "2 files, $TOTAL bytes -> $TOTAL tokens" -- \
  "$BIN" data -o "$T/split" --shard-tokens 20 --val-fraction 0.25 "$T/a.txt" "$T/b.txt"
VAL=$(( (TOTAL + 2) / 4 ))   # round(74 * 0.25) = 19 (18.5 rounds up)
TRAIN=$((TOTAL - VAL))
expect "shard files" "$(ls "$T/split" | tr '\n' ' ')" "train_000000.bin train_000001.bin train_000002.bin val_000000.bin "
expect "train shard 0" "$(shard_info "$T/split/train_000000.bin")" "20240520 1 20 1064"
expect "train shard 1" "$(shard_info "$T/split/train_000001.bin")" "20240520 1 20 1064"
expect "train shard 2 holds the rest" "$(shard_info "$T/split/train_000002.bin")" "20240520 1 $((TRAIN - 40)) $((1024 + 2 * (TRAIN - 40)))"
expect "val shard" "$(shard_info "$T/split/val_000000.bin")" "20240520 1 $VAL $((1024 + 2 * VAL))"
expect "train+val is the input in order" \
  "$(shard_tokens "$T"/split/train_00000{0,1,2}.bin "$T/split/val_000000.bin" | tr '\n' ' ')" \
  "$(cat "$T/a.txt" "$T/b.txt" | od -A n -v -t u1 | tr -s ' ' '\n' | sed '/^$/d' | tr '\n' ' ')"
expect "no temporary files left" "$(ls "$T/split" | grep -c tmp)" "0"
check "summary names the val shard" 0 "val:   $VAL tokens in 1 shard" -- \
  "$BIN" data -o "$T/split2" --shard-tokens 20 --val-fraction 0.25 "$T/a.txt" "$T/b.txt"
# issue 38: the summary says what the worker does with the directory (it said the directory would
# include the val shards; pick_role leaves them out of training and validates on them alone)
out=$("$BIN" data -o "$T/split3" --shard-tokens 20 --val-fraction 0.25 "$T/a.txt" "$T/b.txt" 2>&1)
check "summary: train on the directory, validate on it" 0 \
  "train with --data $T/split3 (its val shards are left out of training) and --val-data $T/split3 (the val shards alone)" -- echo "$out"
assert "... never that the directory includes the val shards" test -z "$(grep 'would include' <<<"$out")"
# a directory with a validation split: training leaves val_000000.bin out, validation takes only it
W=${BUILD:-build/rel}/bin/cephalo-worker
check "training on the directory leaves its validation shard out, and says so" 0 \
  "1 validation shard left out of the training data (val_000000.bin); give it with --val-data" -- \
  "$W" train --model tiny-gpt --batch 2 --seq 4 --steps 1 --threads 1 --data "$T/split" --ckpt-dir "$T/splitck"
ev() { "$W" eval --checkpoint "$T/splitck" --data "$1" --samples 4 --threads 1 --json 2>/dev/null | grep -o '"val_loss":[^,]*'; }
check "eval --data on the directory reads its validation shard only" 0 "" -- test "$(ev "$T/split")" = "$(ev "$T/split/val_000000.bin")" -a -n "$(ev "$T/split")"
mkdir -p "$T/onlyval" && cp "$T/split/val_000000.bin" "$T/onlyval/"
check "as the summary says: --data and --val-data on the directory train on train_*, validate on val_*" 0 \
  "1 validation shard left out of the training data (val_000000.bin)" -- \
  "$W" train --model tiny-gpt --batch 2 --seq 4 --steps 1 --threads 1 --data "$T/split3" --val-data "$T/split3" --val-every 1 --val-samples 2
check "a directory of validation shards alone is refused for training" 2 "only validation shards (val_000000.bin)" -- \
  "$W" train --model tiny-gpt --batch 2 --seq 4 --steps 1 --threads 1 --data "$T/onlyval"
check "suffix K" 0 "train: $TOTAL tokens in 1 shard" -- "$BIN" data -o "$T/k" --shard-tokens 1K "$T/a.txt" "$T/b.txt"

# stdin
check "stdin" 0 "1 file, 11 bytes -> 11 tokens" -- bash -c "printf 'from stdin\n' | '$BIN' data -o '$T/stdin' -"
expect "stdin shard" "$(shard_info "$T/stdin/train_000000.bin")" "20240520 1 11 1046"

# a rerun with fewer shards warns about the stale ones
check "stale shards warned about" 0 "left from an earlier run" -- "$BIN" data -o "$T/split" --shard-tokens 1000 "$T/a.txt"

# synthetic images
check "images" 0 "10 synthetic images of 3x8x8, 4 classes" -- \
  "$BIN" data --images -o "$T/img.cimg" --synthetic 10 --classes 4 --size 8
expect "image file size" "$(stat -c %s "$T/img.cimg")" "$((64 + 10 * (2 + 3 * 64)))"
expect "image header" "$(head -c 4 "$T/img.cimg")$(od -A n -w24 -j 4 -N 24 -t u4 "$T/img.cimg" | tr -s ' ')" "CIMG 1 10 3 8 8 4"
"$BIN" data --images -o "$T/img2.cimg" --synthetic 10 --classes 4 --size 8 >/dev/null 2>&1
expect "images are deterministic" "$(cmp "$T/img.cimg" "$T/img2.cimg" && echo same)" "same"
"$BIN" data --images -o "$T/img3.cimg" --synthetic 10 --classes 4 --size 8 --seed 2 >/dev/null 2>&1
expect "another seed, other images" "$(cmp -s "$T/img.cimg" "$T/img3.cimg" || echo differ)" "differ"
check "one channel" 0 "of 1x5x5" -- "$BIN" data --images -o "$T/g.cimg" --synthetic 3 --classes 2 --size 5 --channels 1

# bad input: exit 2 with a message
check "no -o" 2 "-o OUTPUT is required" -- "$BIN" data "$T/a.txt"
check "no input" 2 "no input FILE" -- "$BIN" data -o "$T/x"
check "missing file" 2 "nope.txt: cannot open: No such file" -- "$BIN" data -o "$T/x" "$T/nope.txt"
check "directory as input" 2 "is a directory" -- "$BIN" data -o "$T/x" "$T"
check "empty input" 2 "the input is empty" -- "$BIN" data -o "$T/x" /dev/null
: >"$T/file"
check "output under a file" 2 "cannot create the directory" -- "$BIN" data -o "$T/file/sub" "$T/a.txt"
check "output is a file" 2 "is a file, expected a directory" -- "$BIN" data -o "$T/file" "$T/a.txt"
check "output parent missing" 2 "cannot create the directory" -- "$BIN" data -o "$T/no/such/dir" "$T/a.txt"
check "shard tokens zero" 2 "--shard-tokens: '0'" -- "$BIN" data -o "$T/x" --shard-tokens 0 "$T/a.txt"
check "shard tokens junk" 2 "--shard-tokens: 'lots'" -- "$BIN" data -o "$T/x" --shard-tokens lots "$T/a.txt"
check "shard tokens too many" 2 "--shard-tokens: '3G'" -- "$BIN" data -o "$T/x" --shard-tokens 3G "$T/a.txt"
check "val fraction 1" 2 "--val-fraction: '1'" -- "$BIN" data -o "$T/x" --val-fraction 1 "$T/a.txt"
check "val fraction negative" 2 "--val-fraction: '-0.1'" -- "$BIN" data -o "$T/x" --val-fraction -0.1 "$T/a.txt"
check "unknown option" 2 "unknown option '--shards'" -- "$BIN" data -o "$T/x" --shards 3 "$T/a.txt"
check "images without --synthetic" 2 "--images needs --synthetic N" -- "$BIN" data --images -o "$T/i.cimg" --classes 3 --size 8
check "images without --classes" 2 "--images needs --classes K" -- "$BIN" data --images -o "$T/i.cimg" --synthetic 3 --size 8
check "images bad size" 2 "--size: '0'" -- "$BIN" data --images -o "$T/i.cimg" --synthetic 3 --classes 2 --size 0
check "images bad classes" 2 "--classes: '70000'" -- "$BIN" data --images -o "$T/i.cimg" --synthetic 3 --classes 70000 --size 8
check "images unwritable" 2 "i.cimg: cannot write: Not a directory" -- "$BIN" data --images -o "$T/file/i.cimg" --synthetic 3 --classes 2 --size 8
check "image options without --images" 2 "--classes needs --images" -- "$BIN" data -o "$T/x" --classes 3 "$T/a.txt"
check "text options with --images" 2 "not --images" -- "$BIN" data --images -o "$T/i.cimg" --synthetic 3 --classes 2 --size 8 --val-fraction 0.1

# ---- --tokenizer with a small hand-made tokenizer.json (tests/cli/test_tokenizer.sh checks real
# ones against independent implementations): byte-level, ids 0..255 the bytes, "ab" 256, and an
# end-of-text token at id 70000, so the vocabulary needs version 2 (uint32) shards
python3 - "$T/tok.json" <<'PY'
import json, sys
printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
vocab, nxt = {}, 256
for b in range(256):
    if b in printable: vocab[chr(b)] = b
    else: vocab[chr(nxt)] = b; nxt += 1
vocab["ab"] = 256
vocab["<|endoftext|>"] = 70000
json.dump({"added_tokens": [{"id": 70000, "content": "<|endoftext|>", "special": True}],
           "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": ["a b"]}}, open(sys.argv[1], "w"))
PY
printf 'ab a' >"$T/d1.txt"
printf 'b\nab' >"$T/d2.txt"
check "--tokenizer" 0 "2 files, 2 documents, 8 bytes -> 8 tokens (byte-level BPE, GPT-2 pattern; vocab 70001, EOS 70000; shard version 2, uint32 tokens)" -- \
  "$BIN" data -o "$T/tk" --tokenizer "$T/tok.json" "$T/d1.txt" "$T/d2.txt"
expect "version 2 header and size" "$(shard_info "$T/tk/train_000000.bin")" "20240520 2 8 $((1024 + 4 * 8))"
expect "uint32 tokens, EOS after each document" "$(od -A n -v -t u4 -j 1024 "$T/tk/train_000000.bin" | tr -s ' \n' ' ')" \
  " 256 32 97 70000 98 10 256 70000 "
printf 'base: tiny-llama\nname: tok-llama\nvocab: 70001\nseq: 4\n' >"$T/tok-llama.yaml"
check "the worker trains on version 2 shards" 0 "16 tokens, 2 windows of 4+1, clm, vocab 70001" -- \
  "${BUILD:-build/rel}/bin/cephalo-worker" train --model "$T/tok-llama.yaml" --batch 1 --steps 3 --threads 1 \
  --data "$T/tk,$T/tk"
check "--shard-tokens with version 2" 0 "" -- "$BIN" data -o "$T/tk2" --tokenizer "$T/tok.json" --shard-tokens 4 "$T/d1.txt" "$T/d2.txt"
expect "shards of 4 tokens" "$(ls "$T/tk2" | tr '\n' ' ')" "tokenizer.json train_000000.bin train_000001.bin "
check "--val-fraction 0.5: document 1 to val" 0 "val:   4 tokens, 1 documents in 1 shard" -- \
  "$BIN" data -o "$T/tk3" --tokenizer "$T/tok.json" --val-fraction 0.5 "$T/d1.txt" "$T/d2.txt"
check "--val-fraction with too few files" 2 "--val-fraction 0.1: 2 files (each one document), too few for one validation document" -- \
  "$BIN" data -o "$T/x" --tokenizer "$T/tok.json" --val-fraction 0.1 "$T/d1.txt" "$T/d2.txt"
check "--val-fraction with too few documents" 2 "--val-fraction 0.1: 2 documents, too few for one validation document" -- \
  "$BIN" data -o "$T/x" --tokenizer "$T/tok.json" --val-fraction 0.1 --doc-sep '\n' "$T/d2.txt"
check "--doc-sep" 0 "1 file, 2 documents" -- "$BIN" data -o "$T/tk4" --tokenizer "$T/tok.json" --doc-sep '\n' "$T/d2.txt"
check "--eos names a token" 0 "EOS 256" -- "$BIN" data -o "$T/tk5" --tokenizer "$T/tok.json" --eos ab "$T/d1.txt"
check "--eos unknown" 2 "--eos: no token \"</s>\" in the tokenizer" -- "$BIN" data -o "$T/x" --tokenizer "$T/tok.json" --eos '</s>' "$T/d1.txt"
check "--bos without one" 2 "--bos: no beginning-of-text token" -- "$BIN" data -o "$T/x" --tokenizer "$T/tok.json" --bos "$T/d1.txt"
check "--eos without --tokenizer" 2 "--eos needs --tokenizer" -- "$BIN" data -o "$T/x" --eos ab "$T/d1.txt"
check "--tokenizer with --images" 2 "not --images" -- "$BIN" data --images -o "$T/i.cimg" --synthetic 3 --classes 2 --size 8 --tokenizer "$T/tok.json"
check "missing tokenizer" 2 "nope.json: cannot open" -- "$BIN" data -o "$T/x" --tokenizer "$T/nope.json" "$T/d1.txt"
printf '{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a c"]}}' >"$T/badtok.json"
check "bad tokenizer: the field is named" 2 "badtok.json: model.merges[0]: \"c\" is not in model.vocab" -- \
  "$BIN" data -o "$T/x" --tokenizer "$T/badtok.json" "$T/d1.txt"
printf '{"model": {"type": "WordPiece", "vocab": {}}}' >"$T/badtok.json"
check "bad tokenizer: WordPiece" 2 "model.type: \"WordPiece\" is not supported (expected \"BPE\")" -- \
  "$BIN" data -o "$T/x" --tokenizer "$T/badtok.json" "$T/d1.txt"
printf '{"model": ' >"$T/badtok.json"
check "bad tokenizer: JSON syntax" 2 "badtok.json:1:" -- "$BIN" data -o "$T/x" --tokenizer "$T/badtok.json" "$T/d1.txt"
printf 'ab\xff\xfe\xc3' >"$T/bin.txt"
check "bytes that are not UTF-8 are tokens too" 0 "5 bytes -> 5 tokens" -- "$BIN" data -o "$T/tk6" --tokenizer "$T/tok.json" "$T/bin.txt"
expect "nothing written on bad input" "$(ls "$T" | grep -c '^x$')" "0"
