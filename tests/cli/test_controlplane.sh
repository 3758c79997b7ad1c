#!/usr/bin/env bash
# The whole test control plane (tests/k8s/apiserver.sh start --control-plane: etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager, all v1.20.2 from Debian's source package) with
# tests/k8s/kubelet.py registering two GPU Nodes (gpu-a: 2 nvidia.com/gpu, gpu-b: 1) and running
# what is bound to them. Checks: GET /version is v1.20.2 (what `helm install` compares a chart's
# kubeVersion with); the nodes become Ready and lose the not-ready taint; a Deployment gets a
# ReplicaSet and a Pod from the controller manager, the scheduler binds the pod to a kubelet.py
# node and it runs; a pod with nvidia.com/gpu: 1 and a required node affinity on
# kubernetes.io/hostname lands on that node; a pod asking for more GPUs than any node has stays
# Pending, PodScheduled=False/Unschedulable; a pod pinned (spec.nodeName) to a node whose GPUs are
# taken is refused by the kubelet (Failed, OutOfnvidia.com/gpu); after an API server restart a new
# pod is still scheduled and run; deleting the Deployment (background propagation) then
# garbage-collects its ReplicaSet and Pod; no node was tainted.
# Skips (a `#` line, no checks) when the control plane is not built and cannot be built here.
# Everything started is stopped on exit.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
AS=tests/k8s/apiserver.sh
PY=/usr/bin/python3

skip_all() { echo "# test_controlplane.sh skipped: $*"; exit 0; }
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
if ! "$AS" built; then
  [ "$(id -u)" = 0 ] ||
    skip_all "the control plane is not built and building it needs root: run 'sudo tests/k8s/apiserver.sh build'"
  echo "# building kube-apiserver, kube-scheduler, kube-controller-manager from Debian's kubernetes source package (once; several minutes)"
  blog=$(mktemp)
  # a machine that can build but fails to is a failure, not a skip
  "$AS" build >"$blog" 2>&1 ||
    { echo "not ok 1 - the control plane builds"; tail -5 "$blog" | sed 's/^/#   /'; rm -f "$blog"; exit 0; }
  rm -f "$blog"
fi

dir=$(mktemp -d /tmp/cephalo-controlplane-test.XXXXXX)
kl_pid='' watch_pid=''
stop_kubelet() { # SIGTERM (it stops its pods' processes), SIGKILL after 10 s
  [ -n "$kl_pid" ] || return 0
  kill "$kl_pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$kl_pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$kl_pid" 2>/dev/null
  wait "$kl_pid" 2>/dev/null
  kl_pid=
}
cleanup() {
  [ -n "$watch_pid" ] && kill "$watch_pid" 2>/dev/null
  stop_kubelet
  "$AS" stop "$dir/k8s" >/dev/null 2>&1
  if [ -n "${KEEP_LOGS:-}" ]; then
    mkdir -p "$KEEP_LOGS" && cp "$dir"/*.log "$dir"/k8s/*.log "$KEEP_LOGS/" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the control plane --------------------------------------------------------------------------
n=$((n + 1))
if ! exports=$("$AS" start "$dir/k8s" --control-plane 2>"$dir/start.log"); then
  echo "not ok $n - the control plane starts (etcd, apiserver, scheduler, controller-manager)"
  sed 's/^/#   /' "$dir/start.log"
  exit 0
fi
echo "ok $n - the control plane starts (etcd, apiserver, scheduler, controller-manager)"
eval "$exports"
export KUBECONFIG
K() { kubectl --request-timeout=20s "$@"; }
curl_api() { curl -sS --cacert "$K8S_CA" -H "Authorization: Bearer $K8S_TOKEN" "$@"; }
jp() { K get "$@" 2>/dev/null; }

check "GET /version is v1.20.2 (major 1, minor 20, tree clean)" 0 "version ok" -- bash -c \
  "$(declare -f curl_api); K8S_CA='$K8S_CA' K8S_TOKEN='$K8S_TOKEN'
   curl_api -f '$K8S_SERVER/version' | $PY -c 'import json, sys; v = json.load(sys.stdin)
assert (v[\"gitVersion\"], v[\"major\"], v[\"minor\"], v[\"gitTreeState\"]) == (\"v1.20.2\", \"1\", \"20\", \"clean\"), v
print(\"version ok\")'"
check "kube-scheduler and kube-controller-manager report v1.20.2 too" 0 "" -- bash -c \
  "$AS built && for c in kube-scheduler kube-controller-manager; do
     \"\${CEPHALO_K8S_CACHE:-\${XDG_CACHE_HOME:-\$HOME/.cache}/cephalo-k8s}/bin/\$c\" --version | grep -qx 'Kubernetes v1.20.2' || exit 1; done"
check "the scheduler and the controller manager answer /healthz" 0 "okok" -- bash -c \
  "curl -fsk https://127.0.0.1:$(cat "$dir/k8s/scheduler.port")/healthz &&
   curl -fsk https://127.0.0.1:$(cat "$dir/k8s/controller-manager.port")/healthz"

# ---- the kubelet registers two GPU nodes ---------------------------------------------------------
# every change of every node, with its taints' keys, for the last check (no --request-timeout:
# the watch lasts the whole test)
kubectl get nodes --watch -o jsonpath='{.metadata.name} {.spec.taints[*].key}{"\n"}' >"$dir/nodes.watch" 2>"$dir/nodes.watch.err" &
watch_pid=$!
$PY tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" --nodes gpu-a,gpu-b \
  --register --node-gpus gpu-a=2 --node-gpus gpu-b=1 --node-label gpu-a:nvidia.com/gpu.product=NVIDIA-L4 \
  --worker /bin/false --work "$dir/kl" 2>"$dir/kubelet.log" &
kl_pid=$!
taints() { jp nodes -o jsonpath='{range .items[*]}{.metadata.name}={.spec.taints}{"\n"}{end}'; }
nodes_ready() { # both nodes Ready, no taint left (the not-ready taint of a new node is gone)
  [ "$(jp nodes -o jsonpath='{range .items[*]}{.metadata.name}:{.status.conditions[?(@.type=="Ready")].status}:{.spec.taints} {end}')" \
    = "gpu-a:True: gpu-b:True: " ]
}
assert "kubelet.py registers gpu-a and gpu-b; they become Ready and the node controller takes the not-ready taint off" \
  wait_for 30 nodes_ready
check "... with allocatable nvidia.com/gpu 2 and 1, and their labels" 0 "gpu-a 2 NVIDIA-L4 gpu-b 1" -- \
  jp nodes -o jsonpath='{range .items[*]}{.metadata.name} {.status.allocatable.nvidia\.com/gpu} {.metadata.labels.nvidia\.com/gpu\.product} {end}'
check "... and a Lease each in kube-node-lease, renewed by kubelet.py" 0 "gpu-a gpu-b" -- \
  jp leases -n kube-node-lease -o jsonpath='{.items[*].spec.holderIdentity}'

# ---- a Deployment: ReplicaSet, Pod, scheduled, running ------------------------------------------
K create deployment web --image=busybox -- sleep 3600 >/dev/null
owned() { # KIND NAME: the name of the (one) object of kind KIND owned by NAME
  K get "$1" -o jsonpath="{range .items[?(@.metadata.ownerReferences[0].name==\"$2\")]}{.metadata.name}{end}" 2>/dev/null
}
assert "the controller manager makes a ReplicaSet for the Deployment" wait_for 20 bash -c "[ -n \"\$($(declare -f owned K); owned rs web)\" ]"
rs=$(owned rs web)
assert "... and a Pod for the ReplicaSet" wait_for 20 bash -c "[ -n \"\$($(declare -f owned K); owned pods $rs)\" ]"
pod=$(owned pods "$rs")
assert "the scheduler binds the pod to a node and kubelet.py runs it (Running)" wait_for 30 bash -c \
  "[ \"\$(kubectl get pod $pod -o jsonpath='{.status.phase}')\" = Running ]"
check "... on gpu-a or gpu-b, PodScheduled by the scheduler" 0 "ok" -- bash -c \
  "kubectl get pod $pod -o jsonpath='{.spec.nodeName} {.status.conditions[?(@.type==\"PodScheduled\")].status}' |
   grep -qxE 'gpu-[ab] True' && echo ok"
check "... as a local 'sleep 3600' (the container's command)" 0 "sleep 3600" -- grep "start default/$pod " "$dir/kubelet.log"

# ---- GPUs: placement, unschedulable, the kubelet's admission -----------------------------------
gpu_pod() { # NAME GPUS [NODE_AFFINITY_HOST | nodeName=NODE]
  local placement=''
  case "${3:-}" in
    nodeName=*) placement="\"nodeName\": \"${3#nodeName=}\"," ;;
    ?*) placement="\"affinity\": {\"nodeAffinity\": {\"requiredDuringSchedulingIgnoredDuringExecution\":
          {\"nodeSelectorTerms\": [{\"matchExpressions\": [{\"key\": \"kubernetes.io/hostname\",
           \"operator\": \"In\", \"values\": [\"$3\"]}]}]}}}," ;;
  esac
  K create -f - >/dev/null <<EOF
{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "$1"},
 "spec": {$placement "terminationGracePeriodSeconds": 1,
  "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "3600"],
                  "resources": {"limits": {"nvidia.com/gpu": "$2"}}}]}}
EOF
}
phase() { jp pod "$1" -o jsonpath='{.status.phase}'; }
gpu_pod one-gpu 1 gpu-b
assert "a pod with nvidia.com/gpu: 1 and a required node affinity on kubernetes.io/hostname=gpu-b runs" \
  wait_for 30 bash -c "[ \"\$(kubectl get pod one-gpu -o jsonpath='{.status.phase}')\" = Running ]"
check "... on gpu-b" 0 "gpu-b" -- jp pod one-gpu -o jsonpath='{.spec.nodeName}'
gpu_pod three-gpus 3
unschedulable() {
  [ "$(jp pod three-gpus -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].status}/{.status.conditions[?(@.type=="PodScheduled")].reason}')" = False/Unschedulable ]
}
assert "a pod asking for 3 GPUs (no node has more than 2) gets PodScheduled=False, Unschedulable" wait_for 30 unschedulable
check "... names the GPUs as what is missing" 0 "Insufficient nvidia.com/gpu" -- \
  jp pod three-gpus -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}'
check "... and stays Pending, unbound" 0 "Pending/" -- jp pod three-gpus -o jsonpath='{.status.phase}/{.spec.nodeName}'
# past the scheduler (spec.nodeName set by the creator, as the operator does): gpu-b's one GPU is
# one-gpu's, so the kubelet's admission refuses the pod
gpu_pod pinned 1 nodeName=gpu-b
assert "a pod pinned to gpu-b, whose GPU is taken, is refused by the kubelet (Failed)" wait_for 20 bash -c \
  "[ \"\$(kubectl get pod pinned -o jsonpath='{.status.phase}')\" = Failed ]"
check "... reason OutOfnvidia.com/gpu, with a kubelet's message" 0 \
  "OutOfnvidia.com/gpu: Pod Node didn't have enough resource: nvidia.com/gpu, requested: 1, used: 1, capacity: 1" -- \
  jp pod pinned -o jsonpath='{.status.reason}: {.status.message}'
check "... and never ran" 1 "" -- grep -q "start default/pinned " "$dir/kubelet.log"

# ---- an API server restart: the scheduler and the controller manager carry on ---------------------
check "the API server restarts (apiserver.sh restart; the scheduler and the controller manager stay)" 0 "" -- \
  "$AS" restart "$dir/k8s"
K run after-restart --image=busybox --restart=Never --command -- sleep 3600 >/dev/null
assert "a pod created after the restart is scheduled and runs" wait_for 30 bash -c \
  "[ \"\$(kubectl get pod after-restart -o jsonpath='{.status.phase}')\" = Running ]"

# ---- garbage collection --------------------------------------------------------------------------
check "the Deployment is deleted with background propagation" 0 '"status": "Success"' -- \
  curl_api -X DELETE -H 'Content-Type: application/json' \
  --data '{"kind":"DeleteOptions","apiVersion":"v1","propagationPolicy":"Background"}' \
  "$K8S_SERVER/apis/apps/v1/namespaces/default/deployments/web"
assert "the garbage collector deletes its ReplicaSet" wait_for 30 bash -c "! kubectl get rs $rs >/dev/null 2>&1"
assert "... and its Pod (stopped by kubelet.py, which completes the deletion)" wait_for 30 bash -c \
  "! kubectl get pod $pod >/dev/null 2>&1"
check "... whose process got SIGTERM" 0 "stop default/$pod" -- cat "$dir/kubelet.log"

# ---- the nodes at the end ------------------------------------------------------------------------
kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null; watch_pid=
check "no node was tainted: after the not-ready taint of a new node went, no taint came (a watch of every change)" 0 \
  "untainted" -- $PY - "$dir/nodes.watch" <<'PY'
import sys
seen_clean, bad = set(), []
for line in open(sys.argv[1]).read().splitlines():
    name, _, keys = line.partition(' ')
    keys = keys.split()
    if not keys:
        seen_clean.add(name)
    elif name in seen_clean or keys != ['node.kubernetes.io/not-ready']:
        bad.append(line)
assert seen_clean == {'gpu-a', 'gpu-b'} and not bad, (seen_clean, bad)
print('untainted')
PY
check "the scheduler and the controller manager are still running" 0 "" -- \
  kill -0 "$(cat "$dir/k8s/scheduler.pid")" "$(cat "$dir/k8s/controller-manager.pid")"
stop_kubelet
pids=$(cat "$dir"/k8s/*.pid | tr '\n' ' ')
"$AS" stop "$dir/k8s"
check "stop ends all four (etcd, apiserver, scheduler, controller-manager)" 0 "" -- \
  bash -c "for p in $pids; do ! kill -0 \$p 2>/dev/null || exit 1; done"
