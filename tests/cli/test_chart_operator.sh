#!/usr/bin/env bash
# The chart's operator Deployment running for real: the whole test control plane
# (tests/k8s/apiserver.sh start --control-plane: etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager, v1.20.2) and tests/k8s/kubelet.py registering a CPU node (cpu-0) and two
# GPU nodes (gpu-a: NVIDIA-L4, gpu-b: NVIDIA-A10G, one GPU each, with GPU Feature Discovery's
# labels), heartbeat every 5 s. kubelet.py maps the operator image of the release to
# cephalo-operator (--image-cmd: the container's args after it, as the image's entry point) and runs
# the worker pods as cephalo-worker --device cpu, and gives each pod its ServiceAccount's token, CA
# and namespace (--service-account-tokens: from the token Secret that the controller manager's token
# controller made; $CEPHALO_SERVICEACCOUNT_DIR stands for /var/run/secrets/...) and
# KUBERNETES_SERVICE_HOST/PORT of the API server. Checks:
#  * `helm install --wait` with image values kubelet.py maps: the controller manager makes the
#    Deployment's ReplicaSet and Pod, the scheduler binds the pod to cpu-0 (the chart's default node
#    affinity keeps it off the GPU nodes), kubelet.py runs the operator in it; the operator uses the
#    in-cluster configuration (the chart's ServiceAccount and RBAC), takes the leader-election Lease
#    as the pod, answers /readyz, and the Deployment becomes available;
#  * a tiny CephaloJob (tiny-gpt, a few steps, CPU-emulated) is planned by that operator: its plan
#    ConfigMap and worker pods (one per GPU node) are made, the workers run on gpu-a and gpu-b, and
#    the job goes Succeeded;
#  * installed with operator.watchNamespaces [ml, ml2]: the operator may not create pods in
#    kube-system, and runs jobs in both namespaces; ml2's ResourceQuota (CPU and memory requests
#    and a memory limit required) refuses a job's pods, the status quoting the quota
#    (PodsNotCreated), until its spec.template gives them: then it runs, its pods labelled and
#    with the template's requests beside their GPU;
#  * `helm upgrade --wait` with a new image tag, metrics port and log level rolls the Deployment:
#    a new ReplicaSet and Pod that runs the new arguments and takes the Lease, the old pod stopped
#    and deleted;
#  * `helm uninstall` removes the Deployment, and the garbage collector its ReplicaSet and Pod (the
#    operator process stopped by kubelet.py); the CRD and the CephaloJob stay;
#  * no request of the operator was refused while the release was installed (no 403/Forbidden in
#    its logs; once `helm uninstall` has deleted its RoleBinding, releasing the Lease as it stops
#    may be refused, which is harmless: the Lease expires).
# Skips (a `#` line, no checks) when the control plane, the binaries, kubectl or helm are missing.
# Everything started is stopped on exit; with KEEP_LOGS=DIR the logs are copied there first.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
AS=tests/k8s/apiserver.sh
OP=$(realpath -ms "${BUILD:-build/rel}/bin/cephalo-operator")
WORKER=$(realpath -ms "$(pod_worker)") # tests/cli/lib.sh: under SAN=1 the release worker
PY=/usr/bin/python3
NS=cephalo-system # the release namespace
JNS=ml            # the job's namespace
JNS2=ml2          # a second one: the operator watches both (operator.watchNamespaces)
OP_IMAGE=registry.test/cephalo/cephalo-operator
WORKER_IMAGE=registry.test/cephalo/cephalo-worker

skip_all() { echo "# test_chart_operator.sh skipped: $*"; exit 0; }
{ [ -x "$OP" ] && [ -x "$WORKER" ]; } || skip_all "$OP or $WORKER is not built (make)"
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
"$AS" built || skip_all "the control plane is not built: run 'sudo tests/k8s/apiserver.sh build'"
HELM=$(mk/helm.sh 2>/dev/null) || skip_all "helm is not available (mk/helm.sh failed)"

dir=$(mktemp -d /tmp/cephalo-chart-operator.XXXXXX)
kl_pid=''
stop_kubelet() { # SIGTERM (it stops its pods' processes), SIGKILL after 10 s
  [ -n "$kl_pid" ] || return 0
  kill "$kl_pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$kl_pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$kl_pid" 2>/dev/null
  wait "$kl_pid" 2>/dev/null
  kl_pid=
}
cleanup() {
  stop_kubelet
  # processes of pods the kubelet could not stop (it was killed): by their pid files
  for f in "$dir"/kl/pids/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  "$AS" stop "$dir/k8s" >/dev/null 2>&1
  if [ -n "${KEEP_LOGS:-}" ]; then
    mkdir -p "$KEEP_LOGS" && cp -r "$dir"/*.log "$dir/kl/logs" "$dir"/k8s/*.log "$KEEP_LOGS/" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the control plane and the nodes -------------------------------------------------------------
n=$((n + 1))
if ! exports=$("$AS" start "$dir/k8s" --control-plane 2>"$dir/start.log"); then
  echo "not ok $n - the control plane starts (etcd, apiserver, scheduler, controller-manager)"
  sed 's/^/#   /' "$dir/start.log"
  exit 0
fi
echo "ok $n - the control plane starts (etcd, apiserver, scheduler, controller-manager)"
eval "$exports"
export KUBECONFIG
export HELM_CACHE_HOME=$dir/helm HELM_CONFIG_HOME=$dir/helm HELM_DATA_HOME=$dir/helm
K() { kubectl --request-timeout=20s "$@"; }
H() { "$HELM" --namespace "$NS" "$@"; }
jp() { K get "$@" 2>/dev/null; }
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# the operator listens on :PORT (all addresses, as in its own network namespace in a real pod):
# a port of its own per rollout, the old and the new pod running side by side for a moment
port1=$(free_port) port2=$(free_port)
while [ "$port2" = "$port1" ]; do port2=$(free_port); done

gfd() { # NODE PRODUCT MEMORY_MIB: GPU Feature Discovery's labels (and the GPU operator's gpu.present)
  echo "--node-label=$1:nvidia.com/gpu.product=$2 --node-label=$1:nvidia.com/gpu.memory=$3"
  echo "--node-label=$1:nvidia.com/gpu.count=1 --node-label=$1:nvidia.com/gpu.present=true --node-gpus=$1=1"
}
# shellcheck disable=SC2046
$PY tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" \
  --nodes cpu-0,gpu-a,gpu-b --register $(gfd gpu-a NVIDIA-L4 23034) $(gfd gpu-b NVIDIA-A10G 23028) \
  --heartbeat 5 --first-ip "127.0.$((RANDOM % 240 + 10)).1" --work "$dir/kl" \
  --image-cmd "$OP_IMAGE=$OP" --service-account-tokens \
  --worker "$WORKER" --extra-arg=--device --extra-arg=cpu --extra-arg=--threads --extra-arg=1 \
  2>"$dir/kubelet.log" &
kl_pid=$!
nodes_ready() { # the three nodes Ready, no taint left (the not-ready taint of a new node is gone)
  [ "$(jp nodes -o jsonpath='{range .items[*]}{.metadata.name}:{.status.conditions[?(@.type=="Ready")].status}:{.spec.taints} {end}')" \
    = "cpu-0:True: gpu-a:True: gpu-b:True: " ]
}
assert "kubelet.py registers cpu-0, gpu-a and gpu-b; they become Ready and lose the not-ready taint" \
  wait_for 40 nodes_ready
check "... the GPU nodes with one nvidia.com/gpu and GPU Feature Discovery's labels, cpu-0 with neither" 0 \
  "cpu-0==|gpu-a=1=NVIDIA-L4|gpu-b=1=NVIDIA-A10G|" -- \
  jp nodes -o jsonpath='{range .items[*]}{.metadata.name}={.status.allocatable.nvidia\.com/gpu}={.metadata.labels.nvidia\.com/gpu\.product}|{end}'

# ---- helm install: Deployment -> ReplicaSet -> Pod, scheduled to cpu-0, the operator running -----
K create namespace "$JNS" >/dev/null
K create namespace "$JNS2" >/dev/null
check "helm install --wait with the operator image kubelet.py maps, watching $JNS and $JNS2: deployed, revision 1" 0 "STATUS: deployed" -- \
  H install cephalo charts/cephalo --create-namespace --wait --timeout 120s \
    --set "operator.watchNamespaces={$JNS,$JNS2}" \
    --set operator.image.repository=$OP_IMAGE --set operator.image.tag=1.0.0-test \
    --set worker.image.repository=$WORKER_IMAGE --set worker.image.tag=1.0.0-test \
    --set operator.metrics.port="$port1"
owned() { # KIND NAME: the names of the objects of kind KIND in $NS owned by NAME
  kubectl get "$1" -n "$NS" -o jsonpath="{range .items[?(@.metadata.ownerReferences[0].name==\"$2\")]}{.metadata.name} {end}" 2>/dev/null
}
rs1=$(owned rs cephalo-operator | awk '{print $1}')
check "the controller manager made the Deployment's ReplicaSet" 0 "cephalo-operator-" -- echo "rs: $rs1"
pod1=$(owned pods "$rs1" | awk '{print $1}')
check "... and the ReplicaSet's Pod" 0 "$rs1-" -- echo "pod: $pod1"
check "the scheduler bound the pod to cpu-0 (the chart keeps the operator off the GPU nodes)" 0 \
  "cpu-0 True Running" -- jp pod "$pod1" -n "$NS" \
  -o jsonpath='{.spec.nodeName} {.status.conditions[?(@.type=="PodScheduled")].status} {.status.phase}'
check "... with the chart's ServiceAccount and the mapped image" 0 "cephalo-operator $OP_IMAGE:1.0.0-test" -- \
  jp pod "$pod1" -n "$NS" -o jsonpath='{.spec.serviceAccountName} {.spec.containers[0].image}'
check "the token controller made the ServiceAccount's token Secret" 0 "kubernetes.io/service-account-token" -- bash -c \
  "kubectl get secret -n $NS \"\$(kubectl get sa cephalo-operator -n $NS -o jsonpath='{.secrets[0].name}')\" -o jsonpath='{.type}'"
check "kubelet.py runs the pod as cephalo-operator with the Deployment's args" 0 \
  "start $NS/$pod1 " -- grep -F "node=cpu-0 " "$dir/kubelet.log"
check "... those args: the chart's flags" 0 "$OP --metrics-addr=:$port1 --log-level=info --namespace=$JNS,$JNS2" -- \
  grep -F "start $NS/$pod1 " "$dir/kubelet.log"
SA=system:serviceaccount:$NS:cephalo-operator
check "the operator's ServiceAccount may not create pods in kube-system (the writes are granted in $JNS and $JNS2 only)" 1 "no" -- \
  K auth can-i --as="$SA" create pods -n kube-system
check "... it may in $JNS and $JNS2" 0 "yes|yes" -- bash -c \
  "{ kubectl auth can-i --as='$SA' create pods -n $JNS; kubectl auth can-i --as='$SA' create pods -n $JNS2; } | paste -sd'|'"
check "... with the ServiceAccount's token, CA and namespace" 0 "$NS/$pod1: ServiceAccount cephalo-operator: token of Secret cephalo-operator-token-" -- \
  cat "$dir/kubelet.log"
oplog() { cat "$dir/kl/logs/${NS}_$1"_*.log 2>/dev/null; }
assert "the operator in the pod starts with the in-cluster configuration (the API server, the ServiceAccount)" \
  wait_for 20 bash -c "$(declare -f oplog); dir='$dir' NS=$NS; oplog $pod1 | grep -qF 'API server $K8S_SERVER (in-cluster config)'"
assert "... takes the leader-election Lease and leads" wait_for 30 bash -c \
  "$(declare -f oplog); dir='$dir' NS=$NS; oplog $pod1 | grep -q 'leading: this replica reconciles now'"
check "... the Lease in $NS is held by the pod (POD_NAME from the downward API)" 0 "$pod1" -- \
  jp lease cephalo-operator -n "$NS" -o jsonpath='{.spec.holderIdentity}'
check "... and answers /readyz on its metrics port" 0 "" -- curl -fsS --max-time 5 "http://127.0.0.1:$port1/readyz"
check "the Deployment is available (1 ready replica, as the controller manager sees it)" 0 "1/1/1" -- \
  jp deployment cephalo-operator -n "$NS" -o jsonpath='{.status.replicas}/{.status.readyReplicas}/{.status.availableReplicas}'

# ---- a tiny CephaloJob, planned and run by the operator in the pod -------------------------------
cat >"$dir/tiny.yaml" <<EOF
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: tiny, namespace: $JNS}
spec:
  model: {name: tiny-gpt}
  seqLen: 64
  globalBatch: 8
  steps: 20
  data: {path: synthetic}
  optimizer: {lr: 0.003, warmup: 2}
  commTimeout: 60
  gpus: {allowedProducts: [NVIDIA-L4, NVIDIA-A10G]}
EOF
check "a tiny CephaloJob is created (tiny-gpt, 20 steps)" 0 "created" -- K apply -f "$dir/tiny.yaml"
job_phase() { kubectl get cephalojob tiny -n "$JNS" -o jsonpath='{.status.phase}' 2>/dev/null; }
assert "the operator plans it: its phase leaves ''/Created" wait_for 30 bash -c \
  "$(declare -f job_phase); JNS=$JNS; p=\$(job_phase); [ -n \"\$p\" ] && [ \"\$p\" != Created ]"
assert "... and makes its plan ConfigMap and 2 worker pods (one per GPU)" wait_for 30 bash -c \
  "[ \$(kubectl get configmaps -n $JNS -l cephalo.dev/job=tiny -o name | wc -l) -ge 1 ] &&
   [ \$(kubectl get pods -n $JNS -l cephalo.dev/job=tiny -o name | wc -l) -eq 2 ]"
check "... pinned to gpu-a and gpu-b, owned by the job" 0 "gpu-a CephaloJob tiny|gpu-b CephaloJob tiny|" -- bash -c \
  "kubectl get pods -n $JNS -l cephalo.dev/job=tiny -o jsonpath='{range .items[*]}{.spec.nodeName} {.metadata.ownerReferences[0].kind} {.metadata.ownerReferences[0].name}{\"\\n\"}{end}' | sort | tr '\n' '|'"
assert "the job goes Succeeded (the workers trained it, CPU-emulated)" wait_moving 60 "$dir/kl/logs/*" bash -c \
  "$(declare -f job_phase); JNS=$JNS; [ \"\$(job_phase)\" = Succeeded ]"
check "... both worker pods Succeeded" 0 "Succeeded Succeeded " -- \
  jp pods -n "$JNS" -l cephalo.dev/job=tiny -o jsonpath='{range .items[*]}{.status.phase} {end}'
# ml2 has a ResourceQuota that requires CPU and memory requests and a memory limit of every pod
# (as shared clusters do): the job's pods are refused until its spec.template gives them
printf '%s\n' 'apiVersion: v1' 'kind: ResourceQuota' "metadata: {name: compute, namespace: $JNS2}" \
  'spec: {hard: {requests.cpu: "8", requests.memory: 8Gi, limits.memory: 16Gi}}' | K apply -f - >/dev/null
assert "the quota controller has counted the quota (its status.hard)" wait_for 30 bash -c \
  "[ -n \"\$(kubectl get resourcequota compute -n $JNS2 -o jsonpath='{.status.hard}')\" ]"
sed "s/namespace: $JNS}/namespace: $JNS2}/" "$dir/tiny.yaml" >"$dir/tiny2.yaml"
check "the same job in the second watched namespace, $JNS2, is created" 0 "created" -- K apply -f "$dir/tiny2.yaml"
assert "... under the quota without requests: its pods are refused, the status quotes the quota (PodsNotCreated)" wait_for 30 bash -c \
  "kubectl get cephalojob tiny -n $JNS2 -o jsonpath='{.status.conditions[?(@.type==\"Running\")].reason} {.status.message}' | grep -q '^PodsNotCreated cannot create the worker pods: .*failed quota: compute: must specify'"
cat >>"$dir/tiny2.yaml" <<EOF
  template:
    metadata: {labels: {team: research}}
    spec:
      containers: [{name: worker, resources: {requests: {cpu: 500m, memory: 512Mi}, limits: {memory: 1Gi}}}]
EOF
K apply -f "$dir/tiny2.yaml" >/dev/null
assert "... with spec.template's requests and limit it runs under the quota and goes Succeeded (the namespaced grant)" \
  wait_moving 60 "$dir/kl/logs/*" bash -c \
  "[ \"\$(kubectl get cephalojob tiny -n $JNS2 -o jsonpath='{.status.phase}' 2>/dev/null)\" = Succeeded ]"
check "... its workers carried the template's label and requests, and their GPU" 0 "research 500m 1 research 500m 1 " -- \
  jp pods -n "$JNS2" -l cephalo.dev/job=tiny -o jsonpath='{range .items[*]}{.metadata.labels.team} {.spec.containers[0].resources.requests.cpu} {.spec.containers[0].resources.limits.nvidia\.com/gpu} {end}'
check "... planned within the template's memory limit: each rank's host offload pool at most 0.8 x 1Gi" 0 \
  "host 1073741824 ok" -- bash -c "kubectl get configmap tiny-plan -n $JNS2 -o jsonpath='{.data.plan\\.json}' | python3 -c '
import json, sys
p = json.load(sys.stdin)
lim = p[\"inputs\"][\"host_memory_bytes\"]
pools = [r[\"predicted\"][\"host_bytes\"] for r in p[\"ranks\"]]
print(\"host\", int(lim), \"ok\" if pools and all(0 < b <= 0.8 * lim for b in pools) else pools)'"

# ---- helm upgrade: the Deployment rolls to a new pod ---------------------------------------------
check "helm upgrade --wait with a new image tag, metrics port and log level: revision 2" 0 "REVISION: 2" -- \
  H upgrade cephalo charts/cephalo --reuse-values --wait --timeout 120s \
    --set operator.image.tag=1.0.1-test --set operator.metrics.port="$port2" --set operator.logLevel=debug
rs2=$(jp rs -n "$NS" -o jsonpath='{range .items[?(@.metadata.annotations.deployment\.kubernetes\.io/revision=="2")]}{.metadata.name}{end}')
check "the controller manager made a second ReplicaSet (Deployment revision 2)" 0 "cephalo-operator-" -- \
  bash -c "[ -n '$rs2' ] && [ '$rs2' != '$rs1' ] && echo 'rs: $rs2'"
pod2=$(owned pods "$rs2" | awk '{print $1}')
check "... whose pod runs on cpu-0 with the new image" 0 "cpu-0 Running $OP_IMAGE:1.0.1-test" -- \
  jp pod "$pod2" -n "$NS" -o jsonpath='{.spec.nodeName} {.status.phase} {.spec.containers[0].image}'
check "... as cephalo-operator with the new args" 0 "$OP --metrics-addr=:$port2 --log-level=debug" -- \
  grep -F "start $NS/$pod2 " "$dir/kubelet.log"
assert "the old pod is deleted (its ReplicaSet scaled to 0) and gone" wait_for 30 bash -c \
  "! kubectl get pod $pod1 -n $NS >/dev/null 2>&1"
check "... its operator stopped by SIGTERM" 0 "stop $NS/$pod1 " -- cat "$dir/kubelet.log"
assert "the new operator takes the Lease and leads" wait_for 40 bash -c \
  "$(declare -f oplog); dir='$dir' NS=$NS; oplog $pod2 | grep -q 'leading: this replica reconciles now'"
check "... the Lease held by the new pod" 0 "$pod2" -- \
  jp lease cephalo-operator -n "$NS" -o jsonpath='{.spec.holderIdentity}'
check "... which answers /readyz on the new port" 0 "" -- curl -fsS --max-time 5 "http://127.0.0.1:$port2/readyz"

# the operator's logs while the release is installed (helm uninstall deletes the RBAC together with
# the Deployment: the operator stopping after it may find its Lease no longer its to release), less
# the quota's refusals of ml2's pods above, which are the point there (also HTTP 403)
mkdir -p "$dir/installed"
for f in "$dir"/kl/logs/"${NS}"_cephalo-operator-*.log; do grep -v 'failed quota: compute:' "$f" >"$dir/installed/${f##*/}"; done
check "no request of the operator was refused while installed (no 403/Forbidden in the logs of both pods, but the quota's)" 0 "2 logs" -- bash -c \
  "$(declare -f api_refusals); logs=\$(ls '$dir'/installed/*.log) || exit 2; api_refusals \$logs && exit 1
   echo \"\$(wc -w <<<\"\$logs\") logs\""

# ---- helm uninstall: the garbage collector takes the ReplicaSets and the pod ----------------------
check "helm uninstall" 0 "release \"cephalo\" uninstalled" -- H uninstall cephalo
assert "... the Deployment is gone" wait_for 20 bash -c "! kubectl get deployment cephalo-operator -n $NS >/dev/null 2>&1"
assert "the garbage collector deletes its ReplicaSets and its pod (kubelet.py completes the deletion)" wait_for 40 bash -c \
  "[ -z \"\$(kubectl get rs,pods -n $NS -o name)\" ]"
check "... the operator process got SIGTERM" 0 "stop $NS/$pod2 " -- cat "$dir/kubelet.log"
check "... and stopped cleanly (exit code 0)" 0 "$NS/$pod2 uid=" -- \
  grep -E "exit $NS/$pod2 uid=.*: exit code 0\$" "$dir/kubelet.log"
check "... and no operator process is left" 0 "" -- bash -c "[ -z \"\$(ls '$dir'/kl/pids/ | grep '^${NS}_')\" ]"
check "the CRD stays, and so does the CephaloJob" 0 "cephalojob.cephalo.dev/tiny" -- \
  bash -c "kubectl get crd cephalojobs.cephalo.dev -o name && kubectl get cephalojobs -n $JNS -o name"

# ---- stop ------------------------------------------------------------------------------------------
stop_kubelet
pids=$(cat "$dir"/k8s/*.pid | tr '\n' ' ')
"$AS" stop "$dir/k8s"
check "stop ends the kubelet and all four (etcd, apiserver, scheduler, controller-manager)" 0 "" -- \
  bash -c "for p in $pids; do ! kill -0 \$p 2>/dev/null || exit 1; done"
