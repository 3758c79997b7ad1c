#!/usr/bin/env bash
# test_k8s_demo.sh - `make k8s-demo` (mk/k8s_demo.sh) as a new user runs it: it ends with the job
# Succeeded on the four fake GPUs, prints the dashboard's numbers from a worker and the operator,
# and tears down what it started (no process of the control plane, the kubelet or the pods left,
# its directory gone), also when interrupted (Ctrl-C) while the job trains. About a minute. Skips (a `#` line) when the control plane, kubectl or helm is
# missing, as the other control-plane suites do.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # the demo runs the release binaries; under SAN=1 it is left to the plain make test
command -v kubectl >/dev/null || { echo "# test_k8s_demo.sh skipped: kubectl is not installed (make deps)"; exit 0; }
tests/k8s/apiserver.sh built || { echo "# test_k8s_demo.sh skipped: the control plane is not built (make controlplane)"; exit 0; }
mk/helm.sh >/dev/null 2>&1 || { echo "# test_k8s_demo.sh skipped: helm is not available (mk/helm.sh)"; exit 0; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

BUILD=${BUILD:-build/rel} mk/k8s_demo.sh >"$T/out" 2>&1
rc=$?
check "mk/k8s_demo.sh exits 0" 0 "" -- test "$rc" -eq 0
check "... the job is watched to Succeeded on the 4 fake GPUs" 0 "cpu-demo   Succeeded   4      150" -- cat "$T/out"
check "... after the data-prep pod made the shards on the claim" 0 "train: " -- cat "$T/out"
check "... it prints a worker's numbers (step, loss, samples/s, memory) and the operator's" 0 \
  "cephalo_operator_jobs_succeeded_total 1" -- \
  bash -c "grep -q 'cephalo_train_loss{job=\"cpu-demo\",rank=\"0\"' '$T/out' && grep -q 'cephalo_memory_bytes{job=\"cpu-demo\"' '$T/out' && cat '$T/out'"
check "... the job's status and its plan across the L4s, the A10G and the T4" 0 "on t4 (T4)" -- cat "$T/out"
check "... and the checkpoints on the claim" 0 "step_00000150" -- grep "checkpoints on the claim" "$T/out"
check "... and ends torn down" 0 "k8s-demo: torn down" -- cat "$T/out"
dir=$(grep -o '/tmp/cephalo-k8s-demo\.[A-Za-z0-9]*' "$T/out" | head -1)
left=$([ -n "$dir" ] && pgrep -f "$dir" | tr '\n' ' ') # (here: a check's own command line would name $dir)
check "... its directory removed, no process of it left (etcd, the API server, the kubelet, workers)" 0 "clean" -- \
  bash -c "[ -n '$dir' ] && [ ! -e '$dir' ] && [ -z '$left' ] && echo clean"
if [ "$rc" -ne 0 ]; then tail -20 "$T/out" | sed 's/^/#   /'; fi

# Ctrl-C while the job trains: SIGINT to the demo's process group, as a terminal sends it
setsid env BUILD="${BUILD:-build/rel}" mk/k8s_demo.sh >"$T/int" 2>&1 &
pid=$!
wait_for 120 grep -q 'cpu-demo   Running' "$T/int"
kill -INT -- "-$pid" 2>/dev/null
for _ in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
wait "$pid"
rc=$?
dir=$(grep -o '/tmp/cephalo-k8s-demo\.[A-Za-z0-9]*' "$T/int" | head -1)
left=$([ -n "$dir" ] && pgrep -f "$dir" | tr '\n' ' ')
# (the exit status: 130 from the INT trap, or 1 when kubectl, interrupted too, failed first under set -e)
check "Ctrl-C while the job trains: it stops (exit status not 0), torn down, nothing of it left" 0 "stopped clean" -- \
  bash -c "[ '$rc' -ne 0 ] && grep -q 'k8s-demo: torn down' '$T/int' && [ -n '$dir' ] && [ ! -e '$dir' ] && [ -z '$left' ] && echo 'stopped clean'"
