#!/bin/bash
# test_sample.sh - `cephalo-worker sample` (docs/sample.md): the KV-cached logits of every step
# against a full-sequence float64 forward (tests/ref/sample_ref.py) for GPT-2 and Llama (GQA,
# rope_theta 500000, tied and untied heads) from Hugging Face directories (--init-from) and from
# checkpoints; greedy decoding token for token equal to the oracle's; top-k 1 and a tiny top-p
# equal greedy; seeds reproduce and differ; sampled tokens stay inside their top-k/top-p sets; a
# tokenizer.json prompt and a stop at end-of-text; the context cap; clear errors.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
B=${BUILD:-build/rel}
W=$PWD/$B/bin/cephalo-worker
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=/usr/bin/python3 # Debian's, with numpy and torch (the oracle)
HF="$PY tests/ref/hf_models.py"
REF="$PY tests/ref/sample_ref.py"
export OMP_NUM_THREADS=2

# oracle NAME HF_DIR DUMP: forwards sample_ref.py's lines as numbered checks
oracle() {
  local out line
  out=$($REF "$2" "$3" 2>&1)
  while IFS= read -r line; do
    case $line in
      "ok - "*) n=$((n + 1)); echo "ok $n - $1: ${line#ok - }" ;;
      "not ok - "*) n=$((n + 1)); echo "not ok $n - $1: ${line#not ok - }" ;;
    esac
  done <<<"$out"
  grep -q '^ok - ' <<<"$out" || { n=$((n + 1)); echo "not ok $n - $1: the oracle failed"; tail -n 3 <<<"$out" | sed 's/^/#   /'; }
}

# sample_checked NAME HF_DIR DUMP sample-args...: runs sample with --dump-logits, then the oracle
sample_checked() {
  local name=$1 dir=$2 dump=$3
  shift 3
  if "$W" sample "$@" --dump-logits "$dump" >"$dump.out" 2>"$dump.err"; then
    oracle "$name" "$dir" "$dump"
  else
    n=$((n + 1)); echo "not ok $n - $name: sample fails"; tail -n 3 "$dump.err" | sed 's/^/#   /'
  fi
}

# ---- Hugging Face directories: logits and greedy decoding against the float64 oracle ----
$HF make "$T/gpt2" --arch gpt2 --seed 3 >/dev/null
$HF make "$T/llama3" --arch llama --kv 2 --rope-theta 500000 --seed 4 >/dev/null # GQA, untied head
$HF make "$T/llama-tied" --arch llama --kv 1 --tied --dtype bf16 --seed 5 >/dev/null
sample_checked "gpt2 greedy" "$T/gpt2" "$T/g0.st" --init-from "$T/gpt2" --prompt "Once upon a time" \
  --max-new-tokens 60 --temperature 0
sample_checked "llama GQA theta 5e5 greedy" "$T/llama3" "$T/l0.st" --init-from "$T/llama3" \
  --prompt "The quick brown fox" --max-new-tokens 100 --temperature 0
sample_checked "llama tied bf16 greedy" "$T/llama-tied" "$T/t0.st" --init-from "$T/llama-tied" \
  --prompt "x" --max-new-tokens 40 --temperature 0
# Qwen2's q/k/v biases and Llama-3.1's rope_scaling through the KV cache
$HF make "$T/qwen2" --arch qwen2 --kv 2 --rope-scaling llama3 --factor 8 --orig 32 --seed 6 >/dev/null
sample_checked "qwen2 (q/k/v biases), llama3 rope_scaling, greedy" "$T/qwen2" "$T/q0.st" --init-from "$T/qwen2" \
  --prompt "The quick brown fox" --max-new-tokens 80 --temperature 0
sample_checked "llama top-k 8 top-p 0.9, 3 samples" "$T/llama3" "$T/l1.st" --init-from "$T/llama3" \
  --prompt "abc" --max-new-tokens 50 --temperature 0.8 --top-k 8 --top-p 0.9 --num-samples 3 --seed 11
sample_checked "llama prefill in chunks of 5" "$T/llama3" "$T/l2.st" --init-from "$T/llama3" \
  --prompt "a prompt of 24 bytes..." --prefill-chunk 5 --max-new-tokens 30 --temperature 0
check "a chunked prefill gives the tokens of a whole one" 0 "" -- cmp <(tail -c +1 "$T/l2.st.out") \
  <("$W" sample --init-from "$T/llama3" --prompt "a prompt of 24 bytes..." --max-new-tokens 30 --temperature 0 2>/dev/null)
sample_checked "gpt2 top-p 0.5" "$T/gpt2" "$T/g1.st" --init-from "$T/gpt2" --prompt "abc" \
  --max-new-tokens 50 --top-p 0.5 --seed 2

# the text: bytes of the prompt, then the continuation, streamed to stdout; stats on stderr
assert "stdout starts with the prompt" grep -q "^Once upon a time" "$T/g0.st.out"
check "stats line on stderr" 0 "prefill 16 tokens" -- cat "$T/g0.st.err"

# ---- the choice of tokens ----
run_json() { "$W" sample --init-from "$T/llama3" --prompt "abc" --max-new-tokens 40 --json "$@" 2>/dev/null; }
greedy=$(run_json --temperature 0)
tokens() { $PY -c 'import json,sys; print(" ".join(str(t) for l in sys.stdin for t in json.loads(l)["tokens"]))'; }
g=$(tokens <<<"$greedy")
check "greedy: 40 tokens as JSON" 0 "" -- test "$(wc -w <<<"$g")" -eq 40
check "top-k 1 = greedy" 0 "" -- test "$(run_json --top-k 1 --seed 5 | tokens)" == "$g"
check "top-p 1e-6 = greedy" 0 "" -- test "$(run_json --top-p 1e-6 --seed 6 | tokens)" == "$g"
a=$(run_json --seed 7 | tokens)
check "the same seed gives the same tokens" 0 "" -- test "$(run_json --seed 7 | tokens)" == "$a"
check "another seed gives other tokens" 0 "" -- test "$(run_json --seed 8 | tokens)" != "$a"
check "sampling at temperature 1 differs from greedy" 0 "" -- test "$a" != "$g"
m=$(run_json --seed 7 --num-samples 3 | tokens)
check "--num-samples 3: sample 1 is the single sample's, the others differ" 0 "" -- $PY -c "
t = '$m'.split(); a = '$a'.split()
assert len(t) == 120 and t[:40] == a and t[40:80] != a and t[80:] != t[40:80]"
"$W" sample --init-from "$T/llama3" --prompt "abc" --max-new-tokens 5 --json --seed 7 --num-samples 3 \
  >"$T/three.jsonl" 2>"$T/three.err"
check "--json numbers the samples as stderr does (1, 2, 3)" 0 "" -- $PY -c "
import json, re
js = [json.loads(l)['sample'] for l in open('$T/three.jsonl')]
err = [int(n) for n in re.findall(r'^sample (\d+):', open('$T/three.err').read(), re.M)]
assert js == err == [1, 2, 3], (js, err)"

# ---- the context: --max-new-tokens capped by the model's positions (128) ----
check "capped at the model's positions" 0 "capped to 124" -- \
  "$W" sample --init-from "$T/gpt2" --prompt "abcd" --max-new-tokens 1000 --temperature 0 --dump-logits "$T/cap.st"
check "the capped run fills all 128 positions" 0 "" -- $PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import st
t, _ = st.read('$T/cap.st'); assert t['sample0.tokens'].shape == (128,) and t['sample0.logits'].shape == (124, 256)"
oracle "gpt2 128 positions" "$T/gpt2" "$T/cap.st"

# ---- a tokenizer.json: BPE prompt, vocabulary check, stop at end-of-text ----
$PY - "$T/tok.json" <<'EOF'
import json, sys
# GPT-2's byte characters: printable bytes stand for themselves, the rest shift to U+0100..
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, k = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + k); k += 1
chars = [chr(c) for b, c in sorted(zip(bs, cs))]
vocab = {ch: i for i, ch in enumerate(chars)}
merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he")]
for a, b in merges:
    vocab[a + b] = len(vocab)
vocab["<|endoftext|>"] = len(vocab)
json.dump({"version": "1.0", "added_tokens": [{"id": vocab["<|endoftext|>"], "content": "<|endoftext|>", "special": True}],
           "normalizer": None, "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "vocab": vocab, "merges": [a + " " + b for a, b in merges]}}, open(sys.argv[1], "w"))
EOF
$HF make "$T/gpt2-260" --arch gpt2 --vocab 260 --seed 8 >/dev/null
sample_checked "gpt2 with tokenizer.json, greedy" "$T/gpt2-260" "$T/k0.st" --init-from "$T/gpt2-260" \
  --tokenizer "$T/tok.json" --prompt "the theory of the" --max-new-tokens 30 --temperature 0
check "the prompt is encoded with the merges (t he Ġthe o r y ...)" 0 "" -- $PY -c "
import sys; sys.path.insert(0, 'tests/ref'); import st
t, _ = st.read('$T/k0.st'); p = [int(x) for x in t['sample0.tokens'][:6]]
assert p == [116, 257, 258, 111, 114, 121], p"
# at temperature 20 every token is nearly equally likely: seed 4's first sample meets <|endoftext|> (259)
check "stops at end-of-text" 0 '"stop":"eos"' -- "$W" sample --init-from "$T/gpt2-260" --tokenizer "$T/tok.json" \
  --prompt "the" --temperature 20 --seed 4 --json --num-samples 4
"$W" sample --init-from "$T/gpt2-260" --tokenizer "$T/tok.json" --prompt "the" --temperature 20 --seed 4 \
  --num-samples 4 >"$T/eos.txt" 2>"$T/eos.err"
check "4 samples, one stopped at end-of-text" 0 "(stopped at end-of-text)" -- cat "$T/eos.err"
check "end-of-text is not printed" 0 "" -- $PY -c "
t = open('$T/eos.txt', encoding='utf-8', errors='replace').read()
assert '--- sample 4 ---' in t and 'endoftext' not in t"

# ---- checkpoints: a run's checkpoint directory (its `latest`) and a checkpoint file ----
"$W" train --data synthetic --model tiny-llama --batch 4 --seq 32 --steps 6 --lr 1e-2 --threads 2 --quiet --ckpt-dir "$T/ck" >/dev/null 2>&1
"$W" export --checkpoint "$T/ck" -o "$T/ck-hf" >/dev/null
sample_checked "tiny-llama checkpoint dir, greedy" "$T/ck-hf" "$T/c0.st" --checkpoint "$T/ck" --prompt "hello" \
  --max-new-tokens 40 --temperature 0
"$W" train --data synthetic --model tiny-gpt --batch 4 --seq 32 --steps 6 --lr 1e-2 --threads 2 --quiet --ckpt-dir "$T/ckg" >/dev/null 2>&1
f=$(ls "$T"/ckg/step_*.safetensors | tail -n 1)
"$W" export --checkpoint "$f" -o "$T/ckg-hf" >/dev/null
sample_checked "tiny-gpt checkpoint file, top-k 20" "$T/ckg-hf" "$T/c1.st" --checkpoint "$f" --prompt "hello" \
  --max-new-tokens 40 --top-k 20 --seed 3

# ---- errors ----
check "no model" 2 "--checkpoint PATH or --init-from DIR" -- "$W" sample --prompt hi
check "both models" 2 "one of them" -- "$W" sample --checkpoint "$T/ck" --init-from "$T/gpt2"
check "missing checkpoint" 2 "$T/nope: cannot open: No such file" -- "$W" sample --checkpoint "$T/nope" --prompt hi
check "bad temperature" 2 "--temperature: '-1' is not a number" -- "$W" sample --init-from "$T/gpt2" --temperature -1
check "bad top-p" 2 "--top-p: '0' is not a number" -- "$W" sample --init-from "$T/gpt2" --top-p 0
check "bad top-k" 2 "--top-k: 'x' is not an integer" -- "$W" sample --init-from "$T/gpt2" --top-k x
check "unknown flag" 2 "unknown option '--bogus'" -- "$W" sample --init-from "$T/gpt2" --bogus
check "missing value" 2 "option '--prompt' needs a value" -- "$W" sample --init-from "$T/gpt2" --prompt
check "bad device" 2 "--device: 'tpu' is not cpu or cuda" -- "$W" sample --init-from "$T/gpt2" --device tpu
check "cuda in a CPU build" 1 "cephalo-worker-cuda" -- "$W" sample --init-from "$T/gpt2" --device cuda
check "prompt and prompt file" 2 "not both" -- "$W" sample --init-from "$T/gpt2" --prompt a --prompt-file /dev/null
$PY -c "print('x' * 200, end='')" >"$T/long.txt"
check "prompt longer than the context" 2 "the prompt has 200 tokens; the model sees 128 positions" -- \
  "$W" sample --init-from "$T/gpt2" --prompt-file "$T/long.txt"
check "a vocabulary of 260 needs a tokenizer" 2 "give --tokenizer" -- "$W" sample --init-from "$T/gpt2-260" --prompt a
check "a tokenizer larger than the vocabulary" 2 "the tokenizer has 260 tokens but the model's vocabulary only 256" -- \
  "$W" sample --init-from "$T/gpt2" --tokenizer "$T/tok.json" --prompt a
"$W" train --data synthetic --model tiny-bert --batch 2 --steps 1 --threads 2 --quiet --dump "$T/bert" >/dev/null 2>&1
check "BERT is refused" 2 "this model is a bert" -- "$W" sample --checkpoint "$T/bert/init.safetensors" --prompt a
check "help" 0 "--top-p P" -- "$W" sample --help
