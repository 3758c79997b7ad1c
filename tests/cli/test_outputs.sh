#!/usr/bin/env bash
# CLI tests of the one rule of every command that writes (common/outputs.h, docs/development.md
# "Outputs"): an output never lands on an input (the same file however spelled, a file of a data
# spec, a file of an input directory), on another output, or on a file the command keeps in its
# checkpoint, dump, data, export or run directory; a directory of generic names (a run directory,
# an export) that holds such a name cephalo did not write is refused. Every refusal is exit 2,
# names both sides, and leaves the files as they were. Prints "ok N - ..." lines.
set -u
REPO=$PWD
B=$(cd "${BUILD:-build/rel}/bin" && pwd)
C=$B/cephalo
W=$B/cephalo-worker
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
unset CEPHALO_WORKER

TINY=(--model tiny-gpt --batch 4 --microbatch 2 --seq 32 --threads 1 --quiet)
sum() { md5sum <"$1" | cut -d' ' -f1; }
cd "$T" || exit 1

# ---- train: the data, the checkpoint resumed from, the checkpoint and dump directories ----
head -c 60000 /dev/urandom | base64 >text.txt
"$C" data -o d text.txt >/dev/null 2>&1
shard=$(sum d/train_000000.bin)
check "train --log on the training shard: refused, naming both" 2 \
  "--log d/train_000000.bin: this is the input --data d/train_000000.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data d/train_000000.bin --log d/train_000000.bin
assert "... the shard is untouched" test "$(sum d/train_000000.bin)" = "$shard"
check "... spelled otherwise (./d/../d/...)" 2 "this is the input --data d/train_000000.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data d/train_000000.bin --log ./d/../d/train_000000.bin
ln -s d/train_000000.bin link.bin
check "... through a symbolic link" 2 "--log link.bin: this is the input --data d/train_000000.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data d/train_000000.bin --log link.bin
check "... a shard of a data directory" 2 "--log d/train_000000.bin: this is train_000000.bin, an input of --data d" -- \
  "$W" train "${TINY[@]}" --steps 1 --data d --log d/train_000000.bin
check "... a new shard a data directory would read" 2 "--log d/new.bin: this is new.bin, an input of --data d" -- \
  "$W" train "${TINY[@]}" --steps 1 --data d --log d/new.bin
check "... a shard a pattern matches (not yet there: a new shard the pattern would read)" 2 \
  "--log d/train_000009.bin: this is train_000009.bin, an input of --data d/train_*.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data 'd/train_*.bin,d/val_*.bin' --log d/train_000009.bin
check "... a validation shard" 2 "this is the input --val-data d/train_000000.bin" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 1 --val-data d/train_000000.bin --log d/train_000000.bin
assert "... and the shard is still whole" test "$(sum d/train_000000.bin)" = "$shard"
# a shard's loss mask (cephalo data --sft writes X.mask beside X.bin) is read with it
check "... a shard's loss mask, in a data directory" 2 "--log d/train_000000.mask: this is train_000000.mask, an input of --data d" -- \
  "$W" train "${TINY[@]}" --steps 1 --data d --log d/train_000000.mask
check "... a shard's loss mask, beside a shard named or matched" 2 "an input of --data d/train_*.mask" -- \
  "$W" train "${TINY[@]}" --steps 1 --data 'd/train_*.bin' --log d/train_000003.mask

"$W" train --data synthetic "${TINY[@]}" --steps 2 --ckpt-every 1 --ckpt-dir ck
ck2=$(sum ck/step_00000002.safetensors)
check "train --log on a checkpoint of --ckpt-dir: refused" 2 \
  "--log ck/step_00000002.safetensors: step_00000002.safetensors is a file this command keeps in its checkpoint directory --ckpt-dir ck" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 3 --ckpt-dir ck --resume auto --log ck/step_00000002.safetensors
check "... on its latest" 2 "latest is a file this command keeps in its checkpoint directory" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 3 --ckpt-dir ck --resume auto --log ck/latest
check "... on the checkpoint resumed from (another --ckpt-dir)" 2 \
  "--log ck/step_00000002.safetensors: this is the input --resume ck/step_00000002.safetensors" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 3 --ckpt-dir ck2 --resume ck/step_00000002.safetensors --log ck/step_00000002.safetensors
check "... on a checkpoint of the directory resumed from" 2 \
  "this is step_00000001.safetensors, an input of --resume ck" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 3 --ckpt-dir ck2 --resume ck --log ck/step_00000001.safetensors
assert "... the checkpoint is untouched" test "$(sum ck/step_00000002.safetensors)" = "$ck2"
check "... and still resumes" 0 "resumed from ck/step_00000002.safetensors at step 2" -- \
  "$W" train --data synthetic --model tiny-gpt --batch 4 --microbatch 2 --seq 32 --threads 1 --steps 3 --ckpt-dir ck --resume auto --log ck/train.jsonl
assert "a log of another name in the checkpoint directory is fine" test -s ck/train.jsonl
check "train --log on a file of --dump" 2 "init.safetensors is a file this command keeps in its dump directory --dump dd" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 1 --dump dd --log dd/init.safetensors
"$W" train --data synthetic "${TINY[@]}" --steps 1 --dump dd >/dev/null 2>&1
check "train --dump into the directory one of whose files it reads" 2 \
  "--data dd/init.safetensors: this input is init.safetensors, a file of the dump directory --dump dd" -- \
  "$W" train "${TINY[@]}" --steps 1 --dump dd --data dd/init.safetensors
printf '{}' >p.json
check "train --log on the --plan (checked before the plan is read)" 2 "--log p.json: this is the input --plan p.json" -- \
  "$W" train --data synthetic --plan p.json --steps 1 --log p.json
"$W" export --checkpoint ck -o hf >/dev/null
check "train --log on a file of --init-from's model directory" 2 \
  "--log hf/config.json: this is config.json, an input of --init-from hf" -- \
  "$W" train --data synthetic --init-from hf --batch 4 --microbatch 2 --seq 32 --threads 1 --quiet --steps 1 --log hf/config.json

# ---- sample, export, profile ----
printf 'a prompt' >prompt.txt
check "sample --dump-logits on the prompt file" 2 "--dump-logits prompt.txt: this is the input --prompt-file prompt.txt" -- \
  "$W" sample --checkpoint ck --prompt-file prompt.txt --dump-logits prompt.txt
check "sample --dump-logits on the checkpoint sampled" 2 "this is step_00000003.safetensors, an input of --checkpoint ck" -- \
  "$W" sample --checkpoint ck --dump-logits ck/step_00000003.safetensors
check "sample --dump-logits on the model's weights" 2 "this is model.safetensors, an input of --init-from hf" -- \
  "$W" sample --init-from hf --dump-logits hf/model.safetensors
mkdir mine && echo '{"mine": true}' >mine/config.json
check "export into a directory of someone else's model: refused" 2 \
  "-o mine: it holds config.json, which cephalo-worker export did not write (no .cephalo-export there)" -- \
  "$W" export --checkpoint ck -o mine
check "... their config.json untouched" 0 '"mine": true' -- cat mine/config.json
check "export again into its own directory: fine" 0 "wrote hf: model.safetensors" -- "$W" export --checkpoint ck -o hf
cp ck/step_00000003.safetensors hf2.safetensors
mkdir ex && cp ck/step_00000003.safetensors ex/model.safetensors
check "export of a checkpoint into the directory it lies in, under a name export writes" 2 \
  "--checkpoint ex/model.safetensors: this input is model.safetensors, a file of the export directory -o ex" -- \
  "$W" export --checkpoint ex/model.safetensors -o ex
cp "$REPO/examples/models/demo-gpt.yaml" m.yaml
check "profile -o on its --model file" 2 "-o m.yaml: this is the input --model m.yaml" -- \
  "$W" profile --model m.yaml -o m.yaml

# ---- cephalo run: the run directory ----
mkdir -p user && echo "my cluster" >user/cluster.yaml
cat >user/job.yaml <<'Y'
model: tiny-gpt
batch: 4
steps: 2
seq: 32
devices: [{type: cpu, threads: 1, memory: 256M}]
data: synthetic
Y
check "cephalo run --run-dir . over a cluster.yaml of the user's: refused" 2 \
  "--run-dir .: it holds cluster.yaml, which cephalo run did not write (no .cephalo-run there)" -- \
  bash -c "cd user && '$C' run job.yaml --run-dir . --quiet"
check "... the user's file untouched" 0 "my cluster" -- cat user/cluster.yaml
check "a job file that is a run directory's own file (plan.json): refused" 2 \
  "the job file r/plan.json: this input is plan.json, a file of the run directory --run-dir r" -- \
  bash -c "mkdir -p r && cp user/job.yaml r/plan.json && '$C' run r/plan.json --run-dir r --quiet"
assert "a run directory of cephalo run's is used again" bash -c \
  "'$C' run user/job.yaml --run-dir r2 --quiet >/dev/null && '$C' run user/job.yaml --run-dir r2 --quiet >/dev/null && test -f r2/.cephalo-run"

# ---- cephalo data and plan ----
check "cephalo data: an input that is a shard of -o" 2 "input d/train_000000.bin: this input is train_000000.bin, a file of the data directory -o d" -- \
  "$C" data -o d d/train_000000.bin
check "cephalo plan -o on its cluster file" 2 "-o c.yaml: this is the input --cluster c.yaml" -- bash -c \
  "cp '$REPO/examples/clusters/cluster-a.yaml' c.yaml && '$C' plan --cluster c.yaml --model gpt-350m --batch 64 -o c.yaml"
check "cephalo plan: -o and --dump-costs the same file" 2 "--dump-costs out.json: this is also the output -o out.json" -- \
  "$C" plan --cluster c.yaml --model gpt-350m --batch 64 -o out.json --dump-costs out.json

# ---- the files actually read (issue 38): however an input is named, by device and inode ----
mkdir -p o && ln d/train_000000.bin o/hard.bin
check "--log a hard link of a shard a pattern matches: refused" 2 \
  "--log o/hard.bin: this is train_000000.bin, an input of --data d/train_*.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data 'd/train_*.bin' --log o/hard.bin
check "... of a shard of a data directory" 2 "this is train_000000.bin, an input of --data d" -- \
  "$W" train "${TINY[@]}" --steps 1 --data d --log o/hard.bin
check "... of a validation shard (--val-data DIR)" 2 "an input of --val-data d" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 1 --val-data d --log o/hard.bin
check "... of the second file of a comma list" 2 "this is the input --data d/train_000000.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data "synthetic-is-not-a-file.bin,d/train_000000.bin" --log o/hard.bin
assert "... the shard is still whole (no SIGBUS later)" test "$(sum d/train_000000.bin)" = "$shard"
check "a wildcard in a directory part (d*/train_*.bin)" 2 "an input of --data d*/train_*.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data 'd*/train_*.bin' --log d/train_000000.bin
check "... a new name it would match there" 2 "this is train_000077.bin, an input of --data d*/train_*.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data 'd*/train_*.bin' --log ./d/../d/train_000077.bin
check "a bracket pattern ([d]/train_000000.bin)" 2 "an input of --data [d]/train_000000.bin" -- \
  "$W" train "${TINY[@]}" --steps 1 --data '[d]/train_000000.bin' --log d/train_000000.bin
ln ck/step_00000002.safetensors o/ck.bin
check "--log a hard link of the checkpoint --resume reads (another directory)" 2 \
  "--log o/ck.bin: this is the input --resume ck/step_00000002.safetensors" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 3 --ckpt-dir ck3 --resume ck/step_00000002.safetensors --log o/ck.bin
check "... of a checkpoint of the directory --resume auto reads" 2 \
  "this is step_00000002.safetensors, read back from --ckpt-dir ck" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 4 --ckpt-dir ck --resume auto --log o/ck.bin
ln hf/model.safetensors o/model.bin
check "... of --init-from DIR's model.safetensors" 2 "this is model.safetensors, an input of --init-from hf" -- \
  "$W" train --data synthetic --init-from hf --batch 4 --microbatch 2 --seq 32 --threads 1 --quiet --steps 1 --log o/model.bin
assert "... the checkpoint and the weights are whole" test "$(sum o/ck.bin)" = "$ck2"

# ---- a model directory and a data directory's tokenizer are inputs of their kind ----
check "cephalo plan --model DIR -o DIR/config.json: refused" 2 "-o hf/config.json: this is config.json, an input of --model hf" -- \
  "$C" plan --cluster c.yaml --model hf --batch 8 -o hf/config.json
check "... --dump-costs DIR/config.json" 2 "--dump-costs hf/config.json: this is config.json, an input of --model hf" -- \
  "$C" plan --cluster c.yaml --model hf --batch 8 --dump-costs hf/config.json
check "... a new weights file there (--model hf/)" 2 "this is new.safetensors, an input of --model hf/" -- \
  "$C" plan --cluster c.yaml --model hf/ --batch 8 -o hf/new.safetensors
check "cephalo-worker train --model DIR --log DIR/config.json" 2 "this is config.json, an input of --model hf" -- \
  "$W" train --model hf --batch 4 --microbatch 2 --seq 32 --data synthetic --steps 1 --quiet --log hf/config.json
check "cephalo-worker profile --model DIR -o DIR/model.safetensors" 2 "this is model.safetensors, an input of --model hf" -- \
  "$W" profile --model hf -o hf/model.safetensors
check "cephalo profile --model DIR -o DIR/config.json" 2 "this is config.json, an input of --model hf" -- \
  "$C" profile --model hf --devices cpu:1t:256M -o hf/config.json
mkdir -p dtok && cp d/train_000000.bin dtok/ && echo '{"mine": 1}' >dtok/tokenizer.json
check "--log DATA_DIR/tokenizer.json: refused" 2 "this is tokenizer.json, an input of --data dtok" -- \
  "$W" train "${TINY[@]}" --steps 1 --data dtok --log dtok/tokenizer.json
check "... the tokenizer beside a shard named" 2 "this is the input --data dtok/tokenizer.json" -- \
  "$W" train "${TINY[@]}" --steps 1 --data dtok/train_000000.bin --log dtok/tokenizer.json
check "... untouched" 0 '"mine": 1' -- cat dtok/tokenizer.json

# ---- a run directory owns its checkpoint directory ----
{ cat user/job.yaml && echo "checkpoint: {dir: ckpt, every: 1}"; } >user/ckjob.yaml
"$C" run user/ckjob.yaml --run-dir rc --quiet >/dev/null 2>&1
rck=$(sum rc/ckpt/step_00000002.safetensors)
check "cephalo report RUN -o RUN/ckpt/step_N.safetensors: refused" 2 \
  "-o rc/ckpt/step_00000002.safetensors: this is ckpt/step_00000002.safetensors, an input of RUN_DIR rc" -- \
  "$C" report rc -o rc/ckpt/step_00000002.safetensors
check "... RUN/ckpt/latest" 2 "this is ckpt/latest, an input of RUN_DIR rc" -- "$C" report rc -o rc/ckpt/latest
check "... a checkpoint name not written yet" 2 "this is ckpt/step_00000009.safetensors" -- \
  "$C" report rc -o rc/ckpt/step_00000009.safetensors
assert "... the checkpoint is whole" test "$(sum rc/ckpt/step_00000002.safetensors)" = "$rck"
check "... and the report goes elsewhere" 0 "report: rc/page.html" -- "$C" report rc -o rc/page.html

# ---- what an output path is: a device or FIFO is written in place, never replaced ----
check "an output that is a directory: refused before any work" 2 "-o hf: is a directory, expected a file" -- \
  "$C" plan --cluster c.yaml --model gpt2-124m --batch 64 -o hf
check "... profile-comm's -o too, before it waits for its peers" 2 "-o hf: is a directory, expected a file" -- \
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=9 CEPHALO_COMM_TIMEOUT=5 "$W" profile-comm -o hf
ln -s nowhere.json dangling.json
check "... a symbolic link to nothing: refused" 2 "-o dangling.json: a symbolic link to a file that does not exist" -- \
  "$C" plan --cluster c.yaml --model gpt2-124m --batch 64 -o dangling.json
echo old >target.json && ln -s target.json link.json
"$C" plan --cluster c.yaml --model gpt2-124m --batch 64 -o link.json >/dev/null 2>&1
assert "... a symbolic link to a file: the target is written, the link stays" bash -c \
  "test -L link.json && grep -q '\"strategy\"' target.json"
mkfifo fifo
check "--log a FIFO no process reads: refused, not waited on" 2 "--log fifo: a FIFO that no process reads" -- \
  timeout 60 "$W" train --data synthetic "${TINY[@]}" --steps 1 --log fifo
# the reader holds the FIFO open (read-write: the open never waits) before the report starts, and
# reads until the page's end, at most 60 s
timeout 60 python3 -c "
import os
fd = os.open('fifo', os.O_RDWR)
open('fifo.ready', 'w').close()
got = b''
while b'</html>' not in got:
    got += os.read(fd, 65536)
open('fifo.out', 'wb').write(got)" &
reader=$!
wait_for 60 test -e fifo.ready
check "... a FIFO with a reader: written in place" 0 "report: fifo" -- "$C" report rc -o fifo
wait $reader
assert "... the reader got the page and the FIFO is still one" bash -c "grep -q '<html' fifo.out && test -p fifo"
python3 -c "import socket; socket.socket(socket.AF_UNIX).bind('sock')"
check "an output that is a socket: refused" 2 "-o sock: is a socket" -- "$C" report rc -o sock
mkfifo rcf && cp -r ck ckf && rm ckf/retention.json && mkfifo ckf/retention.json
check "a checkpoint directory's retention.json that is a FIFO: refused, not waited on" 2 \
  "ckf/retention.json: is a FIFO, not a regular file" -- \
  timeout 60 "$W" train --data synthetic "${TINY[@]}" --steps 3 --ckpt-dir ckf --resume auto
mkdir -p cklock && echo "the user's notes" >notes.txt && ln -s ../notes.txt cklock/.lock
check "a checkpoint directory's .lock that is a symbolic link: refused, not written through" 2 \
  "the lock file cklock/.lock is a symbolic link" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 1 --ckpt-dir cklock
check "... the file it points to untouched" 0 "the user's notes" -- cat notes.txt
if [ "$(id -u)" = 0 ]; then
  mknod null c 1 3 && mknod blk b 240 0
  check "as root, cephalo report -o a character device: written in place" 0 "report: null" -- "$C" report rc -o null
  assert "... still the device" test -c null
  check "... cephalo plan -o, and --log, the same" 0 "" -- bash -c \
    "'$C' plan --cluster c.yaml --model gpt2-124m --batch 64 -o null >/dev/null && '$W' train --data synthetic ${TINY[*]} --steps 1 --log null"
  assert "... still the device" test -c null
  check "an output that is a block device: refused" 2 "-o blk: is a block device" -- "$C" report rc -o blk
  assert "... still the device" test -b blk
else
  for i in 1 2 3 4 5 6; do n=$((n + 1)); echo "ok $n - # SKIP device nodes need root (mknod)"; done
fi
