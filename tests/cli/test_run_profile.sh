#!/usr/bin/env bash
# CLI tests of `cephalo run` profiling the devices before planning (cli/profile_cache.h,
# docs/run.md): the first run profiles and caches under a key of the device signature and the
# model; the second plans from the cache without profiling; a corrupt or mismatched entry is
# reported and measured again; a cache that cannot keep the entry (an entry that is a directory,
# a cache path that is a file) says why and plans from the profile measured all the same; another model or other devices get another key; --no-profile,
# a job's own profile, a dry run and CEPHALO_PROFILE_CACHE=none profile nothing.
set -u
B=${BUILD:-build/rel}/bin
C=$B/cephalo
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
unset CEPHALO_WORKER
export OMP_WAIT_POLICY=PASSIVE CEPHALO_PROFILE_STORE=none CEPHALO_PROFILE_CACHE=$T/cache

job() { # job NAME MODEL
  cat >"$T/$1.yaml" <<Y
model: $2
data: synthetic
batch: 4
steps: 2
optimizer: {lr: 1e-4}
devices: [{type: cpu, threads: 1, memory: 256M, count: 2}]
Y
}
job a tiny-gpt
job b tiny-llama
run() { "$C" run "$@" --quiet; }
n_entries() { find "$T/cache" -name '*.json' | wc -l; }

check "first run: profiles the devices before planning, with progress" 0 "profiling the devices for tiny-gpt before planning" -- \
  bash -c "'$C' run '$T/a.yaml' --run-dir '$T/r1' 2>&1 | tee '$T/r1.out'; exit \${PIPESTATUS[0]}"
check "... its step check trains the job's own batch (4), where the plan will run" 0 \
  "step check: 8 training steps at batch 2 and 4 on the 2 devices" -- cat "$T/r1.out"
check "... and plans from what it measured" 0 "" -- python3 -c "
import json; p = json.load(open('$T/r1/plan.json'))
assert p['inputs']['costs'] == 'profiled' and all(r['measured'] for r in p['ranks']), p['inputs']"
assert "... cached as KEY.json beside KEY.sig (one entry)" test "$(n_entries)" = 1 -a "$(find "$T/cache" -name '*.sig' | wc -l)" = 1
key=$(basename "$(find "$T/cache" -name '*.json')" .json)
check "the signature names the CPU, cores, build, devices, model, seq and precision" 0 "" -- bash -c "
  s='$T/cache/$key.sig'; grep -q '^cpu: .' \$s && grep -q '^cores: [0-9]' \$s && grep -q '^build: [0-9]' \$s &&
  grep -qx 'devices: cpu:1t:268435456x2' \$s && grep -q '^model: tiny-gpt [0-9a-f]\{16\}$' \$s && grep -qx 'seq: 0' \$s &&
  grep -qx 'precision: fp32' \$s"
out=$(run "$T/a.yaml" --run-dir "$T/r2" 2>&1)
check "second run: plans from the cache at once" 0 "costs from the cached profile $T/cache/$key.json (no profiling needed)" -- echo "$out"
assert "... without profiling" bash -c "! grep -q 'profiling the devices' <<<'$out'"
check "a dry run uses the cache too" 0 "no profiling needed" -- "$C" run "$T/a.yaml" --run-dir "$T/r3" --dry-run

printf '{"format": "cephalo-profile", "version": 1, "entries": [' >"$T/cache/$key.json"
check "a corrupt entry: a warning, profiled again, the run goes on" 0 "warning: the cached profile is unusable" -- \
  run "$T/a.yaml" --run-dir "$T/r4"
check "... and the entry is whole again" 0 "no profiling needed" -- run "$T/a.yaml" --run-dir "$T/r5"
echo "cephalo profile cache 1" >"$T/cache/$key.sig"
check "a signature that is not this job's: measured again" 0 "does not match this job's devices and model" -- \
  run "$T/a.yaml" --run-dir "$T/r6"

# issue 38: a cache that cannot keep the entry costs the entry, never the profile just measured
mv "$T/cache/$key.json" "$T/entry.json" && mkdir "$T/cache/$key.json"
out=$(run "$T/a.yaml" --run-dir "$T/r6d" 2>&1)
check "an entry that is a directory: said why, measured again" 0 \
  "the cached profile is unusable: $T/cache/$key.json: is a directory" -- echo "$out"
check "... why it cannot be kept" 0 \
  "warning: the profile cannot be kept in the cache: $T/cache/$key.json: is a directory, expected a file; this run plans from it all the same" -- echo "$out"
check "... and the run plans from the profile just measured" 0 "" -- python3 -c "
import json; p = json.load(open('$T/r6d/plan.json'))
assert p['inputs']['costs'] == 'profiled' and all(r['measured'] for r in p['ranks']), p['inputs']"
rmdir "$T/cache/$key.json" && mv "$T/entry.json" "$T/cache/$key.json"
: >"$T/cachefile"
out=$(CEPHALO_PROFILE_CACHE=$T/cachefile "$C" run "$T/a.yaml" --run-dir "$T/r6f" --quiet 2>&1)
check "a cache directory that is a file: measured, said why it is not kept" 0 \
  "warning: the profile cannot be kept in the cache: $T/cachefile: " -- echo "$out"
check "... and the run plans from it" 0 "note: costs from the profile just measured (not cached): measured for 1 of 1" -- echo "$out"

check "another model: profiled under another key" 0 "profiling the devices for tiny-llama" -- run "$T/b.yaml" --run-dir "$T/r7"
assert "... two entries" test "$(n_entries)" = 2
check "other devices: another key" 0 "profiling the devices for tiny-gpt" -- \
  run "$T/a.yaml" --run-dir "$T/r8" --devices cpu:1t:128Mx2
assert "... three entries" test "$(n_entries)" = 3

out=$(run "$T/a.yaml" --run-dir "$T/r9" --no-profile 2>&1)
assert "--no-profile: no profile, no cache" bash -c "! grep -q 'profil' <<<'$out'"
rm -rf "$T/cache"
check "a dry run with nothing cached measures nothing" 0 "no cached profile of these devices for tiny-gpt" -- \
  "$C" run "$T/a.yaml" --run-dir "$T/r10" --dry-run
assert "... and writes no cache" test ! -e "$T/cache"
out=$(CEPHALO_PROFILE_CACHE=none "$C" run "$T/a.yaml" --run-dir "$T/r11" 2>&1)
assert "CEPHALO_PROFILE_CACHE=none: estimates, nothing profiled or cached" bash -c "
  grep -q 'costs: analytic estimates' <<<'$out' && ! grep -q 'profil' <<<'$out' && test ! -e '$T/cache'"
"$C" profile --devices cpu:1t:256Mx2 --model tiny-gpt --max-micro 2 --quick --store none -o "$T/own.json" 2>/dev/null
printf 'profile: %s\n' "$T/own.json" >>"$T/a.yaml"
out=$(run "$T/a.yaml" --run-dir "$T/r12" 2>&1)
assert "a job's own profile: nothing profiled" bash -c "! grep -q 'profiling the devices' <<<'$out' && test ! -e '$T/cache'"
echo "1..$n"
