#!/usr/bin/env bash
# End to end: a CephaloJob trained by cephalo-operator's worker pods on the whole test control
# plane on loopback (tests/k8s/apiserver.sh --control-plane: etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager), with tests/k8s/kubelet.py registering and heartbeating two fake GPU
# Nodes (NVIDIA-L4 x2 with a hostname label other than its name, NVIDIA-A10G x1) and playing their
# kubelet: kube-scheduler binds each worker pod (node affinity + nvidia.com/gpu requests; the
# operator sets no nodeName) and kubelet.py runs it as a local
# `cephalo-worker --device cpu` process (the GPU plan on emulated CPU devices) with its own
# loopback IP, the plan ConfigMap and the checkpoint claim as directories, and writes the pods'
# status. The operator runs as the chart's ServiceAccount with the chart's least-privilege RBAC
# (rendered by `helm template`, mk/helm.sh; a token from `kubectl create token`) and the chart's
# flags. Checks: what that account may not do; the pods start with their IPs; the job goes
# Running, survives an API server restart mid-training (operator and kubelet reconnect), and ends
# Succeeded; every worker trained to the last step with the loss going down; the checkpoint on the
# claim; on a long job, the progress read from the workers' /metrics, a killed worker's pod Failed
# with exit code 137 and the gang restarted from the checkpoint (the failure blamed on the killed
# rank), a GPU node lost (re-planned on the 2 GPUs left, resumed from the 3-rank checkpoint) and
# added back (re-planned on 3; the stopped workers checkpoint on SIGTERM and the new gang resumes
# from that very step), and suspending it stopping and deleting its pods gracefully (the kubelet's
# final DELETE); a job with backoffLimit 0 Failed for good by one killed worker; no 403 in the
# operator's log and the operator never exited. Everything started is stopped on exit; with KEEP_LOGS=DIR the
# logs (operator, kubelet, workers, API server) are copied there first.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
AS=tests/k8s/apiserver.sh
OP=${BUILD:-build/rel}/bin/cephalo-operator
WORKER=$(pod_worker) # tests/cli/lib.sh: under SAN=1 the release worker, the operator sanitized
PY=/usr/bin/python3
NS=cephalo-system          # the chart's release namespace
SA=cephalo-operator        # the chart's ServiceAccount (release cephalo)
JNS=ml                     # the jobs' namespace

skip_all() { echo "not ok 1 - training a CephaloJob through the operator and a fake kubelet: $*"; exit 0; }
[ -x "$OP" ] && [ -x "$WORKER" ] || skip_all "$OP or $WORKER is not built (make)"
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
"$AS" built || skip_all "kube-apiserver is not built: run 'sudo tests/k8s/apiserver.sh build'"

dir=$(mktemp -d /tmp/cephalo-train-test.XXXXXX)
op_pid= kl_pid=
stop_pid() { # PID: SIGTERM, SIGKILL after 10 s
  [ -n "$1" ] || return 0
  kill "$1" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
cleanup() {
  stop_pid "$kl_pid"
  # workers the kubelet could not stop (it was killed): by their pid files
  for f in "$dir"/kl/pids/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  stop_pid "$op_pid"
  "$AS" stop "$dir/k8s" >/dev/null 2>&1
  if [ -n "${KEEP_LOGS:-}" ]; then
    mkdir -p "$KEEP_LOGS" && cp -r "$dir"/*.log "$dir/kl/logs" "$dir/k8s/apiserver.log" "$KEEP_LOGS/" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
t_start=$SECONDS
exports=$("$AS" start "$dir/k8s" --control-plane 2>"$dir/start.log") || {
  sed 's/^/#   /' "$dir/start.log"; skip_all "the control plane did not start"; }
eval "$exports"
export KUBECONFIG
K() { kubectl --request-timeout=20s "$@"; }
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
M="http://127.0.0.1:$port"

# wait_for SECONDS COMMAND...: retries until the command succeeds
jp() { K -n "$JNS" get "$1" "$2" -o jsonpath="$3" 2>/dev/null; }
phase_is() { [ "$(jp cephalojob "$1" '{.status.phase}')" = "$2" ]; }
pod_phases() { K -n "$JNS" get pods -l "cephalo.dev/job=$1" -o jsonpath='{range .items[*]}{.status.phase} {end}' 2>/dev/null; }
all_pods() { # JOB N PHASE: exactly N pods, all in PHASE
  local p; p=$(pod_phases "$1")
  [ "$(wc -w <<<"$p")" = "$2" ] && [ -z "$(tr ' ' '\n' <<<"$p" | grep -v "^$3\$" | grep -v '^$')" ]
}

# ---- the cluster: the CRD, the chart's RBAC, fake GPU nodes -------------------------------------
K apply -f crds/cephalojobs.cephalo.dev.yaml >/dev/null 2>&1
K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev >/dev/null 2>&1
K create namespace "$NS" >/dev/null
K create namespace "$JNS" >/dev/null
"$(mk/helm.sh)" template cephalo charts/cephalo --namespace "$NS" >"$dir/chart.yaml" 2>"$dir/render.log"
# the chart's access objects (not its Deployment: the operator runs here as a process) as a List,
# and the Deployment's container args (the operator runs with the chart's flags)
$PY - "$dir/chart.yaml" "$dir/rbac.json" "$dir/args" <<'PY'
import json, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
keep = [d for d in docs if d['kind'] in ('ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'Role', 'RoleBinding')]
json.dump({'apiVersion': 'v1', 'kind': 'List', 'items': keep}, open(sys.argv[2], 'w'))
dep = next(d for d in docs if d['kind'] == 'Deployment')
args = dep['spec']['template']['spec']['containers'][0]['args']
open(sys.argv[3], 'w').write('\n'.join(args) + '\n')
PY
check "the chart's ServiceAccount, ClusterRole(Binding) and leader-election Role(Binding) are applied" 0 \
  "rolebinding.rbac.authorization.k8s.io/$SA-leader-election created" -- K apply -f "$dir/rbac.json"
token=$(K create token "$SA" -n "$NS" --duration=2h 2>"$dir/token.log")
check "kubectl create token gives the operator's ServiceAccount a token" 0 "" -- test -n "$token"
echo "$token" >"$dir/op-token"
cat >"$dir/op-kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "$K8S_SERVER", certificate-authority: "$K8S_CA"}
users:
- name: $SA
  user: {tokenFile: "$dir/op-token"}
contexts:
- name: $SA
  context: {cluster: test, user: $SA, namespace: $NS}
current-context: $SA
EOF
can() { K auth can-i "$@" --as="system:serviceaccount:$NS:$SA" 2>/dev/null; }
check "the operator's account may create pods, patch ConfigMaps and job status, list nodes, take its Lease" 0 "" -- bash -c \
  "$(declare -f K can); NS=$NS SA=$SA; can create pods -n $JNS && can patch configmaps -n $JNS && can patch cephalojobs.cephalo.dev/status -n $JNS && can watch nodes && can update leases.coordination.k8s.io -n $NS"
check "... but not delete nodes, read secrets, write pod status, delete jobs, or take Leases elsewhere" 0 "" -- bash -c \
  "$(declare -f K can); NS=$NS SA=$SA; ! can delete nodes && ! can get secrets -n $JNS && ! can list secrets -A && ! can patch pods/status -n $JNS && ! can delete cephalojobs.cephalo.dev -n $JNS && ! can update leases.coordination.k8s.io -n kube-system && ! can create deployments.apps -n $NS"

node() { # NAME PRODUCT MEMORY_MIB COUNT HOSTNAME: a Node as kubelet.py registers it, Ready
  local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  cat <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$1","labels":{"kubernetes.io/hostname":"$5",
 "kubernetes.io/os":"linux","kubernetes.io/arch":"amd64",
 "nvidia.com/gpu.product":"$2","nvidia.com/gpu.memory":"$3","nvidia.com/gpu.count":"$4"}},
 "status":{"capacity":{"cpu":"8","memory":"32Gi","pods":"110","nvidia.com/gpu":"$4"},
           "allocatable":{"cpu":"8","memory":"32Gi","pods":"110","nvidia.com/gpu":"$4"},
           "conditions":[{"type":"Ready","status":"True","reason":"KubeletReady","message":"test",
                          "lastHeartbeatTime":"$now","lastTransitionTime":"$now"}]}}
EOF
}
# the checkpoint claim, bound by the controller manager to a volume made for it (the scheduler
# places no pod whose claim is unbound); the kubelet gives every pod the same directory for it
K create -f - >/dev/null <<'EOF'
{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"ckpt-pv"},
 "spec":{"capacity":{"storage":"1Gi"},"accessModes":["ReadWriteMany"],"storageClassName":"",
         "hostPath":{"path":"/nonexistent/cephalo-test"},"claimRef":{"namespace":"ml","name":"ckpt"}}}
EOF
K -n "$JNS" create -f - >/dev/null <<'EOF'
{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"ckpt"},
 "spec":{"accessModes":["ReadWriteMany"],"storageClassName":"","volumeName":"ckpt-pv",
         "resources":{"requests":{"storage":"1Gi"}}}}
EOF
assert "the checkpoint claim is bound (the controller manager's volume binder)" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $JNS get pvc ckpt -o jsonpath='{.status.phase}')\" = Bound ]"

# ---- the operator (the chart's account and flags) and the kubelet --------------------------------
# the chart's flags, but a local metrics port, and a longer Lease: the API server is restarted
# below for ~6 s, and losing the Lease makes the operator exit (by design)
mapfile -t op_args < <(grep -v -e '^--metrics-addr' -e '^--leader-election-lease-duration' \
  -e '^--leader-election-renew-deadline' "$dir/args")
POD_NAME=cephalo-operator-test POD_NAMESPACE=$NS "$OP" --kubeconfig "$dir/op-kubeconfig" "${op_args[@]}" \
  --metrics-addr "127.0.0.1:$port" --leader-election-lease-duration 40s \
  --leader-election-renew-deadline 30s >"$dir/op.log" 2>&1 &
op_pid=$!
# pod IPs from a random /24 of loopback: runs of this test at the same time on one machine would
# otherwise give two workers the same IP and metrics port
# the kubelet registers the nodes (gpu-a's hostname label is not its name: the worker pods' node
# affinity must name the label) and heartbeats them every 5 s, so that the controller manager takes
# the not-ready taint off and the scheduler places pods there
$PY tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" --nodes gpu-a,gpu-b \
  --register --node-gpus gpu-a=2 --node-gpus gpu-b=1 --heartbeat 5 \
  --node-label gpu-a:kubernetes.io/hostname=host-a --node-label gpu-a:nvidia.com/gpu.product=NVIDIA-L4 \
  --node-label gpu-a:nvidia.com/gpu.memory=23034 --node-label gpu-b:nvidia.com/gpu.product=NVIDIA-A10G \
  --node-label gpu-b:nvidia.com/gpu.memory=23028 \
  --first-ip "127.0.$((RANDOM % 240 + 10)).1" --worker "$WORKER" --work "$dir/kl" --extra-arg=--device --extra-arg=cpu --extra-arg=--threads \
  --extra-arg=1 2>"$dir/kubelet.log" &
kl_pid=$!
untainted() { # the nodes NAME... exist, Ready, without taints (the scheduler places pods there)
  local n
  for n in "$@"; do
    [ "$(K get node "$n" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}/{.spec.taints}' 2>/dev/null)" = "True/" ] || return 1
  done
}
assert "the kubelet registers the GPU nodes; they become Ready and lose the not-ready taint" wait_for 60 untainted gpu-a gpu-b
assert "the operator, as the chart's ServiceAccount, becomes ready (Lease taken, jobs listed)" wait_for 20 curl -fsS "$M/readyz"
check "... holding the Lease in the release namespace" 0 "cephalo-operator-test" -- \
  K -n "$NS" get lease cephalo-operator -o jsonpath='{.spec.holderIdentity}'
assert "the kubelet lists the pods" wait_for 10 grep -q 'listed 0 pods' "$dir/kubelet.log"

# ---- a job trains -------------------------------------------------------------------------------
STEPS=400
cat >"$dir/tiny.yaml" <<EOF
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: tiny, namespace: $JNS}
spec:
  model: {name: tiny-gpt}
  seqLen: 64
  globalBatch: 12
  steps: $STEPS
  data: {path: synthetic}
  optimizer: {lr: 0.003, warmup: 5}
  commTimeout: 60
  checkpoint: {pvc: ckpt, dir: tiny, every: 100}
  gpus: {allowedProducts: [NVIDIA-L4, NVIDIA-A10G]}
  elastic: {minReplanSeconds: 1} # grow back onto a returning node at once (default: at most every 300 s)
EOF
K apply -f "$dir/tiny.yaml" >/dev/null
assert "the kubelet starts the 3 worker pods (phase Running)" wait_for 30 all_pods tiny 3 Running
K -n "$JNS" get pods -l cephalo.dev/job=tiny -o json >"$dir/pods.json" 2>&1
check "kube-scheduler bound each pod to its planned node (affinity on gpu-a's hostname label host-a)" 0 "gpu-a gpu-a gpu-b" -- \
  $PY -c 'import json, sys
pods = sorted(json.load(open(sys.argv[1]))["items"], key=lambda p: p["metadata"]["name"])
for p in pods:
    t = p["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    want = {"gpu-a": "host-a", "gpu-b": "gpu-b"}[p["spec"]["nodeName"]]
    assert t[0]["matchExpressions"][0]["values"] == [want], t
    assert {c["type"]: c["status"] for c in p["status"]["conditions"]}["PodScheduled"] == "True"
print(" ".join(p["spec"]["nodeName"] for p in pods))' "$dir/pods.json"
check "each pod has its own loopback IP, hostIP, a running container and Ready" 0 "pods ok" -- $PY - "$dir/pods.json" <<'PY'
import json, sys
pods = {p['metadata']['name']: p for p in json.load(open(sys.argv[1]))['items']}
assert sorted(pods) == ['tiny-0', 'tiny-1', 'tiny-2'], sorted(pods)
ips = [p['status']['podIP'] for p in pods.values()]
assert len(set(ips)) == 3 and all(ip.startswith('127.0.') for ip in ips), ips
for p in pods.values():
    s = p['status']
    assert s['hostIP'] == '127.0.0.1' and s['podIPs'] == [{'ip': s['podIP']}] and s['startTime'], s
    c = s['containerStatuses'][0]
    assert c['name'] == 'worker' and c['ready'] and 'running' in c['state'], c
    assert {x['type']: x['status'] for x in s['conditions']}['Ready'] == 'True', s['conditions']
print('pods ok')
PY
ip0=$(jp pod tiny-0 '{.status.podIP}')
check "every worker's MASTER_ADDR (tiny-0.tiny.$JNS.svc) resolved to tiny-0's IP" 0 "3" -- \
  bash -c "grep -c 'start $JNS/tiny-[0-2] .*(MASTER_ADDR=$ip0)' '$dir/kubelet.log'"
assert "the job reaches phase Running" wait_for 30 phase_is tiny Running

# the API server goes away mid-training and comes back: the operator and the kubelet carry on
# (while it starts, before /readyz, it may answer 403 for a moment: its RBAC caches are still
# empty; the operator's log lines from then are set aside for the 403 check below)
op_lines_before=$(wc -l <"$dir/op.log")
check "the API server restarts (same port, certificates and tokens; etcd untouched)" 0 "" -- "$AS" restart "$dir/k8s"
sleep 1
op_lines_after=$(wc -l <"$dir/op.log")
assert "the job reaches phase Succeeded" wait_moving 60 "$dir/kl/logs/*" phase_is tiny Succeeded
check "the kubelet lost its watch in the restart and carried on" 0 "watch: " -- cat "$dir/kubelet.log"
K -n "$JNS" get pods -l cephalo.dev/job=tiny -o json >"$dir/pods.json" 2>&1
check "every pod Succeeded: container terminated, exit code 0, reason Completed" 0 "done ok" -- $PY - "$dir/pods.json" <<'PY'
import json, sys
pods = json.load(open(sys.argv[1]))['items']
assert len(pods) == 3
for p in pods:
    s = p['status']
    t = s['containerStatuses'][0]['state']['terminated']
    assert s['phase'] == 'Succeeded' and t['exitCode'] == 0 and t['reason'] == 'Completed', s
    assert t['finishedAt'] >= t['startedAt'], t
print('done ok')
PY
check "the job's status: Succeeded, 3 ranks, step and checkpoint $STEPS, start and completion times" 0 "True 3 $STEPS $STEPS 20" -- \
  jp cephalojob tiny '{.status.conditions[?(@.type=="Succeeded")].status} {.status.plan.worldSize} {.status.step} {.status.lastCheckpointStep} {.status.startTime} {.status.completionTime}'
check "every worker trained to step $STEPS/$STEPS with the loss going down" 0 "3 logs ok" -- \
  $PY - "$STEPS" "$dir"/kl/logs/"${JNS}"_tiny-*.log <<'PY'
import re, sys
steps, logs = int(sys.argv[1]), sys.argv[2:]
assert len(logs) == 3, logs
for f in logs:
    losses = {int(m.group(1)): float(m.group(3)) for m in
              re.finditer(r'^step (\d+)/(\d+) \| loss ([0-9.]+)', open(f).read(), re.M)}
    assert 1 in losses and steps in losses, (f, losses)
    assert losses[steps] < losses[1] - 1.0, (f, losses)  # synthetic sequences are easy to learn
print('%d logs ok' % len(logs))
PY
ck=$dir/kl/pvc/ckpt/tiny
check "the checkpoint claim holds the last checkpoint: 3 rank shards and an index" 0 "ckpt ok" -- bash -c \
  "last=\$(printf 'step_%08d' $STEPS); grep -q \"\$last\" '$ck/latest' && ls '$ck'/\$last/rank-0000{0,1,2}.safetensors '$ck'/\$last/index.json >/dev/null && echo ckpt ok"
check "retention: the newest 3 checkpoints are kept (keepLast's default), older ones deleted" 0 "200 300 400" -- \
  bash -c "ls '$ck' | grep -Eo '^step_[0-9]+' | sed 's/step_0*//' | sort -n | tr '\n' ' '"
assert "no worker process is left" bash -c "[ -z \"\$(ls '$dir'/kl/pids/)\" ]"

# ---- a long job: progress in the status, a killed worker and the gang restart, suspend ----------
sed -e 's/name: tiny,/name: long,/' -e 's/steps: .*/steps: 1000000/' -e 's/dir: tiny/dir: long/' \
  "$dir/tiny.yaml" | K apply -f - >/dev/null
assert "a long job's pods run" wait_for 30 all_pods long 3 Running
assert "... and its workers train" wait_for 20 bash -c "grep -q '^step ' '$dir'/kl/logs/${JNS}_long-0_*.log"
step_loss() { jp cephalojob long '{.status.step} {.status.loss} {.status.samplesPerSecond}'; }
assert "the operator reads the progress from the workers' /metrics at their pod IPs (step, loss, samples/s)" \
  wait_for 20 bash -c "$(declare -f K jp step_loss); JNS=$JNS; step_loss | awk 'NF == 3 && \$1 > 0 && \$2 > 0 && \$3 > 0 {ok=1} END {exit !ok}'"
samples_text() { # the rate's text and the SAMPLES/S column: one decimal each, the number kept beside
  local r col
  r=$(jp cephalojob long '{.status.samplesPerSecond} {.status.samplesPerSecondText}')
  col=$(K -n "$JNS" get cephalojob long --no-headers | awk '{print $5}')  # NAME PHASE GPUS STEP SAMPLES/S AGE
  if [[ $r =~ ^[0-9.e+-]+\ [0-9]+\.[0-9]$ && $col =~ ^[0-9]+\.[0-9]$ ]]; then echo "text ok"; else echo "got '$r' and column '$col'"; fi
}
check "... the SAMPLES/S column shows it with one decimal (status.samplesPerSecondText), the number kept" 0 "text ok" -- samples_text
# (not "step 100 is there": at ~100 steps/s retention deletes it within seconds of writing it)
assert "... and checkpoints are written (every 100 steps)" wait_moving 60 "$dir/kl/logs/*" bash -c \
  "grep -qE '^step_[0-9]*[1-9]00\\b' '$dir/kl/pvc/ckpt/long/latest'"

# a worker killed (as by the OOM killer): its pod fails with exit code 128+9, and the operator
# restarts the whole gang from the checkpoint
uids_before=$(K -n "$JNS" get pods -l cephalo.dev/job=long -o jsonpath='{.items[*].metadata.uid}')
kill -9 "$(cat "$dir/kl/pids/${JNS}_long-1.pid")"
latest_before=$(cat "$dir/kl/pvc/ckpt/long/latest")
assert "a killed worker's pod is Failed with exit code 137 (SIGKILL)" wait_for 10 \
  grep -q "status $JNS/long-1 uid=.*: Failed (exit code 137)" "$dir/kubelet.log"
new_gang() { # 3 Running pods, none of the old ones
  local u; u=$(K -n "$JNS" get pods -l cephalo.dev/job=long -o jsonpath='{.items[*].metadata.uid}')
  all_pods long 3 Running || return 1
  for x in $u; do grep -q "$x" <<<"$uids_before" && return 1; done
  return 0
}
assert "the operator restarts the gang: 3 new pods run" wait_for 60 new_gang
check "... counted in status.restarts" 0 "restarts 1." -- jp cephalojob long 'restarts {.status.restarts}.'
backoff_kept() { # the new gang created no earlier than the backoff's end (the chart's 10 s)
  local t
  t=$(jp cephalojob long '{.status.restartBackoffSeconds} {.status.lastRestartTime} {.status.nextRestartTime}')
  K -n "$JNS" get pods -l cephalo.dev/job=long -o jsonpath='{range .items[*]}{.metadata.creationTimestamp} {end}' |
    $PY -c '
import sys
from datetime import datetime
p = lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").timestamp()
wait, last, nxt = sys.argv[1].split()
made = [p(x) for x in sys.stdin.read().split()]
assert float(wait) == 10 and p(nxt) - p(last) in (10, 11), (wait, last, nxt)
assert len(made) == 3 and min(made) >= p(last) + 10, (made, last)
print("backoff %s s: gang made %.0f s after the failure" % (wait, min(made) - p(last)))' "$t"
}
check "... after the restart backoff: status.restartBackoffSeconds 10, nextRestartTime 10 s on, no pod made before it" 0 \
  "backoff 10 s: gang made" -- backoff_kept
assert "... the new workers resume from the checkpoint" wait_for 20 bash -c \
  "cat '$dir'/kl/logs/${JNS}_long-*.log | grep -c 'resumed from .* at step [1-9][0-9][0-9]' | grep -qx 3"
assert "... and the job is Running again" wait_for 30 phase_is long Running
check "... the failure is blamed on the killed worker, not on the peers that failed after it" 0 "pod long-1 (rank 1 on gpu-a) failed: exit code 137" -- \
  K -n "$JNS" get events --field-selector involvedObject.name=long,reason=WorkerFailed -o jsonpath='{.items[*].message}'

# ---- elastic: a GPU node lost, then added back ----------------------------------------------------
# current_logs JOB: the worker logs of the job's current pods
current_logs() {
  K -n "$JNS" get pods -l "cephalo.dev/job=$1" -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}' |
    while read -r n u; do [ -n "$n" ] && echo "$dir/kl/logs/${JNS}_${n}_${u:0:8}.log"; done
}
resumed_in() { # N JOB: N current workers said "resumed from ... at step" (a step > 0)
  local c=0 f
  for f in $(current_logs "$2"); do grep -q 'resumed from .* at step [1-9]' "$f" 2>/dev/null && c=$((c + 1)); done
  [ "$c" = "$1" ]
}
assert "a checkpoint after the restart is written" wait_moving 60 "$dir/kl/logs/*" bash -c \
  "[ \"\$(cat '$dir/kl/pvc/ckpt/long/latest')\" != '$latest_before' ]"
uids_before=$(K -n "$JNS" get pods -l cephalo.dev/job=long -o jsonpath='{.items[*].metadata.uid}')
# node gpu-b fails: its Node object goes, and its worker (rank 2) dies with it
K delete node gpu-b >/dev/null
kill -9 "$(cat "$dir/kl/pids/${JNS}_long-2.pid")" 2>/dev/null
replanned_to() { # WORLD REPLANS: the job runs a new gang of WORLD pods after REPLANS re-plans
  [ "$(jp cephalojob long '{.status.phase} {.status.plan.worldSize} {.status.replans}')" = "Running $1 $2" ] || return 1
  all_pods long "$1" Running || return 1
  local u
  for u in $(K -n "$JNS" get pods -l cephalo.dev/job=long -o jsonpath='{.items[*].metadata.uid}'); do
    grep -q "$u" <<<"$uids_before" && return 1
  done
  return 0
}
assert "node gpu-b deleted: the job is re-planned on the 2 GPUs left and runs again" wait_for 60 replanned_to 2 1
check "... both ranks on gpu-a, the gang restart not counted against backoffLimit" 0 "gpu-a gpu-a restarts=1" -- \
  jp cephalojob long '{.status.plan.ranks[0].node} {.status.plan.ranks[1].node} restarts={.status.restarts}'
check "... with a Replanned event saying why" 0 "the usable GPUs changed" -- \
  K -n "$JNS" get events --field-selector involvedObject.name=long,reason=Replanned -o jsonpath='{.items[*].message}'
assert "... the 2 new workers resume from the 3-rank checkpoint (re-sharded)" wait_for 20 resumed_in 2 long
# the node comes back: the job grows to 3 GPUs again; the 2 running workers are stopped by SIGTERM,
# checkpoint the step they are at, and the new gang resumes from exactly that step
uids_before=$(K -n "$JNS" get pods -l cephalo.dev/job=long -o jsonpath='{.items[*].metadata.uid}')
logs_before=$(current_logs long)
# back as its kubelet registers it (Ready); the API server gives a new Node the not-ready taint until
# the controller manager sees it Ready: a worker pod the scheduler refuses meanwhile only delays the
# gang (Unschedulable: planned again after a short backoff)
node gpu-b NVIDIA-A10G 23028 1 gpu-b | K create -f - >/dev/null
assert "node gpu-b back: re-planned on 3 GPUs again" wait_for 90 replanned_to 3 2
stopped_at=$(cat $logs_before | sed -n 's/.*stopped after step \([0-9]*\) on .*, with a checkpoint of that step.*/\1/p' | sort -u)
check "... the stopped workers all checkpointed the same step on SIGTERM" 0 "" -- test "$(wc -w <<<"$stopped_at")" = 1
assert "... and the new gang resumes from exactly that step" wait_for 20 bash -c \
  "$(declare -f K current_logs); JNS=$JNS dir=$dir; [ \"\$(cat \$(current_logs long) | grep -c 'resumed from .* at step $stopped_at\$')\" = 3 ]"

# a worker pod deleted by hand (as by an eviction or a drain): the gang stops on SIGTERM at one
# step with its checkpoint and restarts from it, a disruption not counted against backoffLimit
uids_before=$(K -n "$JNS" get pods -l cephalo.dev/job=long -o jsonpath='{.items[*].metadata.uid}')
logs_before=$(current_logs long)
K -n "$JNS" delete pod long-0 --wait=false >/dev/null
assert "a worker pod deleted by hand: the whole gang restarts" wait_for 60 new_gang
# the operator sees the deletion itself, or (when the kubelet was quicker) the peers that stopped
# (on failure: every event of the job and what the operator said of the restart)
disrupted_event() {
  kubectl -n "$JNS" get events --field-selector involvedObject.name=long,reason=GangDisrupted -o jsonpath='{.items[*].message}' |
    grep -qE 'worker pod long-0 \(rank 0 on gpu-a\) is being deleted|worker pods? stopped on request \(exit code 143, checkpointed\)'
}
if ! wait_for 10 disrupted_event; then
  kubectl -n "$JNS" get events --field-selector involvedObject.name=long -o jsonpath='{range .items[*]}{.reason}: {.message}{"\n"}{end}' | tail -5 | sed 's/^/#   event /'
  grep -E 'long: |long\b.*(event|restart|gang)' "$dir/op.log" | tail -5 | sed 's/^/#   operator: /'
fi
check "... a GangDisrupted event says why" 0 "" -- disrupted_event
check "... not counted against backoffLimit" 0 "restarts=1" -- jp cephalojob long 'restarts={.status.restarts}'
stopped_at=$(cat $logs_before | sed -n 's/.*stopped after step \([0-9]*\) on .*, with a checkpoint of that step.*/\1/p' | sort -u)
assert "... and the new gang resumes from the step the old one stopped at" wait_for 20 bash -c \
  "$(declare -f K current_logs); JNS=$JNS dir=$dir; [ \"\$(wc -w <<<'$stopped_at')\" = 1 ] && [ \"\$(cat \$(current_logs long) | grep -c 'resumed from .* at step $stopped_at\$')\" = 3 ]"

# suspended, its running pods are deleted: the kubelet stops the workers (SIGTERM) and completes
# the graceful deletions (the API server deletes a pod that finished meanwhile by itself)
K -n "$JNS" patch cephalojob long --type merge -p '{"spec":{"suspend":true}}' >/dev/null
assert "suspending the job deletes its pods (SIGTERM, then the kubelet's final DELETE)" wait_for 30 bash -c \
  "[ -z \"\$(kubectl -n $JNS get pods -l cephalo.dev/job=long -o name)\" ]"
check "... the kubelet completed the deletion of a running pod" 0 "" -- \
  grep -qE "deleted $JNS/long-[0-2] " "$dir/kubelet.log"
assert "... the job is Suspended" wait_for 20 phase_is long Suspended
assert "... and no worker process is left" wait_for 10 bash -c "[ -z \"\$(ls '$dir'/kl/pids/)\" ]"

# ---- the backoff limit: a job allowed no restart fails for good --------------------------------
sed -e 's/name: tiny,/name: fragile,/' -e 's/steps: .*/steps: 1000000/' -e 's/dir: tiny/dir: fragile/' \
  -e 's/^  commTimeout: .*/  commTimeout: 60\n  backoffLimit: 0/' "$dir/tiny.yaml" | K apply -f - >/dev/null
assert "a job with backoffLimit 0 runs" wait_for 30 all_pods fragile 3 Running
assert "... its workers train" wait_for 20 bash -c "grep -q '^step ' '$dir'/kl/logs/${JNS}_fragile-0_*.log"
kill -9 "$(cat "$dir/kl/pids/${JNS}_fragile-0.pid")"
assert "a killed worker then fails the job: Failed, BackoffLimitExceeded, completionTime" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $JNS get cephalojob fragile -o jsonpath='{.status.phase} {.status.conditions[?(@.type==\"Failed\")].reason} {.status.restarts}')\" = 'Failed BackoffLimitExceeded 0' ] && [ -n \"\$(kubectl -n $JNS get cephalojob fragile -o jsonpath='{.status.completionTime}')\" ]"
assert "... its running workers are stopped, and no new pod is made" wait_for 20 bash -c \
  "[ -z \"\$(kubectl -n $JNS get pods -l cephalo.dev/job=fragile -o jsonpath='{.items[?(@.status.phase==\"Running\")].metadata.name}')\" ]"
sleep 2
check "... and it stays Failed (terminal), no second gang" 0 "Failed attempt=0" -- \
  jp cephalojob fragile '{.status.phase} attempt={.status.attempt}'

# ---- a worker's own error reaches the job's status (its last log line: FallbackToLogsOnError) ----
sed -e 's/name: tiny,/name: nodata,/' -e 's/dir: tiny/dir: nodata/' \
  -e 's/^  commTimeout: .*/  commTimeout: 60\n  backoffLimit: 0/' -e 's/^  data: .*/  data: {path: no-such-shards}/' "$dir/tiny.yaml" |
  K apply -f - >/dev/null
assert "a job whose workers cannot read their data fails: Failed, BackoffLimitExceeded" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $JNS get cephalojob nodata -o jsonpath='{.status.conditions[?(@.type==\"Failed\")].reason}')\" = BackoffLimitExceeded ]"
check "... its status quotes the worker's error (exit code 2, the data path)" 0 "" -- bash -c \
  "kubectl -n $JNS get cephalojob nodata -o jsonpath='{.status.message}' | grep -E 'exit code 2 \(Error\): cephalo-worker: .*no-such-shards'"

# ---- the operator and the kubelet -----------------------------------------------------------------
assert "the operator never exited" kill -0 "$op_pid"
assert "the kubelet is still running" kill -0 "$kl_pid"
# the operator's log but for the lines of the API server's restart window (the client logs a
# refusal as "HTTP 403 (Forbidden)"; a bare 403 would also match port numbers in the log)
awk -v a="$op_lines_before" -v b="$op_lines_after" 'NR <= a || NR > b' "$dir/op.log" >"$dir/op-checked.log"
check "the operator was never refused (no 403 Forbidden in its log)" 1 "" -- api_refusals "$dir/op-checked.log"
n403=$(awk -v a="$op_lines_before" -v b="$op_lines_after" 'NR > a && NR <= b' "$dir/op.log" | api_refusals - | wc -l)
if [ "$n403" -gt 0 ]; then
  echo "# $n403 operator requests got 403 while the restarted API server started (its RBAC caches empty)"
fi
# ---- the status permission taken away: /readyz fails, the job gets a Warning Event ----------------
# (after the 403 check above: these refusals are the point)
K get clusterrole cephalo-operator -o json >"$dir/cr.json"
$PY - "$dir/cr.json" <<'PY'
import json, sys
cr = json.load(open(sys.argv[1]))
for k in ('resourceVersion', 'uid', 'creationTimestamp', 'managedFields'):
    cr['metadata'].pop(k, None)
json.dump(cr, open(sys.argv[1], 'w'))
cr['rules'] = [r for r in cr['rules'] if 'cephalojobs/status' not in r['resources']]
json.dump(cr, open(sys.argv[1].replace('.json', '-nostatus.json'), 'w'))
PY
K replace -f "$dir/cr-nostatus.json" >/dev/null
sed -e 's/name: tiny,/name: denied,/' -e 's/dir: tiny/dir: denied/' -e 's/^spec:/spec:\n  suspend: true/' "$dir/tiny.yaml" |
  K apply -f - >/dev/null
assert "without update on cephalojobs/status, /readyz fails and says why" wait_for 30 bash -c \
  "curl -s '$M/readyz' | grep -q \"refuses this operator's CephaloJob status writes (403)\""
check "... and a Warning Event on the job says the operator may not write its status" 0 \
  "Warning StatusForbidden the operator may not write this job's status (RBAC: update on cephalojobs/status)" -- \
  K -n "$JNS" get events --field-selector involvedObject.name=denied,reason=StatusForbidden \
    -o jsonpath='{.items[0].type} {.items[0].reason} {.items[0].message}'
K replace -f "$dir/cr.json" >/dev/null
assert "the permission back: the job's status is written (Suspended) and /readyz answers ok" wait_for 60 bash -c \
  "[ \"\$(kubectl -n $JNS get cephalojob denied -o jsonpath='{.status.phase}')\" = Suspended ] && curl -fsS '$M/readyz' >/dev/null"
if grep -q 'error\|warn' "$dir/op-checked.log"; then
  echo "# operator log lines with errors (but for the restart window):"
  grep 'error\|warn' "$dir/op-checked.log" | head -10 | sed 's/^/#   /'
fi
echo "# $((SECONDS - t_start)) s"
