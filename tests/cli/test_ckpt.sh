#!/usr/bin/env bash
# CLI tests of what a run may do to its directories (docs/checkpoints.md, docs/run.md): one run
# per run directory and one training per checkpoint directory (flock, released by the kernel even
# on kill -9), resuming from the newest complete checkpoint that loads when `latest` is missing,
# stale or names a damaged one, never writing over another run's checkpoints without --overwrite,
# retention (keep_last, keep_every), stale temporaries of killed writers, and the messages of
# resuming at or beyond the last step. Prints "ok N - ..." lines.
set -u
B=${BUILD:-build/rel}/bin
C=$B/cephalo
W=$B/cephalo-worker
T=$(mktemp -d)
bg=()
trap 'kill -9 "${bg[@]}" 2>/dev/null; rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
unset CEPHALO_WORKER

TINY=(--model tiny-gpt --batch 4 --microbatch 2 --seq 32 --threads 1 --lr 1e-3)
steps_in() { ls "$1" | grep -Eo '^step_[0-9]+' | sed 's/step_0*//' | sort -n | tr '\n' ' '; }
has_lines() { [ "$(wc -l <"$1")" -ge "$2" ]; }
dead_pid() { # a PID that no process has now
  local p=4000000
  while kill -0 $p 2>/dev/null; do p=$((p + 1)); done
  echo $p
}
flip_byte() { python3 -c "
f=open('$1','r+b'); f.seek(-5,2); b=f.read(1); f.seek(-5,2); f.write(bytes([b[0]^0x40]))"; }

# ---- one run per directory ----

cat >"$T/one.yaml" <<'Y'
model: tiny-gpt
batch: 4
steps: 300
seq: 32
optimizer: {lr: 1e-3}
checkpoint: {dir: ckpt, every: 50}
devices: [{type: cpu, threads: 1, memory: 256M}]
data: synthetic
Y
"$C" run "$T/one.yaml" --run-dir "$T/r-lock" --quiet >"$T/first.out" 2>&1 &
first=$!
bg+=($first)
wait_for 30 has_lines "$T/r-lock/rank-0.jsonl" 2
check "a second cephalo run in the same run directory: exit 2" 2 "is in use by another cephalo run (PID $first" -- \
  "$C" run "$T/one.yaml" --run-dir "$T/r-lock" --quiet
check "a dry run there too" 2 "is in use by another cephalo run" -- "$C" run "$T/one.yaml" --run-dir "$T/r-lock" --dry-run
assert "the first run was left alone" kill -0 $first
{ kill -9 $first; wait $first; } 2>/dev/null
wait_for 10 bash -c "! pgrep -f '$T/r-lock/rank-0.jsonl' >/dev/null"
check "after kill -9 of the launcher, the lock is free: the job resumes" 0 "final loss" -- \
  "$C" run "$T/one.yaml" --run-dir "$T/r-lock" --steps 4 --quiet
# a bare worker locks its checkpoint directory
"$W" train --data synthetic "${TINY[@]}" --steps 100000 --quiet --ckpt-dir "$T/wlock" --log "$T/wlock.jsonl" &
wpid=$!
bg+=($wpid)
wait_for 30 has_lines "$T/wlock.jsonl" 1
check "a second training on one checkpoint directory: exit 2" 2 "$T/wlock is in use by another training (PID $wpid" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 2 --ckpt-dir "$T/wlock" --resume auto
# issue 38: the holder is named as what it is, and before the directory's files are judged (its
# .lock is no file of the user's to move)
check "cephalo run on a training's checkpoint directory: in use by a training, exit 2" 2 \
  "$T/wlock is in use by a training (PID $wpid on host " -- "$C" run "$T/one.yaml" --run-dir "$T/wlock" --dry-run --quiet
{ kill -9 $wpid; wait $wpid; } 2>/dev/null
check "after kill -9 of the worker, the directory is free" 0 "" -- "$W" train --data synthetic "${TINY[@]}" --steps 2 --quiet --ckpt-dir "$T/wlock2"

# ---- resume: the newest complete checkpoint that loads ----

"$W" train --data synthetic "${TINY[@]}" --steps 6 --ckpt-every 2 --quiet --ckpt-dir "$T/ck" --log "$T/straight.jsonl" --keep-last 0
cp -r "$T/ck" "$T/ck-copy"
rm "$T/ck/latest"
sum6=$(md5sum <"$T/ck/step_00000006.safetensors")
check "latest missing: resume auto scans and says so" 0 "latest is missing: resuming from the newest complete checkpoint found there, step_00000006" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 8 --ckpt-every 2 --ckpt-dir "$T/ck" --resume auto --log "$T/scan.jsonl"
assert "latest missing: trained steps 6..7 only, step_6 untouched" python3 -c "
import json
rows=[json.loads(l) for l in open('$T/scan.jsonl')]
assert [r['step'] for r in rows]==[6,7], rows
import hashlib" -a "$(md5sum <"$T/ck/step_00000006.safetensors")" = "$sum6"
assert "latest rewritten" test "$(cat "$T/ck/latest")" = step_00000008.safetensors
# the disk-full path: step_6 written, `latest` still names step_4
rm -rf "$T/ck"; cp -r "$T/ck-copy" "$T/ck"
echo step_00000004.safetensors >"$T/ck/latest"
check "latest behind a complete checkpoint: resume from the newest" 0 "resumed from $T/ck/step_00000006.safetensors at step 6" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 7 --ckpt-dir "$T/ck" --resume auto
rm -rf "$T/ck"; cp -r "$T/ck-copy" "$T/ck"
flip_byte "$T/ck/step_00000006.safetensors"
check "latest names a damaged checkpoint: the next older one, said" 0 "cannot resume from $T/ck/step_00000006.safetensors" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 7 --ckpt-dir "$T/ck" --resume auto --log "$T/older.jsonl"
assert "damaged: resumed at step 4, the damaged one kept aside" python3 -c "
import json,glob
rows=[json.loads(l) for l in open('$T/older.jsonl')]
assert rows[0]['step']==4, rows
assert glob.glob('$T/ck/step_00000006.safetensors.broken-*')"
rm -rf "$T/ck"; cp -r "$T/ck-copy" "$T/ck"
for s in 2 4 6; do flip_byte "$T/ck/step_0000000$s.safetensors"; done
check "every checkpoint damaged: exit 2, never a fresh start" 2 "no checkpoint in $T/ck can be resumed" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 7 --ckpt-dir "$T/ck" --resume auto
assert "every checkpoint damaged: nothing written" test "$(steps_in "$T/ck")" = "2 4 6 "

# ---- never over another run's checkpoints ----

rm -rf "$T/ck"; cp -r "$T/ck-copy" "$T/ck"
check "a fresh start over checkpoints: exit 2, names --overwrite" 2 "--overwrite" -- "$W" train --data synthetic "${TINY[@]}" --steps 8 --ckpt-dir "$T/ck"
check "--resume none: the same" 2 "holds 3 checkpoints beyond step 0" -- "$W" train --data synthetic "${TINY[@]}" --steps 8 --ckpt-dir "$T/ck" --resume none
assert "refused: the checkpoints are untouched" cmp "$T/ck/step_00000006.safetensors" "$T/ck-copy/step_00000006.safetensors"
check "an older checkpoint over newer ones: exit 2" 2 "beyond step 2" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 8 --ckpt-dir "$T/ck" --resume "$T/ck/step_00000002.safetensors"
check "--overwrite: starts at step 2 and deletes the newer ones" 0 "deleted $T/ck/step_00000006.safetensors" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 3 --ckpt-dir "$T/ck" --resume "$T/ck/step_00000002.safetensors" --overwrite
assert "--overwrite: steps 2 and 3 left" test "$(steps_in "$T/ck")" = "2 3 "
check "--overwrite needs --ckpt-dir" 2 "--overwrite needs --ckpt-dir" -- "$W" train --data synthetic "${TINY[@]}" --steps 2 --overwrite

# ---- --resume forms ----

rm -rf "$T/ck"; cp -r "$T/ck-copy" "$T/ck"
check "--resume DIR (a checkpoint directory): its newest" 0 "resumed from $T/ck/step_00000006.safetensors at step 6" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 7 --resume "$T/ck"
check "--resume DIR/latest: followed" 0 "resumed from $T/ck/step_00000006.safetensors at step 6" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 7 --resume "$T/ck/latest"
mkdir -p "$T/empty"
check "--resume auto without --ckpt-dir: exit 2" 2 "--resume auto needs --ckpt-dir" -- "$W" train --data synthetic "${TINY[@]}" --steps 2 --resume auto
echo garbage >"$T/empty/latest"
check "--resume DIR/latest holding no name: exit 2, names the file" 2 "$T/empty/latest: holds 'garbage', not a checkpoint name" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 2 --resume "$T/empty/latest"
check "--resume of a missing DIR/latest: exit 2" 2 "$T/none/latest: cannot open" -- "$W" train --data synthetic "${TINY[@]}" --steps 2 --resume "$T/none/latest"
rm "$T/empty/latest"
check "--resume of an empty directory: exit 2" 2 "holds no complete checkpoint" -- "$W" train --data synthetic "${TINY[@]}" --steps 2 --resume "$T/empty"
check "resuming at or beyond --steps says so" 0 "nothing to train: the checkpoint resumed from is at step 6, and --steps is 4" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 4 --quiet --resume "$T/ck"

# ---- retention ----

"$W" train --data synthetic "${TINY[@]}" --steps 10 --ckpt-every 1 --quiet --ckpt-dir "$T/keep3"
assert "default keep_last 3" test "$(steps_in "$T/keep3")" = "8 9 10 "
"$W" train --data synthetic "${TINY[@]}" --steps 10 --ckpt-every 1 --quiet --ckpt-dir "$T/keep-every" --keep-last 2 --keep-every 4
assert "keep_last 2 + keep_every 4" test "$(steps_in "$T/keep-every")" = "4 8 9 10 "
"$W" train --data synthetic "${TINY[@]}" --steps 5 --ckpt-every 1 --quiet --ckpt-dir "$T/keep-all" --keep-last 0
assert "keep_last 0 keeps all" test "$(steps_in "$T/keep-all")" = "1 2 3 4 5 "
check "bad --keep-last" 2 "--keep-last: '-1'" -- "$W" train --data synthetic "${TINY[@]}" --keep-last -1
check "every deletion is logged with its name and rule" 0 \
  "checkpoint retention: deleted $T/keep3b/step_00000001.safetensors (keep-last 3: older than the 3 newest good checkpoints)" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 4 --ckpt-every 1 --quiet --ckpt-dir "$T/keep3b"

# the settings a directory was made with apply on resume, unless overridden (and said)
"$W" train --data synthetic "${TINY[@]}" --steps 4 --ckpt-every 1 --quiet --ckpt-dir "$T/kept" --keep-last 0 --keep-every 2
check "resumed without the flags: the directory's retention applies, and is said" 0 \
  "checkpoint retention: keep-last 0, as $T/kept/retention.json keeps" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 8 --ckpt-every 1 --quiet --ckpt-dir "$T/kept" --resume auto
assert "... nothing deleted: steps 1-8 all there" test "$(steps_in "$T/kept")" = "1 2 3 4 5 6 7 8 "
check "an override is said" 0 "checkpoint retention: --keep-last 1 overrides the keep-last 0 kept in $T/kept/retention.json" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 10 --ckpt-every 1 --quiet --ckpt-dir "$T/kept" --resume auto --keep-last 1
assert "... and applied with the kept keep-every 2: 2 4 6 8 10" test "$(steps_in "$T/kept")" = "2 4 6 8 10 "
check "... and kept from then on" 0 '"keep_last":1,"keep_every":2' -- cat "$T/kept/retention.json"
printf '{"keep_last": "three"}' >"$T/kept/retention.json"
check "a damaged retention.json stops the run, naming the file and field" 2 "$T/kept/retention.json: keep_last: expected" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 12 --ckpt-every 1 --quiet --ckpt-dir "$T/kept" --resume auto

# a divergence never pushes the last good weights out: with the defaults (keep-last 3,
# diverge-steps 20) and --ckpt-every 5, a run that diverges after step 20 keeps 10, 15 and 20
"$W" train --data synthetic "${TINY[@]}" --steps 20 --ckpt-every 5 --quiet --ckpt-dir "$T/div"
check "a diverging run stops (exit 1) and names the last checkpoint before the divergence" 1 \
  "the last checkpoint before the divergence is $T/div/step_00000020.safetensors; go back to it with --resume $T/div/step_00000020.safetensors --overwrite" -- \
  "$W" train --data synthetic "${TINY[@]}" --lr 10 --clip 0 --steps 200 --ckpt-every 5 --quiet --ckpt-dir "$T/div" --resume auto
assert "... the good checkpoints 10, 15, 20 are kept beside the diverged ones" bash -c \
  "steps_in() { $(declare -f steps_in | tail -n +2); }; steps_in '$T/div' | grep -q '^10 15 20 '"
check "... the diverged ones are recorded" 0 '"diverged":[' -- cat "$T/div/retention.json"
check "... and going back as told works" 0 "resumed from $T/div/step_00000020.safetensors at step 20" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 22 --ckpt-every 1 --ckpt-dir "$T/div" --resume "$T/div/step_00000020.safetensors" --overwrite
assert "... the good run's new steps count again (keep-last 3: 20 21 22)" test "$(steps_in "$T/div")" = "20 21 22 "

# a long retention.json (issue 38): 200,000 marks of checkpoints long gone, read in one pass and
# looked up by binary search. Read with cJSON_GetArrayItem in a loop (a walk from the first item
# for each index: quadratic), 80,000 marks took 10 s and 200,000 about a minute, twice (the run's
# start, and the first checkpoint's mark, which drops them); 60 s bounds what takes a second
mkdir "$T/long"
python3 -c "import json, sys; json.dump({'keep_last': 2, 'keep_every': 0, 'diverged': list(range(10**9, 10**9 + 200000))},
  open(sys.argv[1], 'w'))" "$T/long/retention.json"
t0=$(date +%s.%N)
check "a retention.json of 200,000 marks is read (within 60 s)" 0 "keep-last 2, as $T/long/retention.json keeps" -- \
  timeout 60 "$W" train --data synthetic "${TINY[@]}" --steps 3 --ckpt-every 1 --quiet --ckpt-dir "$T/long"
echo "# ... 3 steps and their checkpoints in $(python3 -c "import sys, time; print('%.2f' % (time.time() - float(sys.argv[1])))" "$t0") s"
check "... the marks of checkpoints no longer there are dropped, the settings kept" 0 '{"keep_last":2,"keep_every":0,"diverged":[]}' -- \
  cat "$T/long/retention.json"
assert "... and applied: keep_last 2" test "$(steps_in "$T/long")" = "2 3 "

# ---- stale temporaries ----

dead=$(dead_pid)
cp -r "$T/ck-copy" "$T/tmps"
touch "$T/tmps/step_00000008.safetensors.tmp.$dead" "$T/tmps/latest.tmp.$dead" "$T/tmps/step_00000010.safetensors.tmp.$$"
check "stale temporaries of dead writers removed at the start" 0 "removed 2 temporary files left by writers that were killed" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 7 --quiet --ckpt-dir "$T/tmps" --resume auto
assert "a live writer's temporary is kept" test -e "$T/tmps/step_00000010.safetensors.tmp.$$" -a ! -e "$T/tmps/latest.tmp.$dead"

# ---- through cephalo run: two ranks, sharded checkpoints ----

cat >"$T/two.yaml" <<'Y'
model: tiny-gpt
batch: 8
steps: 6
seq: 32
strategy: fsdp
optimizer: {lr: 1e-3}
checkpoint: {dir: ckpt, every: 1, keep_last: 2}
devices: [{type: cpu, threads: 1, memory: 256M, count: 2}]
data: synthetic
Y
check "cephalo run: sharded checkpoints every step" 0 "final loss" -- "$C" run "$T/two.yaml" --run-dir "$T/r2" --quiet
assert "cephalo run: keep_last 2 (step directories)" test "$(steps_in "$T/r2/ckpt")" = "5 6 " -a -s "$T/r2/ckpt/step_00000006/index.json"
rm "$T/r2/ckpt/latest"
touch "$T/r2/plan.json.tmp.$dead" "$T/r2/ckpt/step_00000006/rank-00001.safetensors.tmp.$dead"
check "cephalo run: latest missing, the job continues from step 6" 0 "steps 7..8 of 8" -- "$C" run "$T/two.yaml" --run-dir "$T/r2" --steps 8 --quiet
assert "cephalo run: stale temporaries gone" test ! -e "$T/r2/plan.json.tmp.$dead" -a ! -e "$T/r2/ckpt/step_00000006/rank-00001.safetensors.tmp.$dead"
check "cephalo run --steps below the checkpoint: says at which step it is" 0 "is at step 8, and the job has 4 steps" -- \
  "$C" run "$T/two.yaml" --run-dir "$T/r2" --steps 4 --quiet
assert "summary.json: first_step is the checkpoint's" python3 -c "
import json; s=json.load(open('$T/r2/summary.json')); assert s['first_step']==8 and s['steps_run']==0, s"
sed 's/checkpoint: {dir: ckpt, every: 1, keep_last: 2}/checkpoint: {dir: ckpt, every: 1, resume: never}/' "$T/two.yaml" >"$T/two-fresh.yaml"
check "cephalo run, resume: never over checkpoints: refused" 1 "--overwrite" -- "$C" run "$T/two-fresh.yaml" --run-dir "$T/r2" --quiet
check "cephalo run --overwrite: starts afresh" 0 "steps 1..6 of 6" -- "$C" run "$T/two-fresh.yaml" --run-dir "$T/r2" --quiet --overwrite
sed 's/model: tiny-gpt/model: tiny-llama/' "$T/two.yaml" >"$T/two-llama.yaml"
"$C" run "$T/two-llama.yaml" --run-dir "$T/r2" --quiet >"$T/llama.out" 2>&1
assert "another model over a sharded checkpoint: both models named" grep -q "the checkpoint is of model tiny-gpt .*not the tiny-llama being trained" "$T/llama.out" "$T/r2/rank-0.log"

# ---- messages ----

check "a diverging loss stops the run (exit 1)" 1 "the loss diverged" -- "$W" train --data synthetic "${TINY[@]}" --lr 10 --clip 0 --steps 200 --quiet
check "--diverge-steps 0 turns it off" 0 "" -- "$W" train --data synthetic "${TINY[@]}" --lr 10 --clip 0 --steps 30 --quiet --diverge-steps 0
cat >"$T/m.yaml" <<'Y'
model: tiny-gpt
batch: 4
steps: 2
metrics_port: 9400
devices: [{type: cpu, threads: 1, memory: 256M}]
data: synthetic
Y
check "local runs serve /metrics on 127.0.0.1" 0 "--metrics-port 9400 --metrics-addr 127.0.0.1" -- "$C" run "$T/m.yaml" --run-dir "$T/rm" --dry-run
sed -i '4a metrics_addr: 0.0.0.0' "$T/m.yaml"
check "metrics_addr in the job file" 0 "--metrics-addr 0.0.0.0" -- "$C" run "$T/m.yaml" --run-dir "$T/rm" --dry-run
sed -i 's/metrics_addr: 0.0.0.0/metrics_addr: localhost:80/' "$T/m.yaml"
check "a bad metrics_addr" 2 "m.yaml:5: metrics_addr: 'localhost:80' is not an IP address" -- "$C" run "$T/m.yaml" --run-dir "$T/rm" --dry-run

# ---- a rank that holds no share of the state ----
# The plan may give a rank 0% of every unit (make demo's 64 MiB device, keeping its activations
# instead): its shard has no tensors. export and sample read the checkpoint by its format, not by
# a tensor in rank 0's shard (they took it for a --dump file: "tensor 'embedding.wte' not found").
"$C" plan --cluster <(printf 'nodes:\n  - name: l\n    gpus:\n      - {type: cpu, count: 2, threads: 1, memory_gib: 1}\n') \
  --model tiny-gpt --batch 8 --seq 32 -o "$T/even.json" >/dev/null 2>&1
python3 - "$T/even.json" "$T/zero.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for u in p["units"]:
    u["shard_sizes"] = [0, u["numel"]]
n = sum(u["numel"] for u in p["units"])
p["uneven"] = True
p["ranks"][0].update(state_ratio=0.0, state_params=0)
p["ranks"][1].update(state_ratio=1.0, state_params=n)
json.dump(p, open(sys.argv[2], "w"))
PY
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
zp=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CEPHALO_PLAN="$T/zero.json" \
    "$W" train --data synthetic --steps 2 --quiet --ckpt-dir "$T/zck" 2>"$T/zero$r.err" &
  zp+=($!)
done
zrc=0
for p in "${zp[@]}"; do wait "$p" || zrc=1; done
check "a plan giving rank 0 no share of the state trains and checkpoints" 0 "[]" -- bash -c \
  "[ $zrc = 0 ] && python3 -c \"import json, struct; f = open('$T/zck/step_00000002/rank-00000.safetensors', 'rb')
print([k for k in json.loads(f.read(struct.unpack('<Q', f.read(8))[0])) if k != '__metadata__'])\""
check "... export reads that checkpoint" 0 "wrote $T/zexp" -- "$W" export --checkpoint "$T/zck" -o "$T/zexp"
check "... and so does sample" 0 "5 new tokens" -- "$W" sample --checkpoint "$T/zck" --max-new-tokens 5 --seed 1
