# lib.sh - the "ok N - name" / "not ok N - name" protocol shared by the CLI test scripts
# (tests/run.sh counts those lines). Source it after setting `set -u`; it keeps the count in $n.
n=0
# `cephalo run` profiles the devices before planning unless this is none (cli/profile_cache.h): a
# test's plan must not depend on the host's timing or a developer's cache
export CEPHALO_PROFILE_CACHE=none

# Under the sanitizers (make test SAN=1: BUILD is build/san) the suites run to find memory and
# undefined-behaviour errors on the C paths they take, not numerical ones: SAN_LIGHT=1 there, and
# a suite that runs one path over several models, world sizes or formats runs one of each path
# (every check runs in the plain `make test`; docs/development.md, the `make test SAN=1` entry).
case ${BUILD:-build/rel} in *san*) SAN_LIGHT=1 ;; *) SAN_LIGHT=0 ;; esac
# san_once: called by a suite that runs none of the build's binaries (scripts, the chart, the
# control plane, the docs): its result is the same whatever BUILD is, so under the sanitizers it
# is left to the plain `make test` (it says so, and counts no check).
san_once() {
  [ "$SAN_LIGHT" = 1 ] || return 0
  echo "# $(basename "$0"): runs none of \$BUILD's binaries: checked once, in the plain make test"
  exit 0
}
# san_skip NAME PICKED...: under SAN_LIGHT, true (skip NAME) unless NAME is one of the picked cases
san_skip() {
  local name=$1
  shift
  [ "$SAN_LIGHT" = 1 ] || return 1
  case " $* " in *" $name "*) return 1 ;; esac
  return 0
}

# pod_worker: the cephalo-worker the operator suites' kubelet runs in the pods. Those suites test
# the operator (its sanitized binary under SAN=1); sanitized workers only make their training
# slower there, and the workers' paths get the sanitizers in their own suites. So under SAN_LIGHT the release build's worker when it is there and of the same version
# (a worker of another release refuses the operator's pods); else the build's own.
pod_worker() {
  local own=${BUILD:-build/rel}/bin/cephalo-worker rel=build/rel/bin/cephalo-worker
  if [ "$SAN_LIGHT" = 1 ] && [ -x "$rel" ] && [ "$("$rel" --version 2>&1)" = "$("$own" --version 2>&1)" ]; then
    echo "$rel"
  else
    echo "$own"
  fi
}

# copy_tree DEST DIR...: a fresh copy of the repository's DIRs in DEST, for a checker's test to
# plant one breach at a time in (test_layers.sh, test_doc_layout.sh)
copy_tree() {
  local dest=$1
  shift
  rm -rf "$dest" && mkdir -p "$dest" && cp -r "$@" "$dest/"
}

# check NAME EXPECTED_RC NEEDLE -- command...   (NEEDLE must appear in stdout+stderr; '' skips)
check() {
  local name=$1 want=$2 needle=$3
  shift 4
  n=$((n + 1))
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "not ok $n - $name (exit $rc, expected $want)"; echo "$out" | tail -5 | sed 's/^/#   /'; return
  fi
  if [ -n "$needle" ] && ! grep -qF -- "$needle" <<<"$out"; then
    echo "not ok $n - $name (output lacks: $needle)"; echo "$out" | tail -5 | sed 's/^/#   /'; return
  fi
  echo "ok $n - $name"
}

# assert NAME COMMAND...   (passes when the command succeeds)
assert() {
  local name=$1
  shift
  n=$((n + 1))
  if "$@" >/dev/null 2>&1; then echo "ok $n - $name"; else echo "not ok $n - $name"; fi
}

# wait_for SECONDS COMMAND...   (until the command succeeds, output discarded; 1 when time runs out)
wait_for() {
  local end=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do [ $SECONDS -ge $end ] && return 1; sleep 0.1; done
}

# wait_moving STALL 'GLOB' COMMAND...   (until the command succeeds, as long as the files GLOB
# names keep growing). For waits on training: how long 100 steps take depends on the machine and
# on what else runs on it, so the bound is on the workers' logs standing still for STALL seconds,
# not on the wall clock (a cap of 900 s keeps a job that logs but never gets there from hanging).
wait_moving() {
  local stall=$1 glob=$2 last=-1 size moved=$SECONDS end=$((SECONDS + 900))
  shift 2
  until "$@" >/dev/null 2>&1; do
    # shellcheck disable=SC2086 # GLOB is expanded here, on purpose
    size=$(stat -c %s $glob 2>/dev/null | awk '{s += $1} END {print s + 0}')
    [ "$size" != "$last" ] && { last=$size; moved=$SECONDS; }
    { [ $((SECONDS - moved)) -ge "$stall" ] || [ $SECONDS -ge $end ]; } && return 1
    sleep 0.2
  done
}

# losses_within REL STEPS REF.jsonl RUN.jsonl...: each run's log has STEPS steps and each step's
# loss within REL (relative) of REF's; fails printing the losses (for check ... -- losses_within)
losses_within() {
  /usr/bin/python3 - "$@" <<'PY'
import json, sys
rel, steps, ref, runs = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
a = [json.loads(l)['loss'] for l in open(ref)]
for f in runs:
    b = [json.loads(l)['loss'] for l in open(f)]
    assert len(a) == len(b) == steps and all(abs(x - y) <= rel * x for x, y in zip(a, b)), (f, a, b)
PY
}

# params_agree A B LR STEPS: two checkpoints of runs that differ only in the order of their sums
# (another plan, other microbatches, another BLAS kernel) hold the same parameters: rms(a - b) per
# unit within 1e-2 of AdamW's largest move, lr x steps (`plan_tool.py compare --step` says why an
# element-wise bound fails on another machine and what a wrong gradient does to this one)
params_agree() {
  /usr/bin/python3 tests/fsdp/plan_tool.py compare "$1" "$2" --step "$(awk "BEGIN {print $3 * $4}")" --tol 1e-2
}

# api_refusals FILE...: the lines where the operator's API client was refused (HTTP 403), as
# kube.c reports them ("HTTP 403 (Forbidden): ..."). Not a bare "403": commit hashes, ports and
# times in the same logs contain it (a version line "0.1.0+4a20167d403e" once failed CI). FILE - reads stdin.
api_refusals() { grep -hE 'HTTP 403([^0-9]|$)|[Ff]orbidden' "$@"; }

# bound_claim NS NAME: a PersistentVolumeClaim marked Bound through its status, for the suites
# whose control plane runs no volume binder (the operator reads a job's claims before it makes
# the pods: a missing or unbound one keeps them from being made)
bound_claim() {
  printf '{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"%s","namespace":"%s"},"spec":{"accessModes":["ReadWriteMany"],"resources":{"requests":{"storage":"1Gi"}}}}' \
    "$2" "$1" | kubectl create -f - >/dev/null &&
    kubectl patch pvc "$2" -n "$1" --subresource=status --type merge -p '{"status":{"phase":"Bound"}}' >/dev/null
}
