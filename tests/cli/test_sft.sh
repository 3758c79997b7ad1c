#!/bin/bash
# test_sft.sh - supervised fine-tuning data (docs/data.md "Fine-tuning data"): `cephalo data --sft`
# turns JSONL prompt/response lines and chat "messages" lines (with a --chat-template file) into
# shards with a loss mask beside each, which an independent reader (tests/ref/sft_check.py) decodes
# back into the examples' prompt and response runs; training counts the loss on response tokens
# only: the dumped targets are the shards' windows with the mask applied, and the float64 oracle
# (tests/ref/oracle.py, loss_mean "targets") agrees on the step-0 loss, gradients, the steps'
# losses and the final parameters; 1 rank and an uneven 2-rank plan train the same; --epochs sets
# the steps from the data's size; bad lines, missing fields and --steps with --epochs are refused.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
B=${BUILD:-build/rel}
W=$PWD/$B/bin/cephalo-worker
C=$PWD/$B/bin/cephalo
T=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
PY=/usr/bin/python3 # Debian's, with numpy and torch (the oracle)
PT="$PY tests/fsdp/plan_tool.py"
export OMP_NUM_THREADS=1
unset CEPHALO_METRICS_PORT CEPHALO_PLAN
. tests/cli/ranks.sh
PLAN_TOL=1e-6 # across plans: other microbatch sizes, sums over ranks in another order (test_eval.sh)
rel_close() { $PY -c "import sys; a,b,t=map(float,sys.argv[1:]); sys.exit(0 if abs(a-b)<=t*abs(b) else 1)" "$1" "$2" "$3"; }
losses() { $PY -c "
import json, sys
print(' '.join(str(json.loads(l)['loss']) for l in open(sys.argv[1]) if '\"loss\"' in l))" "$1"; }
# checks PROGRAM ARGS...: a checker's "ok - " / "not ok - " lines as numbered checks
checks() {
  local out line
  out=$("$@" 2>&1)
  while IFS= read -r line; do
    case $line in
      "ok - "*) n=$((n + 1)); echo "ok $n - ${line#ok - }" ;;
      "not ok - "*) n=$((n + 1)); echo "not ok $n - ${line#not ok - }" ;;
    esac
  done <<<"$out"
  grep -q '^ok - ' <<<"$out" || { n=$((n + 1)); echo "not ok $n - $*: no check ran"; tail -n 3 <<<"$out" | sed 's/^/#   /'; }
}

# ---- a byte-level BPE tokenizer (GPT-2's byte characters, three merges) with an end-of-text
# token and three chat markers as added tokens: 263 tokens; a tiny GPT with that vocabulary ----
$PY - "$T/tok.json" <<'EOF'
import json, sys
bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
cs, k = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + k); k += 1
vocab = {chr(c): i for i, (b, c) in enumerate(sorted(zip(bs, cs)))}
merges = [("\u0120", "t"), ("h", "e"), ("\u0120t", "he")]
for a, b in merges:
    vocab[a + b] = len(vocab)
added = []
for s in ["<|endoftext|>", "<|user|>", "<|assistant|>", "<|end|>"]:
    vocab[s] = len(vocab)
    added.append({"id": vocab[s], "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                  "normalized": False, "special": True})
json.dump({"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
           "post_processor": None, "decoder": {"type": "ByteLevel"},
           "model": {"type": "BPE", "dropout": None, "vocab": vocab, "merges": [a + " " + b for a, b in merges]}},
          open(sys.argv[1], "w"))
EOF
printf 'base: tiny-gpt\nname: sft-gpt\nvocab: 263\n' >"$T/m.yaml"

# 40 prompt/response examples of varied lengths; 12 chat examples
$PY - "$T" <<'EOF'
import json, sys
d = sys.argv[1]
words = "the cat sat on the mat and then the other theory held".split()
with open(d + "/pairs.jsonl", "w") as f:
    for i in range(40):
        p = " ".join(words[(i + j) % len(words)] for j in range(3 + i % 7))
        r = " ".join(words[(2 * i + j) % len(words)] for j in range(1 + i % 5))
        f.write(json.dumps({"id": i, "prompt": "Q: " + p + "?\nA:", "response": " " + r}) + "\n")
        if i % 9 == 4:
            f.write("\n")  # blank lines are skipped
with open(d + "/chat.jsonl", "w") as f:
    for i in range(12):
        m = [{"role": "user", "content": "say %s" % words[i % len(words)]},
             {"role": "assistant", "content": "%s %s" % (words[i % len(words)], words[(i + 1) % len(words)])}]
        if i % 3 == 0:
            m = [{"role": "system", "content": "be brief"}] + m + [{"role": "user", "content": "again"},
                                                                   {"role": "assistant", "content": "the end"}]
        f.write(json.dumps({"messages": m}) + "\n")
json.dump({"bos": False, "eos": True, "roles": {
    "system": {"prefix": "<|user|>system: ", "suffix": "\n"},
    "user": {"prefix": "<|user|>", "suffix": "\n"},
    "assistant": {"prefix": "<|assistant|>", "suffix": "<|end|>\n"}}}, open(d + "/tmpl.json", "w"))
EOF

# ---- cephalo data --sft: the shards and masks, read back independently ----
check "data --sft: prompt/response lines" 0 "fine-tuning: 40 examples" -- \
  "$C" data -o "$T/d" --tokenizer "$T/tok.json" --sft --shard-tokens 700 "$T/pairs.jsonl"
check "each shard has its mask beside it" 0 "" -- test -s "$T/d/train_000000.mask" -a -s "$T/d/train_000001.mask"
checks $PY tests/ref/sft_check.py examples "$T/d" "$T/tok.json" "$T/pairs.jsonl"
check "data --sft --chat-template: messages lines" 0 "fine-tuning: 12 examples" -- \
  "$C" data -o "$T/c" --tokenizer "$T/tok.json" --sft --chat-template "$T/tmpl.json" "$T/chat.jsonl"
checks $PY tests/ref/sft_check.py examples "$T/c" "$T/tok.json" "$T/chat.jsonl" --template "$T/tmpl.json"
check "both forms in one run, with a validation split" 0 "val:" -- \
  "$C" data -o "$T/both" --tokenizer "$T/tok.json" --sft --chat-template "$T/tmpl.json" --val-fraction 0.2 \
  "$T/pairs.jsonl" "$T/chat.jsonl"
check "the val shard has its mask" 0 "" -- test -s "$T/both/val_000000.mask"
check "--max-example-tokens drops the longer examples, counted" 0 "examples dropped, 0 truncated" -- \
  "$C" data -o "$T/drop" --tokenizer "$T/tok.json" --sft --max-example-tokens 34 "$T/pairs.jsonl"
d1=$(grep -o '[0-9]* examples dropped' <<<"$("$C" data -o "$T/drop2" --tokenizer "$T/tok.json" --sft --max-example-tokens 34 "$T/pairs.jsonl" 2>/dev/null)")
ok=1; [ "${d1%% *}" -gt 0 ] 2>/dev/null && ok=0
n=$((n + 1)); [ $ok = 0 ] && echo "ok $n - some examples are over 34 tokens ($d1)" || echo "not ok $n - no example dropped ($d1)"
# truncated: cut to 30 tokens; dropped after all when the prompt alone fills them (no token with loss left)
out=$("$C" data -o "$T/trunc" --tokenizer "$T/tok.json" --sft --max-example-tokens 30 --overlong truncate "$T/pairs.jsonl" 2>/dev/null)
kept=$(grep -o 'fine-tuning: [0-9]*' <<<"$out" | tr -dc 0-9) drop=$(grep -o '[0-9]* examples dropped' <<<"$out" | tr -dc 0-9)
cut=$(grep -o '[0-9]* truncated' <<<"$out" | tr -dc 0-9)
n=$((n + 1))
[ -n "$kept" ] && [ "${cut:-0}" -gt 0 ] && [ $((kept + ${drop:-99})) = 40 ] &&
  echo "ok $n - --overlong truncate: $cut cut to 30 tokens, $drop without a response token left dropped, $kept kept" ||
  echo "not ok $n - --overlong truncate: kept $kept, dropped $drop, truncated $cut of 40"
$PY - "$T/trunc/train_000000.bin" <<'EOF2' && ok=0 || ok=1
import struct, sys
raw = open(sys.argv[1], "rb").read()
h = struct.unpack("<256i", raw[:1024])
toks = struct.unpack("<%dH" % h[2], raw[1024:])
# examples end at EOS (259) unless truncated; each piece between EOSes is at most 30 tokens
pieces, cur = [], 0
m = open(sys.argv[1][:-4] + ".mask", "rb").read()[1024:]
starts = [i for i in range(len(toks)) if m[i] == 0 and (i == 0 or m[i - 1] == 1)]  # a prompt after a response
starts.append(len(toks))
sys.exit(0 if all(b - a <= 30 for a, b in zip(starts, starts[1:])) else 1)
EOF2
n=$((n + 1)); [ $ok = 0 ] && echo "ok $n - every example in the truncated shard is at most 30 tokens" || echo "not ok $n - an example over 30 tokens"

# ---- no loss crosses an example boundary: an example's first token is never a target, even when
# an empty prompt (or an empty template prefix) makes it a response token ----
printf '{"prompt": "", "response": " the cat"}\n{"prompt": "", "response": "sat on"}\n{"prompt": "Q", "response": ""}\n' >"$T/np.jsonl"
printf '{"messages": [{"role": "assistant", "content": "hello"}]}\n{"messages": [{"role": "assistant", "content": "the end"}]}\n' >"$T/na.jsonl"
printf '{"roles": {"assistant": {"prefix": "", "suffix": ""}}}\n' >"$T/noprefix.json"
# first_masks DIR: the mask bits of every example's first token, then "|" and the bits of the rest
first_masks() { $PY - "$1/train_000000.bin" <<'EOF2'
import struct, sys
raw = open(sys.argv[1], "rb").read()
h = struct.unpack("<256i", raw[:1024])
toks = struct.unpack("<%dH" % h[2], raw[1024:1024 + 2 * h[2]])
m = open(sys.argv[1][:-4] + ".mask", "rb").read()[1024:]
starts = [0] + [i + 1 for i in range(len(toks) - 1) if toks[i] == 259]  # after each EOS
print("".join(str(m[i]) for i in starts), "|", sum(m[i] for i in range(len(toks)) if i not in starts))
EOF2
}
"$C" data -o "$T/np" --tokenizer "$T/tok.json" --sft "$T/np.jsonl" >/dev/null 2>&1
check "an empty prompt: the example's first token (a response token) has no loss" 0 "000 |" -- first_masks "$T/np"
"$C" data -o "$T/na" --tokenizer "$T/tok.json" --sft --chat-template "$T/noprefix.json" "$T/na.jsonl" >/dev/null 2>&1
check "an empty assistant prefix first: the example's first token has no loss" 0 "00 |" -- first_masks "$T/na"
printf '{"prompt": "a", "response": "b"}\n{"prompt": "", "response": ""}\n' >"$T/nothing.jsonl"
check "an empty prompt and response: nothing to learn, refused" 2 \
  "nothing.jsonl:2: the prompt and the response are both empty: no token to learn" -- \
  "$C" data -o "$T/e13" --tokenizer "$T/tok.json" --sft "$T/nothing.jsonl"
printf '{"messages": [{"role": "assistant", "content": "x"}]}\n' >"$T/one.jsonl"
printf '{"eos": false, "roles": {"assistant": {"prefix": "", "suffix": ""}}}\n' >"$T/bare.json"
check "an assistant message whose only token is the example's first: refused" 2 \
  "one.jsonl:1: messages: no token to learn" -- \
  "$C" data -o "$T/e14" --tokenizer "$T/tok.json" --sft --chat-template "$T/bare.json" "$T/one.jsonl"

# ---- error paths: file:line and the field expected ----
printf '{"prompt": "a", "response": "b"}\n{"prompt": "a" "response": "b"}\n' >"$T/syntax.jsonl"
check "a line that is not JSON: file:line" 2 "syntax.jsonl:2" -- "$C" data -o "$T/e1" --tokenizer "$T/tok.json" --sft "$T/syntax.jsonl"
printf '{"prompt": "a", "response": "b"}\n\n{"prompt": "a", "respnse": "b"}\n' >"$T/field.jsonl"
check "a missing field: file:line and its name" 2 "field.jsonl:3: missing field 'response'" -- \
  "$C" data -o "$T/e2" --tokenizer "$T/tok.json" --sft "$T/field.jsonl"
printf '{"prompt": 3, "response": "b"}\n' >"$T/type.jsonl"
check "a field of the wrong type" 2 "type.jsonl:1: prompt: expected a string, got a number" -- \
  "$C" data -o "$T/e3" --tokenizer "$T/tok.json" --sft "$T/type.jsonl"
check "messages without --chat-template" 2 "chat.jsonl:1: a \"messages\" line needs --chat-template" -- \
  "$C" data -o "$T/e4" --tokenizer "$T/tok.json" --sft "$T/chat.jsonl"
printf '{"messages": [{"role": "robot", "content": "x"}]}\n' >"$T/role.jsonl"
check "an unknown role" 2 "role.jsonl:1: messages[0].role: \"robot\" (expected system, user or assistant)" -- \
  "$C" data -o "$T/e5" --tokenizer "$T/tok.json" --sft --chat-template "$T/tmpl.json" "$T/role.jsonl"
# one JSON rule for every reader (docs/formats.md): a key twice is refused, at any depth, with its path
printf '{"prompt": "a", "response": "b"}\n{"prompt": "a", "response": "b", "prompt": "c"}\n' >"$T/dup.jsonl"
check "a line with a key twice is refused (first and last would differ)" 2 \
  "dup.jsonl:2: field 'prompt' appears twice (readers differ on which one counts)" -- \
  "$C" data -o "$T/e10" --tokenizer "$T/tok.json" --sft "$T/dup.jsonl"
printf '{"messages": [{"role": "user", "content": "x", "role": "assistant"}]}\n' >"$T/dup2.jsonl"
check "a message with a key twice is refused, with its path" 2 "dup2.jsonl:1: messages[0]: field 'role' appears twice" -- \
  "$C" data -o "$T/e11" --tokenizer "$T/tok.json" --sft --chat-template "$T/tmpl.json" "$T/dup2.jsonl"
printf '{"roles": {"assistant": {"prefix": "A", "prefix": "B"}}}\n' >"$T/dupt.json"
check "a chat template with a key twice is refused" 2 "dupt.json: roles.assistant: field 'prefix' appears twice" -- \
  "$C" data -o "$T/e12" --tokenizer "$T/tok.json" --sft --chat-template "$T/dupt.json" "$T/chat.jsonl"
printf '{"bos": false, "roles": {"user": {"prefix": "U"}}}\n' >"$T/badt.json"
check "a template without the assistant role" 2 "missing field 'assistant'" -- \
  "$C" data -o "$T/e6" --tokenizer "$T/tok.json" --sft --chat-template "$T/badt.json" "$T/chat.jsonl"
printf '{"bos": true, "roles": {"assistant": {"prefix": "A"}}}\n' >"$T/bost.json"
check "a template's bos with a tokenizer without one" 2 "the chat template's \"bos\": true: no beginning-of-text token" -- \
  "$C" data -o "$T/e9" --tokenizer "$T/tok.json" --sft --chat-template "$T/bost.json" "$T/chat.jsonl"
check "--chat-template needs --sft" 2 "--chat-template needs --sft" -- \
  "$C" data -o "$T/e7" --tokenizer "$T/tok.json" --chat-template "$T/tmpl.json" "$T/pairs.jsonl"
check "--sft needs --tokenizer" 2 "--sft needs --tokenizer FILE (fine-tuning examples are encoded with the model's tokenizer.json" -- \
  "$C" data -o "$T/e8" --sft "$T/pairs.jsonl"
# issue 38: --sft asks for fine-tuning data; leaving it out would write the JSONL's bytes as text
assert "... never says to leave --sft out" bash -c "! '$C' data -o '$T/e8' --sft '$T/pairs.jsonl' 2>&1 | grep -q 'leave'"
check "--chat-template without --sft: give it, or leave the template out" 2 \
  "--chat-template needs --sft: give that too, or leave --chat-template out (alone it has no effect)" -- \
  "$C" data -o "$T/e7" --tokenizer "$T/tok.json" --chat-template "$T/tmpl.json" "$T/pairs.jsonl"
check "--sft with --images: it is for text" 2 "--sft needs text input (it is for text, not --images)" -- \
  "$C" data -o "$T/e10.cimg" --images --synthetic 4 --classes 2 --size 4 --sft

# ---- training on the masked shards against the float64 oracle ----
common=(--model "$T/m.yaml" --seq 32 --seed 5 --lr 1e-3 --warmup 1)
"$W" train "${common[@]}" --batch 4 --microbatch 2 --steps 4 --data "$T/d" --dump "$T/dump" --log "$T/o.jsonl" \
  --quiet >"$T/o.out" 2>&1
ok_rc=$?
n=$((n + 1)); [ $ok_rc = 0 ] && echo "ok $n - training on loss-masked shards runs" || { echo "not ok $n - training on loss-masked shards (exit $ok_rc)"; tail -3 "$T/o.out" | sed 's/^/#   /'; }
checks $PY tests/ref/sft_check.py batches "$T/d" "$T/dump" 32
check "the dump says the loss is the mean over targets" 0 '"loss_mean":"targets"' -- \
  $PY -c "import sys; sys.path.insert(0, 'tests/ref'); import st; print(st.read(sys.argv[1])[1]['cephalo.train'])" "$T/dump/init.safetensors"
checks $PY tests/ref/oracle.py "$T/dump" "$T/o.jsonl"

# ---- 1 rank = 2 uneven ranks (other microbatches, sharded) ----
"$W" train "${common[@]}" --batch 6 --microbatch 3 --steps 3 --data "$T/d" --quiet --log "$T/r1.jsonl" 2>/dev/null
"$C" plan --cluster "$(cluster_of 2)" --model "$T/m.yaml" --batch 6 --seq 32 -o "$T/base.json" >/dev/null 2>&1
$PT rewrite "$T/base.json" "$T/p2.json" --ranks "4:1,2:2" --shards random --seed 3 >/dev/null
run_ranks "$T/p2.json" "$T/r2" --seed 5 --lr 1e-3 --warmup 1 --steps 3 --data "$T/d"
rc=$?
n=$((n + 1)); [ $rc = 0 ] && echo "ok $n - 2 uneven ranks train on masked data" || { echo "not ok $n - 2 ranks failed"; tail -3 "$T/r2/rank0.err" | sed 's/^/#   /'; }
l1=($(losses "$T/r1.jsonl")) l2=($(losses "$T/r2/rank0.jsonl"))
for i in 0 1 2; do
  rel_close "${l2[$i]:-0}" "${l1[$i]:-1}" $PLAN_TOL
  rc=$?
  n=$((n + 1))
  [ $rc = 0 ] && echo "ok $n - 1 rank = 2 uneven ranks: masked loss of step $i (${l1[$i]:-?})" ||
    echo "not ok $n - 1 rank vs 2 uneven ranks, step $i: ${l1[$i]:-?} vs ${l2[$i]:-?}"
done

# ---- the validation loss on masked val shards: the mean over their counted targets ----
"$W" train "${common[@]}" --batch 4 --steps 2 --data "$T/both" --val-data "$T/both" --val-samples 1000 \
  --ckpt-dir "$T/vck" --quiet --log "$T/v.jsonl" 2>/dev/null
ev=$("$W" eval --checkpoint "$T/vck" --data "$T/both/val_000000.bin" --samples 1000 --json 2>/dev/null |
  $PY -c "import json,sys; print(json.loads(sys.stdin.read())['val_loss'])")
logged=$(grep -o '"val_loss":[0-9.e+-]*' "$T/v.jsonl" | tail -1 | cut -d: -f2)
ref=$($PY tests/ref/val_loss.py "$T/vck/step_00000002.safetensors" 32 "$T/both/val_000000.bin" 2>&1)
rel_close "${ev:-0}" "${ref:-1}" 1e-5
rc=$?
n=$((n + 1)); [ $rc = 0 ] && echo "ok $n - eval on a masked val shard = float64 mean over its counted targets ($ev vs $ref)" ||
  echo "not ok $n - eval on a masked val shard: $ev, float64 reference $ref"
rel_close "${logged:-0}" "${ev:-1}" $PLAN_TOL
rc=$?
n=$((n + 1)); [ $rc = 0 ] && echo "ok $n - the val_loss train logged = eval's ($logged)" || echo "not ok $n - logged val_loss $logged, eval $ev"
unmasked=$($PY - "$T/vck/step_00000002.safetensors" "$T/both/val_000000.bin" <<'EOF2'
import os, shutil, subprocess, sys, tempfile
d = tempfile.mkdtemp()
shutil.copy(sys.argv[2], d + "/v.bin")  # the same tokens without the mask
print(subprocess.run([sys.executable, "tests/ref/val_loss.py", sys.argv[1], "32", d + "/v.bin"],
                     capture_output=True, text=True).stdout.strip())
shutil.rmtree(d)
EOF2
)
n=$((n + 1)); [ -n "$unmasked" ] && ! rel_close "$unmasked" "${ref:-1}" 1e-3 &&
  echo "ok $n - the mask matters: all targets give another loss ($unmasked)" || echo "not ok $n - masked $ref, unmasked $unmasked"

# ---- a global batch, or a validation set, with no target that counts (every mask byte 0): the step
# has no loss and makes no update (no weight decay, no AdamW step), the same on every rank (a rank's
# rows may have no target while another's have some: the all-reduced count decides), and a
# validation set with nothing to score is refused ----
$PY - "$T/z" <<'EOF2'
import os, struct, sys
d = sys.argv[1]
def shard(name, n, counted):
    os.makedirs(d + "/" + name)
    p = d + "/" + name + "/train_000000"
    toks = [(i * 7 + 3) % 259 for i in range(n)]
    open(p + ".bin", "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + struct.pack("<%dH" % n, *toks))
    open(p + ".mask", "wb").write(struct.pack("<256i", 0x4B53414D, 1, n, *([0] * 253)) +
                                  bytes(1 if counted(i) else 0 for i in range(n)))
shard("zero", 8 * 16 + 1, lambda i: False)         # 8 windows of 16, no target counts
shard("one", 8 * 16 + 1, lambda i: 1 <= i <= 16)   # only window 0's 16 targets count
EOF2
Z=(--model "$T/m.yaml" --seq 16 --seed 5 --lr 1e-3 --warmup 1 --batch 2)
"$W" train "${Z[@]}" --warmup 0 --steps 0 --data "$T/z/zero" --ckpt-dir "$T/z0" --quiet 2>/dev/null
check "a run whose every batch has no target: exit 0, each step said" 0 \
  "step 1: no target of the global batch (2 samples of $T/z/zero) counts (every loss-mask byte of its targets is 0): no loss, and the update is skipped" -- \
  "$W" train "${Z[@]}" --steps 2 --data "$T/z/zero" --ckpt-dir "$T/zc" --log "$T/zl.jsonl" --quiet
check "... the log: loss null, skipped, targets 0" 0 "" -- $PY -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
assert len(r) == 2 and all(x['loss'] is None and x['skipped'] is True and x['targets'] == 0 for x in r), r" "$T/zl.jsonl"
check "... the parameters are the initial ones (no weight decay) and AdamW took no step" 0 "" -- $PY -c "
import json, sys
sys.path.insert(0, 'tests/ref'); import st, numpy as np
a, _ = st.read(sys.argv[1]); b, meta = st.read(sys.argv[2])
ps = [k for k in a if k.startswith('param.')]
assert ps and all(np.array_equal(a[k], b[k]) for k in ps), [k for k in ps if not np.array_equal(a[k], b[k])][:3]
assert json.loads(meta['cephalo.optimizer'])['adam_steps'] == 0, meta['cephalo.optimizer']" \
  "$T/z0/step_00000000.safetensors" "$T/zc/step_00000002.safetensors"
# one counted window in 8: one step of 4 learns, three have no target; the float64 oracle skips them too
"$W" train "${Z[@]}" --microbatch 1 --steps 4 --data "$T/z/one" --dump "$T/zd" --log "$T/zo.jsonl" --quiet 2>/dev/null
check "... one step with targets, three without" 0 "1 3" -- $PY -c "
import json, sys
r = [json.loads(l) for l in open(sys.argv[1])]
print(sum(x['targets'] == 16 for x in r), sum(x['targets'] == 0 and x['loss'] is None for x in r))" "$T/zo.jsonl"
checks $PY tests/ref/oracle.py "$T/zd" "$T/zo.jsonl"
"$C" plan --cluster "$(cluster_of 2)" --model "$T/m.yaml" --batch 2 --seq 16 -o "$T/zb.json" >/dev/null 2>&1
$PT rewrite "$T/zb.json" "$T/zp.json" --ranks "1:1,1:1" --shards random --seed 4 >/dev/null
run_ranks "$T/zp.json" "$T/zr" --seed 5 --lr 1e-3 --warmup 1 --steps 4 --data "$T/z/one"
check "2 ranks, one of them without a target at the step the other has some: the same steps as 1 rank" 0 "" -- \
  $PY -c "
import json, sys
a, b, c = ([json.loads(l) for l in open(f)] for f in sys.argv[1:])
key = lambda r: [(x['loss'] is None, x['targets'], x['skipped']) for x in r]
assert key(a) == key(b) == key(c), (key(a), key(b), key(c))
for x, y in zip(a, b):
    assert (x['loss'] is None) or abs(x['loss'] - y['loss']) <= 1e-6 * x['loss'], (x['loss'], y['loss'])" \
  "$T/zo.jsonl" "$T/zr/rank0.jsonl" "$T/zr/rank1.jsonl"
check "--val-data with nothing to score: refused at the start" 2 \
  "--val-data $T/z/zero: the 8 validation samples have no target that counts (every loss-mask byte of their targets is 0): nothing to score" -- \
  "$W" train "${Z[@]}" --steps 2 --data "$T/z/one" --val-data "$T/z/zero"
check "eval on a validation set with nothing to score: refused, exit 2" 2 \
  "--data $T/z/zero: the 8 validation samples have no target that counts" -- \
  "$W" eval --checkpoint "$T/zc" --data "$T/z/zero" --samples 1000
check "eval on the one counted window: its 16 targets" 0 "16 targets" -- "$W" eval --checkpoint "$T/zc" --data "$T/z/one" --samples 1000

# ---- --epochs ----
wins=$("$W" train "${common[@]}" --batch 4 --epochs 1 --data "$T/d" --log "$T/e.jsonl" 2>&1 | tee "$T/e.out" |
  grep -o '([0-9]* samples an epoch' | tr -dc 0-9)
steps=$(grep -c '"loss"' "$T/e.jsonl" 2>/dev/null)
want=$(( (2 * ${wins:-0} + 3) / 4 ))
n=$((n + 1))
[ -n "$wins" ] && [ "$wins" -gt 0 ] && [ "$steps" = $(( (${wins:-0} + 3) / 4 )) ] &&
  echo "ok $n - --epochs 1: ceil($wins windows / batch 4) = $steps steps" || echo "not ok $n - --epochs 1: $steps steps for $wins windows"
"$W" train "${common[@]}" --batch 4 --epochs 2 --data "$T/d" --quiet --log "$T/e2.jsonl" 2>/dev/null
n=$((n + 1))
[ "$(grep -c '"loss"' "$T/e2.jsonl")" = "$want" ] && echo "ok $n - --epochs 2: $want steps" || echo "not ok $n - --epochs 2: $(grep -c '"loss"' "$T/e2.jsonl") steps, expected $want"
check "--epochs: the steps are printed at the start" 0 "--epochs 1: $steps steps" -- cat "$T/e.out"
check "--warmup checked against the steps --epochs resolves to" 2 "--warmup: $steps must be below the steps of --epochs 1 ($steps)" -- \
  "$W" train "${common[@]}" --batch 4 --epochs 1 --data "$T/d" --warmup "$steps" --quiet
# cephalo run: a job file's `epochs` (instead of `steps`) becomes the workers' --steps
printf 'model: %s\nseq: 32\ndata: %s\nbatch: 4\nepochs: 2\ndevices: [{type: cpu, threads: 1, memory: 512M}]\n' \
  "$T/m.yaml" "$T/d" >"$T/ep.yaml"
check "cephalo run: epochs 2 in a job file gives the same steps" 0 "final loss" -- \
  bash -c "'$C' run '$T/ep.yaml' --run-dir '$T/run-ep' 2>&1 | tee '$T/run-ep.out' && grep -q 'epochs 2: $want steps' '$T/run-ep.out' && grep -q 'steps 1..$want of $want' '$T/run-ep.out'"
printf 'model: tiny-gpt\nbatch: 4\nsteps: 3\nepochs: 2\ndevices: [{type: cpu}]\n' >"$T/both.yaml"
check "cephalo run: steps and epochs in one job file are refused" 2 "both.yaml:4: epochs: give steps or epochs, not both" -- \
  "$C" run "$T/both.yaml" --dry-run
printf 'model: tiny-gpt\nbatch: 4\nepochs: 2\ndevices: [{type: cpu, memory: 512M}]\ndata: synthetic\n' >"$T/syn.yaml"
check "cephalo run: epochs on synthetic data is refused" 2 "epochs needs data of a known size" -- "$C" run "$T/syn.yaml" --dry-run
check "--steps and --epochs together are refused" 2 "--steps and --epochs: give one" -- \
  "$W" train "${common[@]}" --batch 4 --steps 3 --epochs 1 --data "$T/d"
check "--epochs on synthetic data is refused" 2 "--epochs needs data of a known size" -- \
  "$W" train "${common[@]}" --batch 4 --epochs 1 --data synthetic
cp "$T/d/train_000000.bin" "$T/nomask_000000.bin"
check "shards with and without masks are not mixed" 2 "has a loss mask" -- \
  "$W" train "${common[@]}" --batch 4 --steps 2 --data "$T/d/train_000001.bin,$T/nomask_000000.bin"
head -c 1500 "$T/d/train_000000.mask" >"$T/short.mask"
cp "$T/d/train_000000.bin" "$T/short.bin"
check "a mask of the wrong length is refused" 2 "short.mask: the loss mask has" -- \
  "$W" train "${common[@]}" --batch 4 --steps 2 --data "$T/short.bin"
