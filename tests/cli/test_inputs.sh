#!/usr/bin/env bash
# test_inputs.sh - nothing lost in what the commands read (issue 27): every text parser's errors on
# the right line (a NUL or a control byte in a YAML file, a YAML key), every JSON input refusing
# what cJSON would let through or misreport (a NUL between values or in a string, \u0000, nesting
# beyond 1000); a directory given for a file and a file for a directory, the same words
# everywhere; options that would do nothing in the mode chosen, refused by one rule; --json and
# --help of every command; text with NULs kept by sample --json; one resolver of checkpoint
# arguments, whose stale `latest` falls back to the newest complete checkpoint, said.
# Prints "ok N - name" / "not ok N - name" lines.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
B=${BUILD:-build/rel}
C=$PWD/$B/bin/cephalo
W=$PWD/$B/bin/cephalo-worker
OP=$PWD/$B/bin/cephalo-operator
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export CEPHALO_PROFILE_STORE=none OMP_NUM_THREADS=1
PY=/usr/bin/python3
A=examples/clusters/cluster-a.yaml
P=(plan --cluster "$A" --model gpt2-124m --batch 8)

# ---- YAML: the line (and column) of what is wrong ----------------------------------------------
printf 'name: j\n\0model: tiny-gpt\n' >"$T/nul-job.yaml"
check "a NUL on line 2 of a job file is reported on line 2" 2 "nul-job.yaml:2:1: a NUL byte" -- "$C" run "$T/nul-job.yaml" --dry-run
printf 'nodes:\n  - name: a\n    gpus: [{type: L4,\x01 count: 2}]\n' >"$T/ctl.yaml"
check "a control byte on line 3 of a cluster file: line 3, column, the byte" 2 "ctl.yaml:3:22: YAML syntax error: control characters are not allowed (byte 0x01)" -- \
  "$C" plan --cluster "$T/ctl.yaml" --model gpt2-124m --batch 8
printf 'nodes:\n  - name: a\n    gpus: [{type: L4, count: 2}]\n\xff\n' >"$T/utf.yaml"
check "bad UTF-8 on line 4: line 4" 2 "utf.yaml:4:1: YAML syntax error: invalid leading UTF-8 octet (byte 0xff)" -- \
  "$C" plan --cluster "$T/utf.yaml" --model gpt2-124m --batch 8
printf 'nodes:\n  - name: a\n    bogus:\n      x: 1\n    gpus: [{type: L4, count: 2}]\n' >"$T/key.yaml"
check "an unknown field whose value is a block: the key's line" 2 "key.yaml:3: nodes[0]: unknown field 'bogus'" -- \
  "$C" plan --cluster "$T/key.yaml" --model gpt2-124m --batch 8

# ---- JSON: one check where JSON text is parsed (every input) -------------------------------------
printf '{"format": 1,\0"entries": []}' >"$T/nul.json"
check "profile: a NUL between members is not whitespace" 2 "nul.json:1:14: a NUL byte between values" -- "$C" "${P[@]}" --profile "$T/nul.json"
printf '{"format": 1,\n \x0c"entries": []}' >"$T/ff.json"
check "profile: a control byte between members, on its line" 2 "ff.json:2:2: a control byte 0x0c between values" -- "$C" "${P[@]}" --profile "$T/ff.json"
$PY -c "print('[' * 200000 + ']' * 200000)" >"$T/deep.json"
check "200,000 nested arrays: a nesting limit, with where" 2 "deep.json:1:1001: nesting deeper than 1000" -- "$C" "${P[@]}" --profile "$T/deep.json"
mkdir -p "$T/hf"
printf '{"model_type": "gpt2",\n "n_layer": 2, "n_head": 2, "n_embd": 64, "vocab_size": 256, "n_positions": 64,\n "architectures": ["GPT2\\u0000LMHeadModel"]}' >"$T/hf/config.json"
check "HF config.json: \\u0000 in a string is refused, not cut short" 2 "config.json:3:25: a \\u0000 (NUL) in a string" -- \
  "$C" plan --cluster "$A" --model "$T/hf/config.json" --batch 8
printf '{"model": {"type": "BPE", "vocab": {"a\0b": 0}, "merges": []}}' >"$T/nultok.json"
printf 'ab' >"$T/d.txt"
check "tokenizer.json: a raw NUL in a string" 2 "nultok.json:1:39: a NUL byte in a string" -- "$C" data -o "$T/out" --tokenizer "$T/nultok.json" "$T/d.txt"
$PY - "$T/nul.safetensors" <<'EOF'
import struct, sys
h = b'{"__metadata__": {"format": "pt"},\0"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}'
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + b"\0\0\0\0")
EOF
check "safetensors header: a NUL between members" 2 "nul.safetensors: header:1:35: a NUL byte between values" -- "$W" export --checkpoint "$T/nul.safetensors" -o "$T/ex"

printf 'name: j\nmodel: tiny-gpt\nbatch: 2\nsteps: 2\ndevices: [{type: cpu, memory: 256M}]\ndata: synthetic\n' >"$T/minlr-ok.yaml"

# ---- a directory where a file is expected, a file where a directory is ---------------------------
mkdir -p "$T/dir"
check "--tokenizer DIR: is a directory, not 'read error'" 2 "$T/dir: is a directory, expected a file" -- "$C" data -o "$T/out" --tokenizer "$T/dir" "$T/d.txt"
check "--cluster DIR" 2 "$T/dir: is a directory, expected a file" -- "$C" plan --cluster "$T/dir" --model gpt2-124m --batch 8
check "--profile DIR" 2 "$T/dir: is a directory, expected a file" -- "$C" "${P[@]}" --profile "$T/dir"
check "run JOB=DIR" 2 "$T/dir: is a directory, expected a file" -- "$C" run "$T/dir" --dry-run
check "train --plan DIR" 2 "$T/dir: is a directory, expected a file" -- "$W" train --data synthetic --plan "$T/dir"
: >"$T/file"
check "sample --init-from FILE: a file, expected a directory" 2 "--init-from: $T/file: is a file, expected a directory" -- "$W" sample --init-from "$T/file"
check "eval --init-from FILE" 2 "--init-from: $T/file: is a file, expected a directory" -- "$W" eval --init-from "$T/file" --data synthetic
check "train --init-from FILE" 2 "--init-from: $T/file: is a file, expected a directory" -- "$W" train --data synthetic --init-from "$T/file" --batch 2
check "train --dump FILE (an output directory)" 2 "--dump $T/file: is a file, expected a directory" -- "$W" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --dump "$T/file"
check "data -o FILE" 2 "$T/file: is a file, expected a directory" -- "$C" data -o "$T/file" "$T/d.txt"
check "run --run-dir FILE/sub: the part in the way named" 2 "$T/file/sub: $T/file is a file, expected a directory" -- \
  "$C" run "$T/minlr-ok.yaml" --run-dir "$T/file/sub" --dry-run

# ---- options that would do nothing: refused by one rule -----------------------------------------
TG=(train --data synthetic --model tiny-gpt --batch 2 --steps 1 --quiet)
check "--loss-scale outside fp16" 2 "--loss-scale needs --precision fp16 (the precision here is fp32, the default)" -- "$W" "${TG[@]}" --loss-scale 1024
check "--loss-scale-window in bf16" 2 "--loss-scale-window needs --precision fp16 (the precision here is bf16)" -- "$W" "${TG[@]}" --precision bf16 --loss-scale-window 5
check "... both act in fp16" 0 "" -- "$W" "${TG[@]}" --precision fp16 --loss-scale 1024 --loss-scale-window 5
check "--min-lr with the constant schedule" 2 "--min-lr needs --schedule cosine or linear" -- "$W" "${TG[@]}" --schedule constant --min-lr 1e-5
check "--keep-last without --ckpt-dir" 2 "--keep-last needs --ckpt-dir" -- "$W" "${TG[@]}" --keep-last 2
check "--ckpt-every without --ckpt-dir" 2 "--ckpt-every needs --ckpt-dir" -- "$W" "${TG[@]}" --ckpt-every 1
check "--gpu on the CPU" 2 "--gpu needs --device cuda (the device here is cpu)" -- "$W" "${TG[@]}" --gpu 1
check "--metrics-addr without a port" 2 "--metrics-addr needs a metrics port" -- "$W" "${TG[@]}" --metrics-addr 127.0.0.1
check "sample --top-k when greedy" 2 "--top-k needs a --temperature above 0" -- "$W" sample --init-from "$T/dir" --temperature 0 --top-k 5
check "sample --no-bos without a tokenizer" 2 "--no-bos needs --tokenizer" -- "$W" sample --init-from "$T/dir" --no-bos
check "eval --gpu on the CPU" 2 "--gpu needs --device cuda" -- "$W" eval --init-from "$T/dir" --data synthetic --gpu 0
check "compare -o (a plan option)" 2 "--output needs cephalo plan" -- "$C" compare --cluster "$A" --model gpt2-124m --batch 8 -o "$T/p.json"
check "compare --strategy" 2 "--strategy needs cephalo plan" -- "$C" compare --cluster "$A" --model gpt2-124m --batch 8 --strategy fsdp
check "models --seq without a model" 2 "--seq needs a MODEL" -- "$C" models --seq 128
check "profile --comm-max-bytes with one device" 2 "--comm-max-bytes needs two or more --devices" -- \
  "$C" profile --devices cpu:1t:256M --model tiny-gpt --comm-max-bytes 1M --store none -o "$T/prof.json"
check "data --seed without --images" 2 "--seed needs --images" -- "$C" data -o "$T/out" --seed 3 "$T/d.txt"
printf 'name: j\nmodel: tiny-gpt\nbatch: 2\nsteps: 2\ndevices: [{type: cpu, memory: 256M}]\noptimizer: {schedule: constant,\n  min_lr: 1e-5}\ndata: synthetic\n' >"$T/minlr.yaml"
check "job file: optimizer.min_lr with schedule constant, on its line" 2 "minlr.yaml:7: optimizer.min_lr needs schedule cosine or linear" -- \
  "$C" run "$T/minlr.yaml" --dry-run --run-dir "$T/r"

# ---- --json and --help of every command ----------------------------------------------------------
for bin in "$C version" "$C --version" "$W version" "$W --version" "$OP --version"; do
  check "$(basename "${bin% *}") ${bin##* } --json: one JSON object" 0 "" -- bash -c \
    "$bin --json | $PY -c 'import json, sys; d = json.load(sys.stdin); assert d[\"version\"] and d[\"release\"] and d[\"commit\"]'"
done
check "version refuses what it does not take" 2 "unexpected argument 'x'" -- "$C" version x
check "version --help is its usage, not the version" 0 "usage: cephalo version [--json]" -- "$C" version --help
check "gpus --json is refused, not answered with a table" 2 "unknown option '--json'" -- "$C" gpus --json
check "gpus --help is its usage" 0 "usage: cephalo gpus" -- "$C" gpus --help
for cmd in plan compare models gpus data run profile version; do
  check "cephalo $cmd --help: usage, exit 0" 0 "usage: cephalo" -- "$C" $cmd --help
done
for cmd in train eval sample export profile profile-comm version; do
  check "cephalo-worker $cmd --help: usage, exit 0" 0 "usage: cephalo-worker" -- "$W" $cmd --help
done
check "cephalo-operator --help: usage, exit 0" 0 "--version [--json]" -- "$OP" --help

# ---- text with NULs: carried with its length ---------------------------------------------------
$PY - "$T/bytes-tok.json" <<'EOF'
import json, sys
printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
vocab, nxt = {}, 256
for b in range(256):
    if b in printable: vocab[chr(b)] = b
    else: vocab[chr(nxt)] = b; nxt += 1
vocab["<|endoftext|>"] = 256
json.dump({"added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": True}],
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": vocab, "merges": []}}, open(sys.argv[1], "w"))
EOF
printf 'a\0b c' >"$T/nul.txt"
"$C" data -o "$T/nul-shards" --tokenizer "$T/bytes-tok.json" "$T/nul.txt" >/dev/null 2>&1
check "tokenizer input: a NUL byte is a token, the text goes on after it" 0 " 97 0 98 32 99 256 " -- \
  bash -c "od -A n -v -t u2 -j 1024 '$T/nul-shards/train_000000.bin' | tr -s ' \n' ' '"

# ---- sample --json keeps the text whole ----------------------------------------------------------
"$W" train --data synthetic --model tiny-gpt --batch 2 --steps 4 --ckpt-every 2 --quiet --ckpt-dir "$T/ck" >/dev/null 2>&1
check "sample --prompt-file DIR" 2 "$T/dir: is a directory, expected a file" -- "$W" sample --checkpoint "$T/ck" --prompt-file "$T/dir"
check "sample --tokenizer DIR" 2 "$T/dir: is a directory, expected a file" -- "$W" sample --checkpoint "$T/ck" --tokenizer "$T/dir"
printf 'a\0b"c' >"$T/prompt.txt"
check "sample --json: a prompt file with a NUL is the whole prompt (\\u0000)" 0 "" -- bash -c \
  "'$W' sample --checkpoint '$T/ck' --prompt-file '$T/prompt.txt' --max-new-tokens 2 --json 2>/dev/null |
   $PY -c 'import json, sys; d = json.loads(sys.stdin.readline()); assert d[\"prompt\"] == \"a\\x00b\\\"c\", d'"

# ---- a stale `latest`: the newest complete checkpoint, said, in every command ---------------------
echo step_00000009.safetensors >"$T/ck/latest"
stale="$T/ck/latest names step_00000009.safetensors, which does not exist: using the newest complete checkpoint there, step_00000004.safetensors"
check "sample --checkpoint DIR, latest names a missing file" 0 "$stale" -- "$W" sample --checkpoint "$T/ck" --max-new-tokens 2
check "export --checkpoint DIR/latest" 0 "$stale" -- "$W" export --checkpoint "$T/ck/latest" -o "$T/ex1"
check "eval --checkpoint DIR: said once" 0 "" -- bash -c \
  "[ \$('$W' eval --checkpoint '$T/ck' --data synthetic --samples 2 2>&1 | grep -c 'latest names') = 1 ]"
check "train --resume DIR/latest" 0 "resumed from $T/ck/step_00000004.safetensors at step 4" -- "$W" train --data synthetic --model tiny-gpt --batch 2 --steps 5 --resume "$T/ck/latest"
mkdir -p "$T/ck/step_00000006"
echo step_00000006 >"$T/ck/latest"
check "latest names an incomplete step directory" 0 "step_00000006, which is not a complete checkpoint" -- "$W" export --checkpoint "$T/ck" -o "$T/ex2"
printf 'step_00000002\0.safetensors' >"$T/ck/latest"
check "latest holding a NUL is not taken for what precedes it" 0 "holds 'step_00000002\\0...', not a checkpoint name" -- "$W" export --checkpoint "$T/ck" -o "$T/ex3"
rm "$T/ck/latest"
check "DIR/latest given, the file missing" 0 "$T/ck/latest is missing: using the newest complete checkpoint there" -- "$W" export --checkpoint "$T/ck/latest" -o "$T/ex4"
mkdir -p "$T/none"
echo step_00000001.safetensors >"$T/none/latest"
check "a stale latest and nothing else: exit 2, naming both" 2 "$T/none/latest names step_00000001.safetensors, which does not exist, and $T/none holds no complete checkpoint" -- \
  "$W" sample --checkpoint "$T/none"
