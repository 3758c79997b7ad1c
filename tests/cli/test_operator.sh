#!/usr/bin/env bash
# cephalo-operator against a real kube-apiserver + etcd on loopback (tests/k8s/apiserver.sh; built
# by test_k8s.sh or `sudo tests/k8s/apiserver.sh build`). Fake GPU Nodes carry GPU Feature
# Discovery labels and allocatable nvidia.com/gpu; there is no scheduler or kubelet, so worker pods
# stay Pending and unbound until the test writes their status (and an unbound pod is deleted at
# once). Checks: the plan ConfigMap, the headless worker Service, one Pod per GPU requesting
# nvidia.com/gpu 1 and placed by required node affinity on its node's hostname label (which differs
# from the node name here), with its env and ownerReferences, the job status; a hand-edited
# plan.json missing a field is named in the log and planned again, not run on zeros; jobs that
# cannot run get Failed with the reason and the operator keeps going; a spec fix re-plans; a plan
# longer than --plan-timeout fails the job (PlanningTimeout) while other jobs are planned meanwhile;
# worker pods carry the checkpoint retention flags; log lines (the watch loop's warnings too) carry
# the timestamp and level; a restarted operator (taking the Lease over) creates no duplicate pods;
# a second operator at the same time stays a standby. GPUs shared between jobs: the operator counts
# the GPUs of other pods (every namespace) as busy; a job whose plan's GPUs are not all free waits
# in phase Queued (Admitted False) and starts when they are, by priority then creation; a foreign
# pod is planned around; minGPUs starts a job on fewer GPUs and grows it later; a job that can
# never fit fails. A watcher checks at every poll that no node's GPUs are requested twice (pods
# bound to it, or not bound yet and pinned to it by affinity). Every
# line of the operator's logs carries the timestamp and the level. Everything started is stopped
# on exit.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
AS=tests/k8s/apiserver.sh
OP=${BUILD:-build/rel}/bin/cephalo-operator

skip_all() { echo "not ok 1 - cephalo-operator against kube-apiserver: $*"; exit 0; }
[ -x "$OP" ] || skip_all "$OP is not built (make)"
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
"$AS" built || skip_all "kube-apiserver is not built: run 'sudo tests/k8s/apiserver.sh build'"

dir=$(mktemp -d /tmp/cephalo-operator-test.XXXXXX)
op_pid=
stop_op() {
  [ -n "$op_pid" ] || return 0
  kill "$op_pid" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$op_pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$op_pid" 2>/dev/null
  wait "$op_pid" 2>/dev/null
  op_rc=$?
  op_pid=
}
watch_pid= prom_pid=
cleanup() {
  [ -z "$watch_pid" ] || { kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null; }
  [ -z "$prom_pid" ] || { kill "$prom_pid" 2>/dev/null; wait "$prom_pid" 2>/dev/null; }
  stop_op; "$AS" stop "$dir/k8s" >/dev/null 2>&1
  [ -z "${KEEP_LOGS:-}" ] || { mkdir -p "$KEEP_LOGS" && cp "$dir"/*.log "$dir"/k8s/*.log "$KEEP_LOGS/" 2>/dev/null; }
  rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
exports=$("$AS" start "$dir/k8s" 2>"$dir/start.log") || {
  sed 's/^/#   /' "$dir/start.log"; skip_all "the API server did not start"; }
eval "$exports"
export KUBECONFIG
K() { kubectl --request-timeout=20s "$@"; }
curl_api() { curl -sS --cacert "$K8S_CA" -H "Authorization: Bearer $K8S_TOKEN" "$@"; }
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
M="http://127.0.0.1:$port"

# wait_for SECONDS COMMAND...: retries until the command succeeds
jp() { K get "$1" "$2" -o jsonpath="$3" 2>/dev/null; }
phase_is() { [ "$(jp cephalojob "$1" '{.status.phase}')" = "$2" ]; }

# finish JOB [PHASE]: every pod of the job ends (the test plays the kubelet: there is none here)
finish() {
  local p
  for p in $(kubectl get pods -l "cephalo.dev/job=$1" -o jsonpath='{.items[*].metadata.name}'); do
    curl_api -X PATCH -H 'Content-Type: application/merge-patch+json' \
      "$K8S_SERVER/api/v1/namespaces/default/pods/$p/status" -d "{\"status\":{\"phase\":\"${2:-Succeeded}\"}}" >/dev/null
  done
}

# CEPHALO_PLAN_EXHAUSTIVE_DP=1: the optimizer's quadratic reference DP, so that the big job below
# takes minutes to plan (the fast path plans it in well under a second); the others take ms either way
start_op() { # POD_NAME
  CEPHALO_PLAN_EXHAUSTIVE_DP=1 POD_NAME=$1 "$OP" --kubeconfig "$KUBECONFIG" --metrics-addr "127.0.0.1:$port" --log-level info \
    --worker-image registry.test/cephalo-worker:1 --worker-image-pull-policy IfNotPresent --plan-timeout 6s \
    --leader-elect=true --leader-election-namespace default --leader-election-id cephalo-operator \
    --leader-election-lease-duration 6s --leader-election-renew-deadline 4s \
    --leader-election-retry-period 1s >>"$dir/op-$1.log" 2>&1 &
  op_pid=$!
}

# ---- the command line (no server needed) --------------------------------------------------------
check "--help lists the chart's flags" 0 "--leader-election-renew-deadline" -- "$OP" --help
check "an unknown flag is refused" 2 "unknown option '--bogus'" -- "$OP" --bogus
check "a bad duration is refused" 2 "not a duration" -- "$OP" --leader-election-lease-duration=soon
check "a bad log level is refused" 2 "--log-level" -- "$OP" --log-level=loud
check "no configuration is a clear error" 2 "no cluster configuration" -- \
  env -u KUBECONFIG -u KUBERNETES_SERVICE_HOST "$OP"
check "a missing kubeconfig names the file" 2 "$dir/nope.yaml" -- "$OP" --kubeconfig "$dir/nope.yaml"
check "a bad --plan-timeout is refused" 2 "--plan-timeout: 'never' is not a duration" -- "$OP" --plan-timeout never
check "a bad --plan-workers is refused" 2 "--plan-workers: expected an integer 1..64, got '0'" -- "$OP" --plan-workers 0
check "a bad --workers is refused" 2 "--workers: expected an integer 1..64, got '65'" -- "$OP" --workers 65
check "--help lists --worker-archs and its default" 0 '"60 61 70 75 80 86 89 90"' -- "$OP" --help
check "--namespace takes a list; an empty entry is refused, naming it" 2 "--namespace: entry 2 '' is not a namespace name" -- \
  "$OP" --namespace "ml,,research"
check "... so is a name that is not a namespace's" 2 "--namespace: entry 1 'ML' is not a namespace name" -- "$OP" --namespace ML
check "... and a namespace listed twice" 2 "--namespace: 'ml' is listed twice" -- "$OP" --namespace ml,research,ml
check "a bad --worker-archs is refused, naming the item" 2 "--worker-archs: 'sm_80' is not an architecture" -- \
  "$OP" --worker-archs "70 sm_80"

# ---- log lines: "TIME LEVEL text", the watch loop's warnings too ---------------------------------
# an API server that is not there: every watch fails and warns before it retries
dead=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
sed "s#https://127.0.0.1:[0-9]*#https://127.0.0.1:$dead#" "$KUBECONFIG" >"$dir/dead.kubeconfig"
"$OP" --kubeconfig "$dir/dead.kubeconfig" --metrics-addr 0 --leader-elect=false >"$dir/dead.log" 2>&1 &
dead_pid=$!
wait_for 20 grep -q 'retrying in' "$dir/dead.log"
kill "$dead_pid" 2>/dev/null; wait "$dead_pid" 2>/dev/null
check "a watch warning carries the timestamp and the level, like every other line" 0 "log ok" -- \
  python3 - "$dir/dead.log" <<'PY'
import re, sys
lines = open(sys.argv[1]).read().splitlines()
form = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (debug|info|warn|error) \S')
assert lines and not [l for l in lines if not form.match(l)], lines
w = [l for l in lines if ' watch /' in l and 'retrying in' in l]
assert w and all(l.split(' ')[1] == 'warn' for l in w), lines
print('log ok')
PY
check "a start-up error is a timestamped error line" 2 " error --log-level: expected debug" -- "$OP" --log-level=loud

# ---- the cluster: the CRD and fake GPU nodes -----------------------------------------------------
K apply -f crds/cephalojobs.cephalo.dev.yaml >/dev/null 2>&1
K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev >/dev/null 2>&1
node() { # NAME PRODUCT MEMORY_MIB COUNT POOL
  cat <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$1","labels":{"kubernetes.io/hostname":"host-$1",
 "nvidia.com/gpu.product":"$2","nvidia.com/gpu.memory":"$3","nvidia.com/gpu.count":"$4","pool":"$5"}},
 "status":{"capacity":{"cpu":"8","memory":"32Gi","pods":"110","nvidia.com/gpu":"$4"},
           "allocatable":{"cpu":"8","memory":"32Gi","pods":"110","nvidia.com/gpu":"$4"}}}
EOF
}
{ node gpu-a NVIDIA-L4 23034 2 main; node gpu-b NVIDIA-A10G 23028 1 main; node gpu-c NVIDIA-Future-GPU 49152 1 odd
  echo '{"apiVersion":"v1","kind":"Node","metadata":{"name":"cpu-only"},"status":{"allocatable":{"cpu":"4","pods":"110"}}}'
} >"$dir/nodes.json"
check "fake GPU nodes with GFD labels and allocatable nvidia.com/gpu are created" 0 "node/gpu-c created" -- \
  K create -f "$dir/nodes.json"
# no GPU is ever requested twice: at every poll, the GPUs requested by the non-terminal pods of each
# node -- bound to it, or not bound yet and pinned to it by required node affinity (its hostname
# label, or its name) -- are at most its allocatable ones (violations go to $dir/overbooked)
: >"$dir/overbooked"
python3 tests/k8s/gpuwatch.py "$dir/overbooked" "$dir/gpuwatch.stop" &
watch_pid=$!

# ---- a job --------------------------------------------------------------------------------------
start_op op-1
wait_for 10 curl -fsS "$M/healthz"
check "the operator serves /healthz" 0 "ok" -- curl -fsS "$M/healthz"
assert "the operator becomes ready (Lease taken, jobs listed)" wait_for 20 curl -fsS "$M/readyz"
check "the operator holds the Lease as POD_NAME" 0 "op-1" -- jp lease cephalo-operator '{.spec.holderIdentity}'

cat >"$dir/tiny.yaml" <<'EOF'
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: tiny}
spec:
  model: {name: gpt2-124m}
  seqLen: 256
  globalBatch: 16
  steps: 10
  data: {path: synthetic}
  commTimeout: 90
  gpus: {allowedProducts: [NVIDIA-L4, A10G]}
  tolerations: [{key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}]
EOF
K apply -f "$dir/tiny.yaml" >/dev/null
assert "the job is planned (phase Planned)" wait_for 20 phase_is tiny Planned
uid=$(jp cephalojob tiny '{.metadata.uid}')
K get configmap tiny-plan -o json >"$dir/cm.json" 2>&1
check "ConfigMap tiny-plan holds a valid plan.json for the 3 allowed GPUs" 0 "plan ok" -- python3 - "$dir/cm.json" "$uid" <<'PY'
import json, sys
cm = json.load(open(sys.argv[1]))
p = json.loads(cm['data']['plan.json'])
assert p['format'] == 'cephalo-plan' and p['feasible'] and p['world_size'] == 3, p
assert [r['node'] for r in p['ranks']] == ['gpu-a', 'gpu-a', 'gpu-b'], p['ranks']
assert [r['device'] for r in p['ranks']] == ['L4', 'L4', 'A10G'], p['ranks']
assert sum(r['batch'] for r in p['ranks']) == 16 and p['inputs']['seq'] == 256
o = cm['metadata']['ownerReferences'][0]
assert o['kind'] == 'CephaloJob' and o['uid'] == sys.argv[2] and o['controller'], o
print('plan ok')
PY
K get service tiny -o json >"$dir/svc.json" 2>&1
check "headless Service tiny: worker label, a port named metrics, selects the job's pods" 0 "svc ok" -- python3 - "$dir/svc.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
assert s['metadata']['labels']['cephalo.dev/component'] == 'worker', s['metadata']
assert s['spec']['clusterIP'] == 'None' and s['spec']['selector'] == {'cephalo.dev/job': 'tiny'}, s['spec']
assert {p['name']: p['port'] for p in s['spec']['ports']}['metrics'] == 9400, s['spec']['ports']
print('svc ok')
PY
K get pods -l cephalo.dev/job=tiny -o json >"$dir/pods.json" 2>&1
check "one pod per GPU: nvidia.com/gpu 1, node affinity on its node's hostname, its plan rank's --recompute, env, plan volume, owner" 0 "pods ok" -- \
  python3 - "$dir/pods.json" "$dir/cm.json" "$uid" <<'PY'
import json, sys
pods = {p['metadata']['name']: p for p in json.load(open(sys.argv[1]))['items']}
plan = json.loads(json.load(open(sys.argv[2]))['data']['plan.json'])
assert sorted(pods) == ['tiny-0', 'tiny-1', 'tiny-2'], sorted(pods)
for r in plan['ranks']:
    p = pods['tiny-%d' % r['rank']]
    s, c = p['spec'], p['spec']['containers'][0]
    # placed by the scheduler: no nodeName, the node's kubernetes.io/hostname label (not its name)
    assert 'nodeName' not in s, s['nodeName']
    terms = s['affinity']['nodeAffinity']['requiredDuringSchedulingIgnoredDuringExecution']['nodeSelectorTerms']
    assert terms == [{'matchExpressions': [{'key': 'kubernetes.io/hostname', 'operator': 'In',
                                            'values': ['host-' + r['node']]}]}], terms
    assert s['hostname'] == 'tiny-%d' % r['rank'] and s['subdomain'] == 'tiny'
    assert c['resources'] == {'requests': {'nvidia.com/gpu': '1'}, 'limits': {'nvidia.com/gpu': '1'}}, c['resources']
    assert c['image'] == 'registry.test/cephalo-worker:1' and c['args'][0] == 'train', c
    assert '--keep-last' not in c['args'] and '--ckpt-dir' not in c['args'], c['args'] # no checkpoint
    # each pod's recompute mode is its plan rank's
    assert c['args'][c['args'].index('--recompute') + 1] == r['recompute'], (r, c['args'])
    env = {e['name']: e['value'] for e in c['env']}
    want = {'RANK': str(r['rank']), 'WORLD_SIZE': '3', 'MASTER_ADDR': 'tiny-0.tiny.default.svc',
            'MASTER_PORT': '29500', 'CEPHALO_PLAN': '/etc/cephalo/plan.json',
            'CEPHALO_JOB_ID': sys.argv[3], 'CEPHALO_COMM_TIMEOUT': '90', 'CEPHALO_METRICS_PORT': '9400'}
    assert all(env.get(k) == v for k, v in want.items()), env
    assert {'name': 'plan', 'configMap': {'name': 'tiny-plan', 'defaultMode': 420}} in s['volumes'], s['volumes']
    assert any(t.get('key') == 'nvidia.com/gpu' for t in s['tolerations']), s['tolerations']
    o = p['metadata']['ownerReferences'][0]
    assert o['uid'] == sys.argv[3] and o['kind'] == 'CephaloJob' and o['controller'], o
    assert p['metadata']['labels']['cephalo.dev/rank'] == str(r['rank'])
print('pods ok')
PY
check "... the pods meet the restricted Pod Security Standard, and carry the operator's version" 0 "secure ok" -- \
  python3 - "$dir/pods.json" "$("$OP" --version | cut -d" " -f2)" <<'PY'
import json, sys
for p in json.load(open(sys.argv[1]))['items']:
    s, c = p['spec'], p['spec']['containers'][0]
    assert s['securityContext'] == {'runAsNonRoot': True, 'runAsUser': 10001, 'runAsGroup': 10001, 'fsGroup': 10001,
                                    'seccompProfile': {'type': 'RuntimeDefault'}}, s['securityContext']
    assert c['securityContext'] == {'allowPrivilegeEscalation': False, 'runAsNonRoot': True,
                                    'capabilities': {'drop': ['ALL']}}, c['securityContext']
    assert 'privileged' not in c['securityContext'] and not s.get('hostNetwork') and not s.get('hostPID')
    env = {e['name']: e.get('value') for e in c['env']}
    assert env.get('CEPHALO_OPERATOR_VERSION') == sys.argv[2], (env.get('CEPHALO_OPERATOR_VERSION'), sys.argv[2])
print('secure ok')
PY
K get cephalojob tiny -o json >"$dir/job.json" 2>&1
check "status: observedGeneration, Created/Planned conditions, the plan per rank" 0 "status ok" -- python3 - "$dir/job.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))['status']
assert s['phase'] == 'Planned' and s['observedGeneration'] == 1, s
c = {x['type']: x for x in s['conditions']}
assert c['Created']['status'] == 'True' and c['Planned']['status'] == 'True', c
assert c['Running']['status'] == 'False', c
p = s['plan']
assert p['configMap'] == 'tiny-plan' and p['worldSize'] == 3 and p['strategy'] == 'cephalo', p
assert p['predictedSamplesPerSecond'] > 0 and p['estimated'] is True, p
assert [(r['rank'], r['pod'], r['node']) for r in p['ranks']] == [(0, 'tiny-0', 'gpu-a'), (1, 'tiny-1', 'gpu-a'), (2, 'tiny-2', 'gpu-b')], p['ranks']
assert sum(r['batch'] for r in p['ranks']) == 16
print('status ok')
PY
check "kubectl get shows the phase and the GPUs" 0 "Planned" -- K get cephalojob tiny
check "a Planned event is recorded" 0 "planned 3 GPUs" -- K get events --field-selector involvedObject.name=tiny

# a pod that cannot start (its image cannot be pulled): the job's message says which and why
curl_api -X PATCH -H 'Content-Type: application/merge-patch+json' \
  "$K8S_SERVER/api/v1/namespaces/default/pods/tiny-1/status" \
  -d '{"status":{"containerStatuses":[{"name":"worker","image":"registry.test/cephalo-worker:1","imageID":"","ready":false,"restartCount":0,"state":{"waiting":{"reason":"ImagePullBackOff","message":"Back-off pulling image \"registry.test/cephalo-worker:1\""}}}]}}' >/dev/null
assert "a pod stuck pulling its image is named in the job's message" wait_for 20 bash -c \
  'kubectl get cephalojob tiny -o jsonpath={.status.message} | grep -q "pod tiny-1 waits: ImagePullBackOff: Back-off pulling image"'
# the pods start (the test plays kubelet for the status): the job becomes Running
for i in 0 1 2; do
  curl_api -X PATCH -H 'Content-Type: application/merge-patch+json' \
    "$K8S_SERVER/api/v1/namespaces/default/pods/tiny-$i/status" -d '{"status":{"phase":"Running"}}' >/dev/null
done
assert "all pods Running -> phase Running" wait_for 20 phase_is tiny Running
check "Running condition True with a startTime" 0 "True 20" -- jp cephalojob tiny '{.status.conditions[?(@.type=="Running")].status} {.status.startTime}'

# plan.json edited by hand, rank 1's device removed: the operator reads the plan once into typed
# fields (operator/plan_view.c), names the field and plans the job again instead of running it on
# an empty device; the same GPUs give the same plan, written back, and the gang runs on
K get configmap tiny-plan -o json >"$dir/cm-good.json" 2>&1
python3 - "$dir/cm-good.json" >"$dir/cm-bad.json" <<'PY'
import json, sys
p = json.loads(json.load(open(sys.argv[1]))['data']['plan.json'])
del p['ranks'][1]['device']
print(json.dumps({'data': {'plan.json': json.dumps(p)}}))
PY
K patch configmap tiny-plan --type merge --patch-file "$dir/cm-bad.json" >/dev/null
assert "a hand-edited plan.json missing a field: the operator's log names it and plans again" wait_for 20 \
  grep -q "ConfigMap default/tiny-plan: plan.json: ranks\[1\]: missing field 'device'; planning again" "$dir/op-op-1.log"
plan_back() {
  K get configmap tiny-plan -o json >"$dir/cm-now.json" 2>/dev/null && python3 -c '
import json, sys
a, b = (json.loads(json.load(open(f))["data"]["plan.json"]) for f in sys.argv[1:])
sys.exit(a != b)' "$dir/cm-good.json" "$dir/cm-now.json"
}
assert "... the same plan is written back" wait_for 20 plan_back
plan_id_of() { jp "$1" "$2" '{.metadata.annotations.cephalo\.dev/plan-id}'; }
gang_on_plan() { echo "$(jp cephalojob tiny '{.status.phase}') $([ "$(plan_id_of pod tiny-1)" = "$(plan_id_of configmap tiny-plan)" ] && echo same)"; }
check "... and the gang runs on: phase Running, its pods on the ConfigMap's plan id" 0 "Running same" -- gang_on_plan

# ---- jobs that cannot run: Failed with the reason; the operator keeps going ----------------------
cat >"$dir/bad.yaml" <<'EOF'
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: nomodel}
spec: {data: {path: synthetic}, model: {name: gpt9-huge}, globalBatch: 8, steps: 1}
---
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: nogpus}
spec: {data: {path: synthetic}, model: {name: gpt2-124m}, globalBatch: 8, steps: 1, gpus: {allowedProducts: [H100]}}
---
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: nosel}
spec: {data: {path: synthetic}, model: {name: gpt2-124m}, globalBatch: 8, steps: 1, gpus: {nodeSelector: {pool: nowhere}}}
---
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: toobig}
spec: {data: {path: synthetic}, model: {name: llama-7b}, globalBatch: 8, seqLen: 2048, steps: 1, gpus: {nodeSelector: {pool: main}}}
---
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: smallbatch}
spec: {data: {path: synthetic}, model: {name: gpt2-124m}, globalBatch: 2, steps: 1}
---
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: longseq}
spec: {data: {path: synthetic}, model: {name: tinyllama-1.1b}, globalBatch: 8, seqLen: 4096, steps: 1, gpus: {nodeSelector: {pool: main}}}
---
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: longwarmup}
spec: {data: {path: synthetic}, model: {name: gpt2-124m}, globalBatch: 8, steps: 5, optimizer: {warmup: 5}}
EOF
K apply -f "$dir/bad.yaml" >/dev/null
for j in nomodel nogpus nosel toobig smallbatch longseq longwarmup; do wait_for 20 phase_is $j Failed; done
failed_reason() { jp cephalojob "$1" '{.status.phase} {.status.conditions[?(@.type=="Planned")].status} {.status.conditions[?(@.type=="Failed")].reason}: {.status.message}'; }
check "an unknown model -> Failed (InvalidSpec), naming the model" 0 "Failed False InvalidSpec: model: unknown model 'gpt9-huge'" -- failed_reason nomodel
check "no GPU matching allowedProducts -> Failed (NoGPUs), naming the field and what the nodes have" 0 \
  "Failed False NoGPUs: no usable GPU: spec.gpus.allowedProducts names none of the products of the 3 GPU nodes (they have: NVIDIA-L4, NVIDIA-A10G, NVIDIA-Future-GPU)" -- failed_reason nogpus
check "a nodeSelector that matches no GPU node -> Failed (NoGPUs), saying so (not read as a missing product)" 0 \
  "Failed False NoGPUs: no usable GPU: spec.gpus.nodeSelector matches none of the 3 GPU nodes (products: NVIDIA-L4, NVIDIA-A10G, NVIDIA-Future-GPU)" -- failed_reason nosel
check "a model too big for the GPUs -> Failed (Infeasible) with the planner's reason" 0 "Failed False Infeasible: no feasible cephalo plan on 3 GPUs: the training state" -- failed_reason toobig
check "globalBatch below the GPU count -> Failed (InvalidSpec)" 0 "globalBatch 2 is less than the 3 usable GPUs" -- failed_reason smallbatch
check "a Llama seqLen beyond the model's max_seq -> Failed (InvalidSpec), as a GPT's" 0 \
  "Failed False InvalidSpec: sequence length 4096 exceeds model tinyllama-1.1b's context of 2048 positions" -- failed_reason longseq
check "warmup not below steps -> Failed (InvalidSpec) before any pod, not workers that fail and restart" 0 \
  "Failed False InvalidSpec: spec.optimizer.warmup: 5 must be below spec.steps (5)" -- failed_reason longwarmup
check "a Warning event names the reason" 0 "Infeasible" -- K get events --field-selector involvedObject.name=toobig
assert "failed jobs have no pods" bash -c '[ -z "$(kubectl get pods -l "cephalo.dev/job in (nomodel,nogpus,toobig,smallbatch,longseq,longwarmup)" -o name)" ]'
assert "the operator is still running" kill -0 "$op_pid"

# fixing the spec (a new generation) plans it; tiny holds the three GPUs it would use: it waits
K patch cephalojob nomodel --type merge -p '{"spec":{"model":{"name":"gpt2-124m"}}}' >/dev/null
assert "a fixed spec is planned (generation 2) but waits for tiny's GPUs (phase Queued)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob nomodel -o jsonpath="{.status.phase} {.status.observedGeneration}")" = "Queued 2" ]'
check "... Admitted False (WaitingForGPUs), naming the GPUs of its plan and how many are free" 0 \
  "False WaitingForGPUs: needs 3 GPUs (2 L4, 1 A10G) of its plan; 0 free" -- \
  jp cephalojob nomodel '{.status.conditions[?(@.type=="Admitted")].status} {.status.conditions[?(@.type=="Admitted")].reason}: {.status.message}'
check "... with no pods" 0 "0" -- bash -c 'kubectl get pods -l cephalo.dev/job=nomodel -o name | wc -l'
check "... and a Queued event" 0 "needs 3 GPUs" -- K get events --field-selector involvedObject.name=nomodel,reason=Queued
finish tiny
assert "tiny's workers end: tiny Succeeded" wait_for 20 phase_is tiny Succeeded
assert "... then the queued job starts on the GPUs it freed (Planned, Admitted)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob nomodel -o jsonpath="{.status.phase} {.status.conditions[?(@.type==\"Admitted\")].status}")" = "Planned True" ]'
check "... and gets its pods" 0 "3" -- bash -c 'kubectl get pods -l cephalo.dev/job=nomodel -o name | wc -l'

# ---- planning off the reconcile loop, within --plan-timeout (6s here) ----------------------------
# gpt-1.3b at globalBatch 65536 on the three main GPUs takes over 40 s to plan with the reference DP
# (CEPHALO_PLAN_EXHAUSTIVE_DP in start_op); a small job
# created meanwhile is planned at once, and the big one fails with PlanningTimeout after 6 s
cat >"$dir/slow.yaml" <<'EOF'
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: slowplan}
spec: {data: {path: synthetic}, model: {name: gpt-1.3b}, seqLen: 1024, globalBatch: 65536, steps: 1, gpus: {nodeSelector: {pool: main}}}
EOF
cat >"$dir/quick.yaml" <<'EOF'
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: quick}
spec: {data: {path: synthetic}, model: {name: gpt2-124m}, seqLen: 128, globalBatch: 8, steps: 1, gpus: {nodeSelector: {pool: main}, maxGPUs: 1}}
EOF
planned_reason() { jp cephalojob "$1" '{.status.phase} {.status.conditions[?(@.type=="Planned")].status} {.status.conditions[?(@.type=="Planned")].reason}'; }
metric() { curl -fsS "$M/metrics" | awk -v m="$1" '$1 == m {print $2}'; }
K apply -f "$dir/slow.yaml" >/dev/null
assert "a job being planned says so (Created, Planned False, reason Planning)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob slowplan -o jsonpath="{.status.phase} {.status.conditions[?(@.type==\"Planned\")].reason}")" = "Created Planning" ]'
check "... with what is planned and the budget" 0 "planning globalBatch 65536 on 3 GPUs (strategy cephalo, at most 6 s)" -- \
  jp cephalojob slowplan '{.status.message}'
K apply -f "$dir/quick.yaml" >/dev/null
assert "a job created meanwhile is planned without waiting for it (then Queued: nomodel holds the GPUs)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob quick -o jsonpath="{.status.phase} {.status.conditions[?(@.type==\"Planned\")].status}")" = "Queued True" ]'
check "... while the first is still being planned" 0 "Created False Planning" -- planned_reason slowplan
check "... on a planning thread (cephalo_operator_plans_in_progress 1)" 0 "1" -- metric cephalo_operator_plans_in_progress
assert "a plan longer than --plan-timeout -> Failed" wait_for 30 phase_is slowplan Failed
check "... Planned False with reason PlanningTimeout" 0 "Failed False PlanningTimeout" -- planned_reason slowplan
check "... the message names the budget and suggests a smaller batch or a coarser plan" 0 \
  "planning exceeded its time budget of 6 s (global batch 65536 on 3 devices); a smaller spec.globalBatch, fewer GPUs (spec.gpus.maxGPUs) or a coarser plan (spec.strategy fsdp or whale" -- \
  jp cephalojob slowplan '{.status.message}'
check "... a Warning event says so" 0 "PlanningTimeout" -- \
  K get events --field-selector involvedObject.name=slowplan,type=Warning -o jsonpath='{.items[*].reason}'
plans_before=$(metric cephalo_operator_plans_total)
rec_before=$(metric cephalo_operator_reconciles_total)
K annotate cephalojob slowplan cephalo.test/poke=1 >/dev/null # a watch event: reconcile now
reconciled_since() { [ "$(metric cephalo_operator_reconciles_total)" -gt "$1" ]; }
wait_for 20 reconciled_since "$rec_before"
sleep 0.5
check "a timed-out job is not planned again while its spec and GPUs stay" 0 \
  "$plans_before 0 1" -- bash -c "echo \$(curl -fsS $M/metrics | awk '/^cephalo_operator_(plans_total|plans_in_progress|plan_timeouts_total) / {v[\$1] = \$2} END {print v[\"cephalo_operator_plans_total\"], v[\"cephalo_operator_plans_in_progress\"], v[\"cephalo_operator_plan_timeouts_total\"]}')"
K patch cephalojob slowplan --type merge -p '{"spec":{"globalBatch":24}}' >/dev/null
assert "... a smaller globalBatch plans it (Queued behind nomodel's GPUs)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob slowplan -o jsonpath="{.status.phase} {.status.conditions[?(@.type==\"Planned\")].reason}")" = "Queued Planned" ]'
K delete cephalojob slowplan quick >/dev/null

# ---- an unknown GPU product, node selectors, the examples ----------------------------------------
cat >"$dir/odd.yaml" <<'EOF'
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: odd}
spec:
  model: {inline: {name: tiny-gpt-wide, base: gpt2-124m, n_layer: 4}}
  globalBatch: 4
  seqLen: 128
  steps: 1
  data: {path: synthetic}
  image: registry.test/custom:2
  checkpoint: {dir: /shared/odd, every: 5}
  gpus: {allowedProducts: [NVIDIA-Future-GPU], nodeSelector: {pool: odd}}
  template:
    metadata: {labels: {team: vision}}
    spec:
      priorityClassName: training-high
      imagePullSecrets: [{name: registry-creds}]
      containers: [{name: worker, resources: {requests: {cpu: "4", memory: 8Gi}, limits: {memory: 16Gi}}}]
EOF
K create priorityclass training-high --value=1000 >/dev/null
K apply -f "$dir/odd.yaml" >/dev/null
assert "an unknown GPU product is planned from its gpu.memory label" wait_for 20 phase_is odd Planned
check "... marked estimated, with a note, on its node" 0 "node gpu-c: unknown GPU product NVIDIA-Future-GPU planned from its gpu.memory label" -- \
  jp cephalojob odd '{.status.plan.estimated} {.status.plan.ranks[0].node} {.status.message}'
check "spec.image overrides --worker-image" 0 "registry.test/custom:2" -- jp pod odd-0 '{.spec.containers[0].image}'
check "spec.template: the worker pod carries its labels, priority class, pull secrets, CPU and memory, and still its GPU" 0 \
  "vision training-high registry-creds 4 8Gi 16Gi 1 1 false" -- \
  jp pod odd-0 '{.metadata.labels.team} {.spec.priorityClassName} {.spec.imagePullSecrets[0].name} {.spec.containers[0].resources.requests.cpu} {.spec.containers[0].resources.requests.memory} {.spec.containers[0].resources.limits.memory} {.spec.containers[0].resources.requests.nvidia\.com/gpu} {.spec.containers[0].resources.limits.nvidia\.com/gpu} {.spec.automountServiceAccountToken}'
sed -e 's/name: odd}/name: odd-cmd}/' -e 's/containers: \[{name: worker, /containers: [{name: worker, command: [sh], /' "$dir/odd.yaml" | K apply -f - >/dev/null
assert "a template that sets the worker's command: Failed (InvalidSpec), no pod" wait_for 20 phase_is odd-cmd Failed
check "... naming the field and why" 0 \
  "InvalidSpec: spec.template.spec.containers[worker].command: owned by the operator (the image's cephalo-worker)" -- \
  jp cephalojob odd-cmd '{.status.conditions[?(@.type=="Failed")].reason}: {.status.message}'
K delete cephalojob odd-cmd >/dev/null
check "the MODEL column (-o wide) names an inline model: its name, '(inline)'" 0 "tiny-gpt-wide (inline)" -- \
  bash -c "kubectl get cephalojob odd -o wide | awk 'NR == 1 {i = index(\$0, \"MODEL\")} NR == 2 {print substr(\$0, i, 22)}'"
check "a checkpoint without keepLast/keepEvery: none in the worker's args (the directory's retention applies)" 0 \
  "--ckpt-dir /shared/odd --ckpt-every 5 --resume auto" -- bash -c \
  "kubectl get pod odd-0 -o jsonpath='{.spec.containers[0].args}' | tr -d '[]\"' | tr ',' ' '"
check "spec.optimizer.schedule reaches the worker (the CRD's default: cosine)" 0 "--schedule cosine" -- bash -c \
  "kubectl get pod odd-0 -o jsonpath='{.spec.containers[0].args}' | tr -d '[]\"' | tr ',' ' '"

# a spec change under existing pods re-plans and restarts the gang on the new plan: the old pod is
# deleted first (not bound, so the API server deletes it at once), then the new one carries the new
# plan id; suspending deletes the pods, and resuming with the new spec re-plans into the same
# ConfigMap
odd_uid=$(jp pod odd-0 '{.metadata.uid}')
K patch cephalojob odd --type merge -p '{"spec":{"globalBatch":8}}' >/dev/null
assert "a spec change under existing pods re-plans (generation 2) and stops the old gang (Restarting)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob odd -o jsonpath="{.status.phase} {.status.observedGeneration} {.status.conditions[?(@.type==\"Restarting\")].reason}")" = "Restarting 2 Replanned" ] && [ "$(kubectl get pod odd-0 -o jsonpath={.metadata.uid})" != '"$odd_uid"' ]'
check "... with a Replanned event saying why" 0 "the spec changed" -- \
  K get events --field-selector involvedObject.name=odd,reason=Replanned -o jsonpath='{.items[*].message}'
assert "... then the new gang's pod carries the new plan id" wait_for 20 bash -c \
  '[ "$(kubectl get pod odd-0 -o jsonpath="{.metadata.annotations.cephalo\.dev/plan-id}")" = "$(kubectl get cephalojob odd -o jsonpath={.status.plan.id})" ] && kubectl get cephalojob odd -o jsonpath={.status.plan.id} | grep -q "^g2-"'
K patch cephalojob odd --type merge -p '{"spec":{"suspend":true}}' >/dev/null
assert "suspending a job deletes its pods (phase Suspended)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob odd -o jsonpath={.status.phase})" = Suspended ] && [ -z "$(kubectl get pods -l cephalo.dev/job=odd -o name)" ]'
K patch cephalojob odd --type merge -p '{"spec":{"suspend":false}}' >/dev/null
assert "resuming re-plans with the new spec (ConfigMap patched, generation 4)" wait_for 20 bash -c \
  '[ "$(kubectl get configmap odd-plan -o jsonpath="{.metadata.annotations.cephalo\.dev/generation}")" = 4 ] && kubectl get configmap odd-plan -o jsonpath="{.data.plan\.json}" | grep -q "\"batch\":	8"'
assert "... and recreates the pod" wait_for 20 bash -c '[ "$(kubectl get pods -l cephalo.dev/job=odd -o name)" = pod/odd-0 ]'

# a GPU node appears: the job that found no GPU (allowedProducts H100) is planned on it
node gpu-h NVIDIA-H100-80GB-HBM3 81559 1 big | K create -f - >/dev/null
assert "a new H100 node re-plans the job that had no GPU" wait_for 20 phase_is nogpus Planned
check "... on that node" 0 "gpu-h H100" -- jp cephalojob nogpus '{.status.plan.ranks[0].node} {.status.plan.ranks[0].device}'
sleep 1
check "... the running job without GPU constraints keeps its plan (growth waits spec.elastic.minReplanSeconds)" 0 \
  "3 0 Planned" -- jp cephalojob nomodel '{.status.plan.worldSize} {.status.replans} {.status.phase}'

# ---- profiles from a ConfigMap -------------------------------------------------------------------
# a CPU profile of tiny-gpt relabelled as L4 and A10G (the format is what matters here; real ones
# come from `cephalo profile` on those GPUs)
"${BUILD:-build/rel}/bin/cephalo" profile --devices cpu:1t:256M --model tiny-gpt --seq 32 -o "$dir/cpu.json" \
  --store none >/dev/null 2>&1
python3 - "$dir/cpu.json" "$dir/gpus.json" <<'PY'
import copy, json, sys
p = json.load(open(sys.argv[1]))
e = p['entries'][0]
p['entries'] = [dict(copy.deepcopy(e), device=d) for d in ('L4', 'A10G')]
json.dump(p, open(sys.argv[2], 'w'))
PY
cat >"$dir/prof.yaml" <<'EOF'
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: prof}
spec:
  model: {name: tiny-gpt}
  seqLen: 32
  globalBatch: 12
  steps: 5
  data: {path: synthetic}
  profileConfigMap: prof-profiles
  gpus: {allowedProducts: [NVIDIA-L4, A10G]}
EOF
K apply -f "$dir/prof.yaml" >/dev/null
assert "spec.profileConfigMap that does not exist -> Failed (InvalidProfile), naming it" wait_for 20 bash -c \
  'kubectl get cephalojob prof -o jsonpath="{.status.phase} {.status.conditions[?(@.type==\"Failed\")].reason} {.status.message}" | grep -q "^Failed InvalidProfile .*ConfigMap default/prof-profiles not found"'
printf '{"format": "cephalo-profile", "version": 1, "entries": [' >"$dir/bad.json"
K create configmap prof-profiles --from-file=gpus.json="$dir/bad.json" >/dev/null
K annotate cephalojob prof cephalo.test/poke=1 >/dev/null # a watch event: reconcile now
assert "a corrupt profile -> Failed, naming the ConfigMap and key" wait_for 20 bash -c \
  'kubectl get cephalojob prof -o jsonpath="{.status.message}" | grep -q "ConfigMap default/prof-profiles key gpus.json"'
K create configmap prof-profiles --from-file=gpus.json="$dir/gpus.json" --dry-run=client -o yaml | K apply -f - >/dev/null 2>&1
K annotate --overwrite cephalojob prof cephalo.test/poke=2 >/dev/null
assert "a valid profile: planned from measured costs (status.plan.profile, not estimated)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob prof -o jsonpath="{.status.phase} {.status.plan.estimated} {.status.plan.profile}")" = "Queued false ConfigMap default/prof-profiles" ]'
check "... and the Planned event says so" 0 "ConfigMap default/prof-profiles" -- \
  K get events --field-selector involvedObject.name=prof,reason=Planned -o jsonpath='{.items[*].message}'
K delete cephalojob prof >/dev/null
finish nomodel
assert "nomodel's workers end: nomodel Succeeded" wait_for 20 phase_is nomodel Succeeded

bound_claim default fineweb-tokens && bound_claim default cephalo-checkpoints # the example's claims
K apply -f examples/jobs/cephalojob-gpt-mixed.yaml -f examples/jobs/cephalojob-llama-bf16.yaml \
  -f examples/jobs/cephalojob-suspended.yaml >/dev/null
assert "example gpt2-mixed is planned on the L4 and A10G GPUs" wait_for 20 phase_is gpt2-mixed Planned
check "... with data and checkpoint claims mounted" 0 "fineweb-tokens cephalo-checkpoints" -- \
  jp pod gpt2-mixed-2 '{.spec.volumes[1].persistentVolumeClaim.claimName} {.spec.volumes[2].persistentVolumeClaim.claimName}'
check "... and its checkpoint retention (keepLast 3, keepEvery 1000) in every worker's args" 0 "retention ok" -- bash -c \
  "kubectl get pods -l cephalo.dev/job=gpt2-mixed -o json | python3 -c '
import json, sys
pods = json.load(sys.stdin)[\"items\"]
assert len(pods) == 3, len(pods)
for p in pods:
    a = p[\"spec\"][\"containers\"][0][\"args\"]
    i = a.index(\"--ckpt-dir\")
    assert a[i:i + 8] == [\"--ckpt-dir\", \"/checkpoints/gpt2-mixed\", \"--ckpt-every\", \"500\", \"--keep-last\", \"3\", \"--keep-every\", \"1000\"], a
print(\"retention ok\")'"
assert "example llama-bf16 (a node pool nobody has) -> Failed" wait_for 20 phase_is llama-bf16 Failed
assert "example bert-suspended -> Suspended, no pods" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob bert-suspended -o jsonpath={.status.phase})" = Suspended ] && [ -z "$(kubectl get pods -l cephalo.dev/job=bert-suspended -o name)" ]'
curl -fsS "$M/metrics" >"$dir/op-metrics.txt" 2>&1
check "the operator's /metrics counts reconciles and pods" 0 "cephalo_operator_pods_created_total 13" -- cat "$dir/op-metrics.txt"
check "... re-plans of live jobs, and a reconcile-time histogram" 0 "metrics ok" -- python3 - "$dir/op-metrics.txt" <<'PY'
import re, sys
t = open(sys.argv[1]).read()
v = {m[0]: float(m[1]) for m in re.findall(r'^(cephalo_operator_\w+(?:\{[^}]*\})?) (\S+)$', t, re.M)}
# odd under its pod (nomodel keeps its plan: growth waits minReplanSeconds); resuming a suspended job is no re-plan
assert v['cephalo_operator_replans_total'] == 1, v
assert v['cephalo_operator_jobs_created_total'] >= 5 and v['cephalo_operator_jobs_failed_total'] >= 4, v
assert v['cephalo_operator_reconcile_seconds_count'] == v['cephalo_operator_reconciles_total'], v
assert v['cephalo_operator_reconcile_seconds_bucket{le="+Inf"}'] == v['cephalo_operator_reconcile_seconds_count'], v
assert v['cephalo_operator_pods_deleted_total'] >= 2, v
print('metrics ok')
PY
check "... and cephalo_build_info names its version and commit" 0 \
  "cephalo_build_info{component=\"operator\",version=\"$("$OP" --version | cut -d' ' -f2)\",commit=\"" -- cat "$dir/op-metrics.txt"

# The Grafana dashboard's operator panels (charts/cephalo/dashboards/cephalo.json): a real
# Prometheus (Debian's, make deps) scrapes this live operator for a few seconds, and every operator
# panel's query must give series (tests/cli/dash_queries.py; the workers' panels: test_metrics.sh).
if command -v prometheus >/dev/null; then
  prom_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  printf 'global: {scrape_interval: 1s, scrape_timeout: 1s, evaluation_interval: 1s}\nscrape_configs:\n  - {job_name: cephalo-operator, static_configs: [{targets: ["127.0.0.1:%s"]}]}\n' \
    "$port" >"$dir/prometheus.yml"
  prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/tsdb" \
    --web.listen-address="127.0.0.1:$prom_port" >"$dir/prometheus.log" 2>&1 &
  prom_pid=$!
  check "every operator panel of the Grafana dashboard gives series from the live operator" 0 "give series" -- \
    python3 "$(dirname "$0")/dash_queries.py" operator charts/cephalo/dashboards/cephalo.json "$prom_port"
  kill "$prom_pid" 2>/dev/null; wait "$prom_pid" 2>/dev/null; prom_pid=
else
  n=$((n + 1)); echo "not ok $n - the dashboard's operator panels: no 'prometheus' binary (make deps, Debian package prometheus)"
fi

# ---- restart: a new operator takes the Lease over and creates nothing twice ----------------------
K get pods -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort >"$dir/pods.before"
stop_op
check "SIGTERM stops the operator cleanly" 0 "" -- test "$op_rc" = 0
start_op op-2
assert "the restarted operator takes the Lease over at once (released on exit; the lease lasts 6 s)" wait_for 4 bash -c \
  '[ "$(kubectl get lease cephalo-operator -o jsonpath={.spec.holderIdentity})" = op-2 ]'
assert "... and reconciles every job" wait_for 20 bash -c "curl -fsS $M/metrics | awk '/^cephalo_operator_reconciles_total/ {exit !(\$2 >= 9)}'"
sleep 1
K get pods -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort >"$dir/pods.after"
check "no duplicate or replaced pods after the restart" 0 "" -- diff "$dir/pods.before" "$dir/pods.after"
check "the restarted operator created no pods" 0 "cephalo_operator_pods_created_total 0" -- curl -fsS "$M/metrics"
check "the live job stays Planned" 0 "Planned" -- jp cephalojob gpt2-mixed '{.status.phase}'
# two operators at once: the second waits as a standby (ready, not leading, writing nothing)
port3=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
POD_NAME=op-3 "$OP" --kubeconfig "$KUBECONFIG" --metrics-addr "127.0.0.1:$port3" --log-level info \
  --worker-image registry.test/cephalo-worker:1 --leader-elect=true --leader-election-namespace default \
  --leader-election-id cephalo-operator --leader-election-lease-duration 6s \
  --leader-election-renew-deadline 4s --leader-election-retry-period 1s >>"$dir/op-op-3.log" 2>&1 &
op3_pid=$!
assert "a second operator at the same time is a ready standby" wait_for 10 curl -fsS "http://127.0.0.1:$port3/readyz"
sleep 3 # several retry periods: it must not take the Lease while op-2 renews it
check "... the Lease stays with the leader" 0 "op-2" -- jp lease cephalo-operator '{.spec.holderIdentity}'
curl -fsS "http://127.0.0.1:$port3/metrics" >"$dir/op3-metrics.txt" 2>&1
check "... the standby does not lead and reconciles nothing" 0 "standby ok" -- python3 - "$dir/op3-metrics.txt" <<'PY'
import re, sys
v = dict(re.findall(r'^(cephalo_operator_\w+) (\S+)$', open(sys.argv[1]).read(), re.M))
assert v['cephalo_operator_leader'] == '0' and v['cephalo_operator_reconciles_total'] == '0', v
print('standby ok')
PY
kill "$op3_pid" 2>/dev/null; wait "$op3_pid" 2>/dev/null

# ---- a job deleted and applied again before the garbage collector ran (none runs here) ----------
finish gpt2-mixed # its GPUs are tiny's again
wait_for 20 phase_is gpt2-mixed Succeeded
# tiny Succeeded long ago: its pods are terminal (deleted at once, nothing to wait for); run it again
# so that the job below is re-applied over pods that are still there
K delete cephalojob tiny >/dev/null
K apply -f "$dir/tiny.yaml" >/dev/null
assert "tiny applied again gets its 3 pods" wait_for 20 bash -c \
  '[ "$(kubectl get pods -l cephalo.dev/job=tiny --field-selector=status.phase=Pending -o name | wc -l)" = 3 ]'
# bound, as the scheduler would (there is none here): a bound pod's deletion waits for its kubelet
for i in 0 1 2; do
  curl_api -X POST -H 'Content-Type: application/json' "$K8S_SERVER/api/v1/namespaces/default/pods/tiny-$i/binding" \
    -d "{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{\"name\":\"tiny-$i\"},\"target\":{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"name\":\"$([ $i = 2 ] && echo gpu-b || echo gpu-a)\"}}" >/dev/null
done
check "... which the scheduler binds to their planned nodes" 0 "gpu-a gpu-a gpu-b" -- \
  K get pods -l cephalo.dev/job=tiny -o jsonpath='{.items[*].spec.nodeName}'
old_uid=$(jp cephalojob tiny '{.metadata.uid}')
K delete cephalojob tiny --wait=false >/dev/null
K apply -f "$dir/tiny.yaml" >/dev/null
new_uid=$(jp cephalojob tiny '{.metadata.uid}')
assert "a job re-applied under the old one's objects waits for them, taking nothing over" wait_for 20 bash -c \
  'kubectl get events --field-selector involvedObject.name=tiny,reason=WaitingForOldObjects -o jsonpath={.items[*].message} | grep -q "waiting for the objects of an earlier CephaloJob named tiny"'
check "... it deleted the old plan ConfigMap and Service" 0 "" -- bash -c \
  "! kubectl get configmap tiny-plan -o jsonpath='{.metadata.ownerReferences[0].uid}' 2>/dev/null | grep -q '$old_uid' && ! kubectl get service tiny -o jsonpath='{.metadata.ownerReferences[0].uid}' 2>/dev/null | grep -q '$old_uid'"
for i in 0 1 2; do K delete pod "tiny-$i" --grace-period=0 --force >/dev/null 2>&1; done # as a kubelet would
new_gang_owned() {
  [ "$(kubectl get pods -l cephalo.dev/job=tiny -o jsonpath='{range .items[*]}{.metadata.ownerReferences[0].uid}{"\n"}{end}' | sort -u)" = "$new_uid" ] &&
    [ "$(kubectl get pods -l cephalo.dev/job=tiny -o name | wc -l)" = 3 ] &&
    [ "$(kubectl get configmap tiny-plan -o jsonpath='{.metadata.ownerReferences[0].uid}')" = "$new_uid" ] &&
    [ "$(kubectl get service tiny -o jsonpath='{.metadata.ownerReferences[0].uid}')" = "$new_uid" ]
}
assert "... then plans anew: ConfigMap, Service and 3 pods owned by the new job" wait_for 20 new_gang_owned
check "... and it is Planned, not Succeeded or Running on the old pods" 0 "Planned" -- jp cephalojob tiny '{.status.phase}'
# ---- compute capability and precision -----------------------------------------------------------
# GFD's nvidia.com/gpu.compute.major/minor labels: a Maxwell node (5.2) the worker image (default
# --worker-archs, sm_60..sm_90) cannot run is left out with a note; a V100 labelled 7.0 and a T4
# without the labels (the catalog's 7.5) have no bf16: a bf16 job on them fails, saying why, and an
# fp16 job is planned on them
node_cc() { # NAME PRODUCT MEMORY_MIB COUNT POOL MAJOR MINOR
  node "$1" "$2" "$3" "$4" "$5" | python3 -c '
import json, sys
n = json.load(sys.stdin)
n["metadata"]["labels"].update({"nvidia.com/gpu.compute.major": sys.argv[1], "nvidia.com/gpu.compute.minor": sys.argv[2]})
print(json.dumps(n))' "$6" "$7"
}
{ node_cc gpu-m Tesla-M60 8192 2 volta 5 2; node_cc gpu-v Tesla-V100-SXM2-16GB 16384 2 volta 7 0
  node gpu-t Tesla-T4 15360 2 volta; } >"$dir/volta-nodes.json"
K create -f "$dir/volta-nodes.json" >/dev/null
cat >"$dir/prec.yaml" <<'EOF'
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: bf16-volta}
spec: {data: {path: synthetic}, model: {name: gpt2-124m}, seqLen: 256, globalBatch: 16, steps: 1, precision: bf16, gpus: {nodeSelector: {pool: volta}}}
---
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: fp16-volta}
spec:
  model: {name: gpt2-124m}
  seqLen: 256
  globalBatch: 16
  steps: 1
  data: {path: synthetic}
  precision: fp16
  recompute: full
  # the Maxwell product is unknown to the catalog: only allowedProducts lets it be considered
  gpus: {nodeSelector: {pool: volta}, allowedProducts: [Tesla-V100-SXM2-16GB, Tesla-T4, Tesla-M60]}
---
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: maxwell-only}
spec: {data: {path: synthetic}, model: {name: gpt2-124m}, globalBatch: 8, steps: 1, gpus: {allowedProducts: [Tesla-M60]}}
EOF
K apply -f "$dir/prec.yaml" >/dev/null
assert "a bf16 job on V100 and T4 nodes -> Failed" wait_for 20 phase_is bf16-volta Failed
check "... reason UnsupportedPrecision, naming the GPUs, their compute capability and fp16" 0 \
  "Failed False UnsupportedPrecision: spec.precision bf16: T4 (compute capability 7.5) and V100-16GB (compute capability 7.0) have no bf16 (it needs compute capability 8.0 or later); use spec.precision fp16 (tensor cores) or fp32" -- \
  failed_reason bf16-volta
assert "the same job in fp16 is planned" wait_for 20 phase_is fp16-volta Planned
check "... on the V100s and T4s only: the Maxwell node is left out" 0 "gpu-t gpu-t gpu-v gpu-v" -- \
  jp cephalojob fp16-volta '{.status.plan.ranks[*].node}'
check "... the status shows each rank's recompute mode (spec.recompute full: all)" 0 "full full full full" -- \
  jp cephalojob fp16-volta '{.status.plan.ranks[*].recompute}'
check "... the status names the node left out, its GPU and compute capability" 0 \
  "node gpu-m: Tesla-M60 (compute capability 5.2) is left out: the worker image is built for sm_60 sm_61 sm_70 sm_75 sm_80 sm_86 sm_89 sm_90 (--worker-archs)" -- \
  jp cephalojob fp16-volta '{.status.message}'
K get configmap fp16-volta-plan -o json >"$dir/fp16-cm.json" 2>&1
K get pod fp16-volta-0 -o json >"$dir/fp16-pod.json" 2>&1
check "... plan.json says fp16 and recompute full (spec.recompute), the workers get --precision fp16 --recompute full" 0 "fp16 ok" -- python3 - "$dir/fp16-cm.json" "$dir/fp16-pod.json" <<'PY'
import json, sys
plan = json.loads(json.load(open(sys.argv[1]))['data']['plan.json'])
args = json.load(open(sys.argv[2]))['spec']['containers'][0]['args']
assert plan['inputs']['precision'] == 'fp16', plan['inputs']
assert plan['inputs']['recompute'] == 'full' and {r['recompute'] for r in plan['ranks']} == {'full'}, plan
assert args[args.index('--precision') + 1] == 'fp16', args
assert args[args.index('--recompute') + 1] == 'full', args
print('fp16 ok')
PY
printf 'apiVersion: cephalo.dev/v1alpha1\nkind: CephaloJob\nmetadata: {name: bad-recompute}\nspec: {data: {path: synthetic}, model: {name: gpt2-124m}, globalBatch: 8, steps: 1, recompute: some}\n' >"$dir/badrec.yaml"
check "spec.recompute outside auto, none, full is refused by the CRD, naming the field" 1 "spec.recompute: Unsupported value" -- \
  K apply -f "$dir/badrec.yaml"
assert "a job whose only GPUs the image cannot run -> Failed" wait_for 20 phase_is maxwell-only Failed
check "... reason NoGPUs, saying the worker image runs none of them and why" 0 \
  "Failed False NoGPUs: no usable GPU: the worker image runs none of the GPUs the job may use: node gpu-m: Tesla-M60 (compute capability 5.2) is left out" -- \
  failed_reason maxwell-only

# ---- GPUs shared between jobs: accounting, admission, queueing -----------------------------------
# pool q: 2 L4 + 1 A10G. tiny (no nodeSelector) could take them: it goes first
K delete cephalojob tiny >/dev/null
{ node q-a NVIDIA-L4 23034 2 q; node q-b NVIDIA-A10G 23028 1 q; } | K create -f - >/dev/null
qjob() { # NAME [GPUS-FIELDS] [SPEC-FIELDS]: gpt2 on pool q
  printf 'apiVersion: cephalo.dev/v1alpha1\nkind: CephaloJob\nmetadata: {name: %s}\nspec: {data: {path: synthetic}, model: {name: gpt2-124m}, seqLen: 128, globalBatch: 12, steps: 1, gpus: {nodeSelector: {pool: q}%s}%s}\n' "$1" "${2:-}" "${3:-}"
}
admitted() { jp cephalojob "$1" '{.status.phase} {.status.conditions[?(@.type=="Admitted")].status} {.status.conditions[?(@.type=="Admitted")].reason}: {.status.message}'; }
qjob q-first | K apply -f - >/dev/null
assert "a job gets the whole pool (3 GPUs)" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob q-first -o jsonpath="{.status.phase} {.status.plan.worldSize}")" = "Planned 3" ]'
qjob q-second | K apply -f - >/dev/null
sleep 1.2 # a later creationTimestamp (seconds)
qjob q-high "" ", priority: 5" | K apply -f - >/dev/null
assert "a second job on a pool that fits one waits (Queued)" wait_for 20 phase_is q-second Queued
check "... Admitted False, reason WaitingForGPUs, naming what it waits for" 0 \
  "Queued False WaitingForGPUs: needs 3 GPUs (2 L4, 1 A10G) of its plan; 0 free" -- admitted q-second
check "... with its plan in the status and no pods" 0 "3 0" -- bash -c \
  'echo $(kubectl get cephalojob q-second -o jsonpath={.status.plan.worldSize}) $(kubectl get pods -l cephalo.dev/job=q-second -o name | wc -l)'
check "kubectl get shows the phase Queued" 0 "Queued" -- K get cephalojob q-second
assert "a later job with a higher spec.priority waits too" wait_for 20 phase_is q-high Queued
finish q-first
assert "when the first succeeds, the higher-priority job starts first" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob q-high -o jsonpath="{.status.phase} {.status.plan.worldSize}")" = "Planned 3" ]'
check "... the earlier one of lower priority still waits, now for q-high's GPUs" 0 "Queued False WaitingForGPUs" -- admitted q-second
finish q-high
assert "... and starts when those end" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob q-second -o jsonpath="{.status.phase} {.status.conditions[?(@.type==\"Admitted\")].status}")" = "Planned True" ]'
finish q-second
wait_for 20 phase_is q-second Succeeded

# a job whose claims are missing, then unbound, then bound: no pods until then, the status naming
# the claim and its field (not a GPU taken after planning, which is what the scheduler's refusal
# of such pods would look like)
printf 'apiVersion: cephalo.dev/v1alpha1\nkind: CephaloJob\nmetadata: {name: q-claim}\nspec: {data: {pvc: shards, path: train}, checkpoint: {pvc: ckpts, dir: q}, model: {name: gpt2-124m}, seqLen: 128, globalBatch: 12, steps: 1, gpus: {nodeSelector: {pool: q}}}\n' |
  K apply -f - >/dev/null
claim_status() { jp cephalojob q-claim '{.status.phase} {.status.conditions[?(@.type=="Admitted")].reason}: {.status.message}'; }
claim_is() { claim_status | grep -qF -- "$1"; }
assert "a job whose data claim does not exist waits: Queued, reason ClaimNotFound" wait_for 20 claim_is "Queued ClaimNotFound"
check "... naming the claim and its field, with no pods" 0 \
  "Queued ClaimNotFound: PersistentVolumeClaim default/shards (spec.data.pvc) does not exist: create it (e.g. examples/k8s/storage.yaml); the worker pods wait for it 0" -- \
  echo "$(claim_status) $(K get pods -l cephalo.dev/job=q-claim -o name | wc -l)"
check "... and a Warning Event saying so" 0 "Warning ClaimNotFound PersistentVolumeClaim default/shards" -- \
  K get events --field-selector involvedObject.name=q-claim,reason=ClaimNotFound -o jsonpath='{.items[0].type} {.items[0].reason} {.items[0].message}'
pvc() { printf '{"apiVersion":"v1","kind":"PersistentVolumeClaim","metadata":{"name":"%s"},"spec":{"accessModes":["ReadWriteMany"],"resources":{"requests":{"storage":"1Gi"}}}}' "$1" | K create -f - >/dev/null; }
bind() { K patch pvc "$1" --subresource=status --type merge -p '{"status":{"phase":"Bound"}}' >/dev/null; }
pvc shards
assert "the claim created but not bound (no volume binder here): reason ClaimNotBound" wait_for 20 claim_is \
  "Queued ClaimNotBound: PersistentVolumeClaim default/shards (spec.data.pvc) is Pending, not Bound"
bind shards
assert "bound: the next claim is named (the checkpoint claim, spec.checkpoint.pvc)" wait_for 20 claim_is \
  "ClaimNotFound: PersistentVolumeClaim default/ckpts (spec.checkpoint.pvc) does not exist"
pvc ckpts && bind ckpts
assert "both bound: the gang's 3 pods are made" wait_for 20 bash -c '[ "$(kubectl get pods -l cephalo.dev/job=q-claim -o name | wc -l)" = 3 ]'
check "... mounting both claims" 0 "ckpts shards" -- bash -c \
  "kubectl get pod q-claim-0 -o jsonpath='{range .spec.volumes[*]}{.persistentVolumeClaim.claimName} {end}' | tr ' ' '\n' | sort | paste -sd' '"
finish q-claim
wait_for 20 phase_is q-claim Succeeded

# a pod of another namespace (not the operator's) holds one of q-a's GPUs: a job plans around it
K create namespace other >/dev/null
printf '%s\n' 'apiVersion: v1' 'kind: Pod' 'metadata: {name: foreign, namespace: other}' 'spec:' '  nodeName: q-a' \
  '  containers: [{name: c, image: registry.test/other:1, resources: {limits: {nvidia.com/gpu: "1"}}}]' | K apply -f - >/dev/null
qjob q-around ", maxGPUs: 2" | K apply -f - >/dev/null
assert "a foreign pod's GPU is left out: the job plans on the 2 free ones" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob q-around -o jsonpath="{.status.phase} {.status.plan.ranks[*].node}")" = "Planned q-a q-b" ]'
# minGPUs: start on what is free, grow later (at most every minReplanSeconds); 2, not 1: q-around's
# two pods end one after the other, and on the first GPU freed a minGPUs 1 job would start at once
qjob q-elastic ", minGPUs: 2" ", elastic: {minReplanSeconds: 4}" | K apply -f - >/dev/null
assert "a job with minGPUs waits while fewer are free" wait_for 20 phase_is q-elastic Queued
check "... saying how many it needs at least" 0 \
  "needs 3 GPUs (2 L4, 1 A10G) of its plan, or at least 2 (spec.gpus.minGPUs) of them free; 0 free" -- admitted q-elastic
finish q-around
assert "... and starts on fewer GPUs than its whole plan when some free up" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob q-elastic -o jsonpath="{.status.phase} {.status.plan.worldSize}")" = "Planned 2" ]'
K delete pod -n other foreign --grace-period=0 --force >/dev/null 2>&1
assert "... then grows onto the freed GPU (re-planned, the gang restarts)" wait_for 30 bash -c \
  '[ "$(kubectl get cephalojob q-elastic -o jsonpath="{.status.phase} {.status.conditions[?(@.type==\"Restarting\")].reason}")" = "Restarting Replanned" ]'
assert "... on 3 GPUs" wait_for 20 bash -c \
  '[ "$(kubectl get cephalojob q-elastic -o jsonpath="{.status.plan.worldSize} {.status.replans}")" = "3 1" ] && [ "$(kubectl get pods -l cephalo.dev/job=q-elastic -o name | wc -l)" = 3 ]'
qjob q-never ", minGPUs: 4" | K apply -f - >/dev/null
qjob q-minmax ", minGPUs: 3, maxGPUs: 2" | K apply -f - >/dev/null
assert "a job that can never fit -> Failed" wait_for 20 phase_is q-never Failed
check "... reason InsufficientGPUs, naming what the cluster has" 0 \
  "Failed False InsufficientGPUs: spec.gpus.minGPUs 4 is more than the 3 GPUs the job may use in the cluster (2 L4, 1 A10G): it can never start" -- \
  failed_reason q-never
assert "minGPUs above maxGPUs -> Failed (InvalidSpec)" wait_for 20 bash -c \
  'kubectl get cephalojob q-minmax -o jsonpath={.status.message} | grep -q "spec.gpus.minGPUs 3 is more than spec.gpus.maxGPUs 2"'
touch "$dir/gpuwatch.stop"
wait "$watch_pid"; watch_pid=
check "no GPU was ever requested twice (bound or affinity-pinned non-terminal pods' requests <= allocatable at every poll)" 0 "gpus ok" -- \
  bash -c "[ ! -s '$dir/overbooked' ] && [ \"\$(cat '$dir/overbooked.polls')\" -gt 20 ] && echo gpus ok || { cat '$dir/overbooked'; cat '$dir/overbooked.polls'; }"

stop_op
if grep -q 'error\|failed' "$dir"/op-*.log; then
  echo "# operator log lines with errors:"; grep 'error\|failed' "$dir"/op-*.log | head -10 | sed 's/^/#   /'
fi
check "every line of the operator's logs carries the timestamp and the level" 0 "log ok" -- \
  python3 - "$dir"/op-*.log <<'PY'
import re, sys
form = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (debug|info|warn|error) \S')
bad = [l for f in sys.argv[1:] for l in open(f).read().splitlines() if not form.match(l)]
assert not bad, bad[:5]
print('log ok')
PY
