#!/usr/bin/env bash
# Deleting a CephaloJob removes its worker pods, plan ConfigMap and Service through the real
# garbage collector of kube-controller-manager (tests/k8s/apiserver.sh start --control-plane), not
# through the operator: the operator is stopped before the job is deleted, so only the
# ownerReferences it wrote can take the children away. Also: the pods are bound and run by
# kubelet.py on a heartbeated node while the control plane runs.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
AS=tests/k8s/apiserver.sh
OP=${BUILD:-build/rel}/bin/cephalo-operator
WORKER=$(pod_worker) # tests/cli/lib.sh: under SAN=1 the release worker, the operator sanitized

skip_all() { echo "# test_operator_gc.sh: skipped: $*"; exit 0; }
[ -x "$OP" ] || skip_all "$OP is not built (make)"
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
"$AS" built || skip_all "the control plane is not built: run 'sudo tests/k8s/apiserver.sh build'"

dir=$(mktemp -d /tmp/cephalo-operator-gc.XXXXXX)
op_pid= kl_pid=
stop_op() {
  [ -n "$op_pid" ] || return 0
  kill "$op_pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$op_pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$op_pid" 2>/dev/null
  wait "$op_pid" 2>/dev/null
  op_pid=
}
cleanup() {
  stop_op
  [ -z "$kl_pid" ] || { kill "$kl_pid" 2>/dev/null; wait "$kl_pid" 2>/dev/null; }
  "$AS" stop "$dir/k8s" >/dev/null 2>&1; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
exports=$("$AS" start "$dir/k8s" --control-plane 2>"$dir/start.log") || {
  sed 's/^/#   /' "$dir/start.log"; echo "not ok 1 - the control plane did not start"; exit 0; }
eval "$exports"
export KUBECONFIG
K() { kubectl --request-timeout=20s "$@"; }
count() { K get "$1" -l cephalo.dev/job=gc -o name 2>/dev/null | wc -l; }

K apply -f crds/cephalojobs.cephalo.dev.yaml >/dev/null 2>&1
K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev >/dev/null 2>&1
cat <<'EOF' | K create -f - >/dev/null
{"apiVersion":"v1","kind":"Node","metadata":{"name":"gpu-gc","labels":{"kubernetes.io/hostname":"gpu-gc",
 "nvidia.com/gpu.product":"NVIDIA-L4","nvidia.com/gpu.memory":"23034","nvidia.com/gpu.count":"1"}},
 "status":{"capacity":{"cpu":"8","memory":"32Gi","pods":"110","nvidia.com/gpu":"1"},
           "allocatable":{"cpu":"8","memory":"32Gi","pods":"110","nvidia.com/gpu":"1"}}}
EOF
# the node's kubelet: runs the worker pod bound to it, heartbeats the node, and completes the
# graceful deletion of its pods (the API server keeps a bound pod until its kubelet does)
python3 tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" --nodes gpu-gc \
  --first-ip "127.0.$((RANDOM % 240 + 10)).1" --worker "$WORKER" --work "$dir/kl" --extra-arg=--device \
  --extra-arg=cpu --extra-arg=--threads --extra-arg=1 2>"$dir/kubelet.log" &
kl_pid=$!
"$OP" --kubeconfig "$KUBECONFIG" --metrics-addr 0 --leader-elect=false --log-level info \
  --worker-image registry.test/cephalo-worker:1 >"$dir/op.log" 2>&1 &
op_pid=$!
printf 'apiVersion: cephalo.dev/v1alpha1\nkind: CephaloJob\nmetadata: {name: gc}\nspec: {model: {name: tiny-gpt}, data: {path: synthetic}, seqLen: 64, globalBatch: 4, steps: 100000}\n' |
  K apply -f - >/dev/null
assert "the operator creates the job's pod, plan ConfigMap and Service" wait_for 30 bash -c \
  "[ \$(kubectl get pods,configmaps,services -l cephalo.dev/job=gc -o name | wc -l) -ge 3 ]"
assert "... and the pod runs on the node (kubelet.py)" wait_for 30 bash -c \
  "[ \"\$(kubectl get pods -l cephalo.dev/job=gc -o jsonpath='{.items[0].status.phase}')\" = Running ]"
check "... each owned by the CephaloJob (a controller ownerReference)" 0 "CephaloJob gc true" -- \
  bash -c "kubectl get pods,configmaps,services -l cephalo.dev/job=gc -o jsonpath='{range .items[*]}{.metadata.ownerReferences[0].kind} {.metadata.ownerReferences[0].name} {.metadata.ownerReferences[0].controller}{\"\\n\"}{end}' | sort -u"
stop_op
check "with the operator stopped, the job is deleted" 0 "deleted" -- K delete cephalojob gc --wait=false
assert "the garbage collector removes the pod, the ConfigMap and the Service" wait_for 60 bash -c \
  "[ \$(kubectl get pods,configmaps,services -l cephalo.dev/job=gc -o name | wc -l) -eq 0 ]"
check "... and the job itself is gone" 1 "NotFound" -- K get cephalojob gc
