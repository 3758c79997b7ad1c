#!/bin/bash
# test_hf_roundtrip.sh - an export loads in Hugging Face transformers as it is (docs/import.md
# "Export"): for a GPT-2 model with a GPT-2-style tokenizer and a Llama model with a Llama-3-style
# one (<|begin_of_text|>, <|end_of_text|>), trained two steps on `cephalo data` shards and exported
# (bfloat16 and float32), tests/gpu/hf_roundtrip.py checks that tokenizers and AutoTokenizer encode
# a held-out text to `cephalo data`'s ids and that AutoModelForCausalLM's greedy generate() gives
# `cephalo-worker sample`'s tokens. Needs transformers and tokenizers (the lent GPU machines have
# them); without them each check is a SKIP. The models run on the CPU: this is about the files.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
B=${BUILD:-build/rel}
W=$PWD/$B/bin/cephalo-worker
[ -x "$W" ] || W=$PWD/$B/bin/cephalo-worker-cuda
C=$PWD/$B/bin/cephalo
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=
for p in /usr/bin/python3 python3; do
  if $p -c 'import transformers, tokenizers, torch, numpy' 2>/dev/null; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
  echo "ok 1 - transformers round trip # SKIP no Python with transformers, tokenizers, torch and numpy"
  exit 0
fi
export OMP_NUM_THREADS=4

# the tokenizers of tests/cli/test_tokid.sh (one definition: its mktok)
eval "$(sed -n '/^mktok() {/,/^}/p' tests/cli/test_tokid.sh)"
mktok "$T/gpt2.json" gpt2
mktok "$T/l3.json" llama3
$PY -c "print('the theory of the cat; the other theory. ' * 80)" >"$T/train.txt"
printf 'Held-out: the thermometer read 21.5 degrees; theatre tickets cost \xe2\x82\xac12 \xe2\x80\x94 then rain.\n\tTabs, "quotes" and the end.' >"$T/held.txt"

# run NAME ARCH TOKENIZER EXTRA_DATA_ARGS DTYPE
run() {
  local name=$1 arch=$2 tokf=$3 bos=$4 dtype=$5 vocab
  vocab=$($PY -c "import json,sys; d=json.load(open(sys.argv[1])); print(max(list(d['model']['vocab'].values()) + [a['id'] for a in d['added_tokens']]) + 1)" "$tokf")
  $PY tests/ref/hf_models.py make "$T/$name" --arch "$arch" --vocab "$vocab" --seed 3 >/dev/null
  cp "$tokf" "$T/$name/tokenizer.json"
  "$C" data -o "$T/$name-d" --tokenizer "$tokf" $bos --doc-sep '. ' "$T/train.txt" >/dev/null 2>&1
  "$C" data -o "$T/$name-held" --tokenizer "$tokf" $bos "$T/held.txt" >/dev/null 2>&1
  check "$name: trains 2 steps" 0 "" -- "$W" train --init-from "$T/$name" --data "$T/$name-d" --batch 2 --seq 16 \
    --steps 2 --lr 1e-3 --ckpt-dir "$T/$name-ck" --quiet
  check "$name: export --dtype $dtype" 0 "" -- "$W" export --checkpoint "$T/$name-ck" -o "$T/$name-hf" --dtype "$dtype"
  check "$name: export (float32, for generate)" 0 "" -- "$W" export --checkpoint "$T/$name-ck" -o "$T/$name-hf32"
  "$W" sample --checkpoint "$T/$name-ck" --prompt "the theory" --max-new-tokens 16 --temperature 0 --json \
    --dump-logits "$T/$name.dump" >"$T/$name.json" 2>/dev/null
  local line out
  out=$($PY tests/gpu/hf_roundtrip.py "$T/$name-hf32" "$T/$name.json" "$T/$name.dump" "$T/held.txt" \
    "$T/$name-held/train_000000.bin" $bos 2>&1)
  while IFS= read -r line; do
    case $line in
      "ok - "*) n=$((n + 1)); echo "ok $n - $name: ${line#ok - }" ;;
      "not ok - "*) n=$((n + 1)); echo "not ok $n - $name: ${line#not ok - }" ;;
      "#"*) echo "$line" ;;
    esac
  done <<<"$out"
  grep -q '^ok - ' <<<"$out" || { n=$((n + 1)); echo "not ok $n - $name: hf_roundtrip.py failed"; tail -n 5 <<<"$out" | sed 's/^/#   /'; }
  check "$name: the $dtype export loads in transformers" 0 "ok" -- $PY -c "
import torch, transformers
m = transformers.AutoModelForCausalLM.from_pretrained('$T/$name-hf', torch_dtype='auto')
print('ok' if next(m.parameters()).dtype == getattr(torch, '$dtype') else 'dtype %s' % next(m.parameters()).dtype)"
}
run gpt2 gpt2 "$T/gpt2.json" "" bfloat16
run llama3 llama "$T/l3.json" --bos float16
echo "1..$n"
