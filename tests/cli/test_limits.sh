#!/usr/bin/env bash
# Names and paths at their documented limits and one beyond (issue 27, "fixed buffers that
# truncate"; docs/run.md "Limits"): at the limit the command works, beyond it exits 2 with a message
# that names the name, path or field and the limit, never a bogus one, and nothing is written
# under a cut path. Run names (a job's name: and one taken from the file name), the checkpoint
# directory (CKPT_DIR_MAX, cephalo run and the worker), the worker's --dump directory, and
# cephalo data's shards near PATH_MAX. tests/unit/test_limits.c covers the library side.
set -u
B=${BUILD:-build/rel}/bin
C=$(cd "$B" && pwd)/cephalo # absolute: some checks run in the test's directory
W=$B/cephalo-worker
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
unset CEPHALO_WORKER CEPHALO_PROFILE_STORE

chars() { head -c "$2" </dev/zero | tr '\0' "$1"; } # chars C N: N copies of C

# longpath BASE LEN: BASE/ddd.../eee, exactly LEN characters, each component under 255
longpath() {
  local p=$1
  while [ $(($2 - ${#p})) -gt 250 ]; do p=$p/$(chars d 200); done
  echo "$p/$(chars e $(($2 - ${#p} - 1)))"
}

job() { # job FILE [NAME]: a job of two devices, named NAME when given
  { [ $# -gt 1 ] && echo "name: $2"
    printf 'model: tiny-gpt\nbatch: 4\nsteps: 2\nseed: 3\ndata: synthetic\n'
    printf 'devices:\n  - {type: cpu, threads: 1, memory: 511M}\n  - {type: cpu, threads: 1, memory: 255M}\n'; } >"$1"
}

# ---- run names: the job's name, and the file name's (63 characters, docs/run.md) ----

n26=$(chars a 26) n63=$(chars b 63) n64=$(chars c 64)
job "$T/n26.yaml" "$n26"
sed -i '$d' "$T/n26.yaml" # one device: the issue's case
check "a run name of 26 characters plans (the cluster text was cut: a YAML error)" 0 "runs/$n26/plan.json" -- \
  bash -c "cd '$T' && '$C' run --dry-run n26.yaml"
job "$T/n63.yaml" "$n63"
check "a run name of 63 characters, the limit" 0 "runs/$n63/plan.json" -- bash -c "cd '$T' && '$C' run --dry-run n63.yaml"
job "$T/n64.yaml" "$n64"
check "64 characters: the field and the limit" 2 "n64.yaml:1: name: '$n64' is not a usable run name (letters, digits, '.', '_' and '-', at most 63 characters)" -- \
  "$C" run --dry-run "$T/n64.yaml"
job "$T/$n63.yaml"
check "a run name of 63 characters from the file name" 0 "runs/$n63/plan.json" -- \
  bash -c "cd '$T' && '$C' run --dry-run '$n63.yaml' --run-dir runs/$n63"
job "$T/$n64.v2.yaml"
check "64 characters from the file name: refused, not cut" 2 "the run name '$n64' taken from the file name is longer than 63 characters; give the job a shorter name: field" -- \
  bash -c "cd '$T' && '$C' run --dry-run '$n64.v2.yaml'"
assert "... not as a YAML syntax error" bash -c "! '$C' run --dry-run '$T/$n64.v2.yaml' 2>&1 | grep -q YAML"
assert "... and no run directory of a cut name" test ! -e "$T/runs/${n64:0:63}"

# ---- the checkpoint directory: at most 3968 characters (CKPT_DIR_MAX) ----

ck=$(longpath "$T/ck" 3968)
job "$T/ck.yaml" "$n63"
printf 'checkpoint: {dir: %s}\n' "$ck" >>"$T/ck.yaml"
check "a run with a checkpoint directory of 3968 characters trains" 0 "final loss" -- \
  "$C" run --quiet "$T/ck.yaml" --run-dir "$T/r-ck"
assert "... and its checkpoint is where it was asked for" test -f "$ck/latest"
assert "... the one latest names" bash -c "test -e \"$ck/\$(cat '$ck/latest')\""
ck1=$(longpath "$T/ck1" 3969)
job "$T/ck1.yaml"
printf 'checkpoint: {dir: %s}\n' "$ck1" >>"$T/ck1.yaml"
check "3969 characters: refused before training, with the field and the limit" 2 "checkpoint.dir: the checkpoint directory '$T/ck1/" -- \
  "$C" run --quiet "$T/ck1.yaml" --run-dir "$T/r-ck1"
check "... at most 3968" 2 "characters long, at most 3968" -- "$C" run --quiet "$T/ck1.yaml" --run-dir "$T/r-ck1"
assert "... and nothing was made of it" test ! -e "$T/ck1"
TINY=(--model tiny-gpt --batch 4 --microbatch 2 --seq 32 --threads 1)
check "the worker refuses --ckpt-dir beyond 3968 at once" 2 "--ckpt-dir: the checkpoint directory '$T/ck1/" -- \
  "$W" train --data synthetic "${TINY[@]}" --steps 1 --ckpt-dir "$ck1"
assert "... and makes nothing of it" test ! -e "$T/ck1"

# ---- the worker's --dump directory (cut at 511 bytes before) ----

dump=$(longpath "$T/dump" 700)
check "--dump into a directory of 700 characters" 0 "" -- "$W" train --data synthetic "${TINY[@]}" --steps 1 --quiet --dump "$dump"
assert "... the dump files are in it" test -f "$dump/init.safetensors" -a -f "$dump/final.safetensors" -a -f "$dump/batches.safetensors"

# ---- cephalo data: shard paths up to PATH_MAX ----

printf 'hello, limits\n%.0s' {1..20} >"$T/text.txt"
# OUT/train_000000.bin and its OUT/train_000000.bin.tmp while written: 4091 + 4 = 4095 characters
out_at=$(longpath "$T/data-at" $((4091 - 17)))
mkdir -p "$(dirname "$out_at")" # -o makes its last directory only
check "shards at the system's path limit" 0 "" -- "$C" data -o "$out_at" "$T/text.txt"
assert "... written" test -s "$out_at/train_000000.bin"
out_beyond=$(longpath "$T/data-beyond" $((4096 - 17)))
mkdir -p "$(dirname "$out_beyond")"
check "one beyond the shard path's limit: named, with the limit" 2 "-o: the shard path '$T/data-beyond/" -- \
  "$C" data -o "$out_beyond" "$T/text.txt"
check "... at most 4095 characters" 2 "is too long (at most 4095 characters)" -- "$C" data -o "$out_beyond" "$T/text.txt"
assert "... and no shard under a cut name" bash -c "! ls '$(dirname "$out_beyond")' | grep -v '^$(basename "$out_beyond")\$'"

