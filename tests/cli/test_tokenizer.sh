#!/usr/bin/env bash
# The tokenizers (worker/formats/tokenizer.c) against independent implementations from the npm
# registry, token for token, on a deterministic corpus of more than 1 MB (prose, code, numbers,
# whitespace runs, CJK, emoji, combining marks, ...; tests/tok/tok.mjs): GPT-2 against js-tiktoken,
# Llama-2 against llama-tokenizer-js, Llama-3 against llama3-tokenizer-js, with tokenizer.json files
# built from those packages' own vocabularies and merges; decode(encode(x)) == x for every document;
# then `cephalo data --tokenizer` end to end (shard contents, EOS, the document split, versions).
# The packages come from mk/npm.sh (cached in ~/.cache/cephalo-npm); when the registry cannot be
# reached the test prints a '#' line and checks nothing else. Prints "ok N - name" lines.
set -u
BUILD=${BUILD:-build/rel}
BIN=$BUILD/bin/cephalo
CHECK=$BUILD/tests/tok/tokcheck
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"

# expect NAME ACTUAL EXPECTED
expect() {
  n=$((n + 1))
  if [ "$2" == "$3" ]; then echo "ok $n - $1"; else echo "not ok $n - $1"; echo "#   got:      $2"; echo "#   expected: $3"; fi
}

mods=$("$ROOT/mk/npm.sh" 2>"$T/npm.log")
rc=$?
if [ $rc -eq 3 ]; then
  echo "# skipped: the npm registry is unreachable ($(tail -n 1 "$T/npm.log")); no tokenizer agreement checked"
  exit 0
fi
n=1
if [ $rc -ne 0 ]; then echo "not ok 1 - fetch the npm tokenizers (mk/npm.sh exit $rc)"; sed 's/^/#   /' "$T/npm.log" | tail -5; exit 0; fi
echo "ok 1 - fetch the npm tokenizers"
if ! command -v node >/dev/null; then n=2; echo "not ok 2 - node is installed (make deps)"; exit 0; fi
export NODE_MODULES=$mods
TOK="node $ROOT/tests/tok/tok.mjs"

check "tokenizer.json files from the packages' vocabularies" 0 "" -- $TOK build "$T/tok"
check "a corpus of 1.2 MB" 0 "" -- $TOK corpus "$T/corpus.json" 1200000
for k in gpt2 llama2 llama3; do
  case $k in gpt2) ref=js-tiktoken ;; llama2) ref=llama-tokenizer-js ;; llama3) ref=llama3-tokenizer-js ;; esac
  check "$k: $ref encodes the corpus" 0 "" -- $TOK encode $k "$T/corpus.json" "$T/$k.ids.json"
  out=$("$CHECK" "$T/tok/$k.json" "$T/corpus.json" "$T/$k.ids.json" 2>&1)
  rc=$?
  n=$((n + 1))
  bytes=$(sed -n 's/.* documents, \([0-9]*\) bytes.*/\1/p' <<<"$out" | tail -n 1)
  if [ $rc -eq 0 ] && [ "${bytes:-0}" -ge 1000000 ] && grep -q "; 0 differ from the reference, 0 do not round-trip" <<<"$out"; then
    echo "ok $n - $k: every token as $ref, and decode(encode(x)) == x ($(tail -n 1 <<<"$out" | sed 's/^[^:]*: //'))"
  else
    echo "not ok $n - $k: agreement with $ref (exit $rc)"; sed 's/^/#   /' <<<"$out" | tail -20
  fi
done

# ---- cephalo data --tokenizer, end to end ----
# shard_info FILE -> "magic version count size"
shard_info() {
  local h
  h=$(od -A n -t d4 -N 12 "$1" | tr -s ' ')
  echo "${h# } $(stat -c %s "$1")"
}
# shard_ids VERSION FILE... -> one token a line
shard_ids() {
  local w=u2
  [ "$1" = 2 ] && w=u4
  shift
  for f in "$@"; do od -A n -v -t $w -j 1024 "$f"; done | tr -s ' ' '\n' | sed '/^$/d'
}
$TOK docs "$T/corpus.json" "$T/docs" 40
for k in gpt2 llama2 llama3; do
  case $k in gpt2) eos=50256 v=1 ;; llama2) eos=2 v=1 ;; llama3) eos=128001 v=2 ;; esac
  check "$k: cephalo data --tokenizer, 40 documents, --val-fraction 0.1" 0 "40 documents" -- \
    "$BIN" data -o "$T/out_$k" --tokenizer "$T/tok/$k.json" --val-fraction 0.1 --shard-tokens 5000 "$T"/docs/d*.txt
  expect "$k: shard version $v" "$(shard_info "$T/out_$k/train_000000.bin" | cut -d' ' -f1,2)" "20240520 $v"
  expect "$k: train shards hold the train documents' tokens, each with EOS $eos" \
    "$(shard_ids $v "$T"/out_$k/train_*.bin | md5sum)" "$($TOK expect "$T/$k.ids.json" 40 0.1 $eos train | md5sum)"
  expect "$k: val shards hold documents 9, 19, 29, 39" \
    "$(shard_ids $v "$T"/out_$k/val_*.bin | md5sum)" "$($TOK expect "$T/$k.ids.json" 40 0.1 $eos val | md5sum)"
done
check "progress line with MB/s on stderr" 0 "MB/s" -- "$BIN" data -o "$T/p" --tokenizer "$T/tok/gpt2.json" "$T/docs/d000.txt"
# --doc-sep: one file cut into documents gives what the documents as files give
sep=$'\n<doc>\n'
{ cat "$T/docs/d000.txt"; printf '%s' "$sep"; cat "$T/docs/d001.txt"; printf '%s' "$sep"; cat "$T/docs/d002.txt"; } >"$T/joined.txt"
check "--doc-sep" 0 "3 documents" -- "$BIN" data -o "$T/sep" --tokenizer "$T/tok/llama3.json" --doc-sep '\n<doc>\n' "$T/joined.txt"
"$BIN" data -o "$T/three" --tokenizer "$T/tok/llama3.json" "$T"/docs/d00[012].txt >/dev/null 2>&1
assert "--doc-sep shards equal those of the documents as files" cmp "$T/sep/train_000000.bin" "$T/three/train_000000.bin"
check "--bos puts <|begin_of_text|> first" 0 "BOS first" -- "$BIN" data -o "$T/bos" --tokenizer "$T/tok/llama3.json" --bos "$T/docs/d000.txt"
expect "--bos: the first token is 128000" "$(shard_ids 2 "$T/bos/train_000000.bin" | head -n 1)" 128000
check "--bos without a BOS token" 2 "--bos: no beginning-of-text token" -- "$BIN" data -o "$T/x" --tokenizer "$T/tok/gpt2.json" --bos "$T/docs/d000.txt"
check "--special: <|endoftext|> in the text is the token" 0 "" -- bash -c "printf 'a<|endoftext|>b' >'$T/sp.txt' && '$BIN' data -o '$T/sp' --tokenizer '$T/tok/gpt2.json' --special '$T/sp.txt'"
expect "--special: a EOS b EOS" "$(shard_ids 1 "$T/sp/train_000000.bin" | tr '\n' ' ')" "64 50256 65 50256 "
