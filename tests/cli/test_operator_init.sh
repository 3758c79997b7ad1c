#!/usr/bin/env bash
# Fine-tuning Hugging Face model directories through cephalo-operator (spec.model.initFrom) and
# validation data (spec.data.validation), against a real kube-apiserver + etcd on loopback
# (tests/k8s/apiserver.sh, no scheduler: the test binds pods itself) with tests/k8s/kubelet.py
# playing the kubelet of one fake GPU node. Checks: the CRD takes initFrom (and the example job)
# and refuses what its schema can; a job whose config.json is in a ConfigMap (a Llama with
# grouped-query attention) is planned with that model and its pods get the claim mounted
# read-only at /cephalo/init, `--init-from /cephalo/init/PATH` and the validation flags; jobs
# with a bad initFrom (two volume sources, no config, a config field Cephalo cannot train, a
# missing ConfigMap or key, a path leaving the volume) are Failed with a message naming the field
# and get no pods, and a ConfigMap created later is picked up; end to end, a job fine-tunes a
# hostPath directory made by tests/ref/hf_models.py on 2 ranks run by the kubelet, with
# validation, and starts from the directory's weights (its first loss is a local 1-rank
# --init-from run's and differs from other weights'); a job whose config differs from the
# directory's is refused by its workers. Everything started is stopped on exit.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
AS=tests/k8s/apiserver.sh
OP=${BUILD:-build/rel}/bin/cephalo-operator
WORKER=$(pod_worker) # tests/cli/lib.sh: under SAN=1 the release worker, the operator sanitized
PY=/usr/bin/python3
JNS=ml

skip_all() { echo "not ok 1 - fine-tuning through cephalo-operator (initFrom): $*"; exit 0; }
[ -x "$OP" ] && [ -x "$WORKER" ] || skip_all "$OP or $WORKER is not built (make)"
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
"$AS" built || skip_all "kube-apiserver is not built: run 'sudo tests/k8s/apiserver.sh build'"

dir=$(mktemp -d /tmp/cephalo-init-test.XXXXXX)
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
  for f in "$dir"/kl/pids/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  stop_pid "$op_pid"
  "$AS" stop "$dir/k8s" >/dev/null 2>&1
  [ -z "${KEEP_LOGS:-}" ] || { mkdir -p "$KEEP_LOGS" && cp -r "$dir"/*.log "$dir/kl/logs" "$KEEP_LOGS/" 2>/dev/null; }
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
exports=$("$AS" start "$dir/k8s" 2>"$dir/start.log") || {
  sed 's/^/#   /' "$dir/start.log"; skip_all "the API server did not start"; }
eval "$exports"
export KUBECONFIG
K() { kubectl --request-timeout=20s "$@"; }
curl_api() { curl -sS --cacert "$K8S_CA" -H "Authorization: Bearer $K8S_TOKEN" "$@"; }
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
M="http://127.0.0.1:$port"
jp() { K -n "$JNS" get "$1" "$2" -o jsonpath="$3" 2>/dev/null; }
phase_is() { [ "$(jp cephalojob "$1" '{.status.phase}')" = "$2" ]; }
npods() { K -n "$JNS" get pods -l "cephalo.dev/job=$1" -o name 2>/dev/null | wc -l; }
pods_are() { [ "$(npods "$1")" = "$2" ]; }
bind() { # JOB NODE: binds the job's pods to NODE, as the scheduler would
  local p
  for p in $(K -n "$JNS" get pods -l "cephalo.dev/job=$1" -o jsonpath='{.items[*].metadata.name}'); do
    curl_api -X POST -H 'Content-Type: application/json' "$K8S_SERVER/api/v1/namespaces/$JNS/pods/$p/binding" \
      -d "{\"apiVersion\":\"v1\",\"kind\":\"Binding\",\"metadata\":{\"name\":\"$p\"},\"target\":{\"apiVersion\":\"v1\",\"kind\":\"Node\",\"name\":\"$2\"}}" >/dev/null
  done
}
# job NAME MODEL_YAML [SPEC_YAML]: a small CephaloJob (the model section indented under spec.model;
# SPEC_YAML: more spec lines, default 2 GPUs of pool a)
POOL_A='gpus: {maxGPUs: 2, nodeSelector: {pool: a}}'
job() { # NAME MODEL_YAML [REST_YAML]: synthetic data unless MODEL_YAML or REST_YAML give data
  local data='  data: {path: synthetic}'
  case "$2${3:-}" in *"data: {"*) data='' ;; esac
  cat <<EOF
apiVersion: cephalo.dev/v1alpha1
kind: CephaloJob
metadata: {name: $1, namespace: $JNS}
spec:
  model:
$2
  seqLen: 32
  globalBatch: 4
  steps: 6
$data
  ${3:-$POOL_A}
EOF
}

# ---- the cluster: the CRD, fake GPU nodes, a model directory ----------------------------------------
K apply -f crds/cephalojobs.cephalo.dev.yaml >/dev/null 2>&1
K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev >/dev/null 2>&1
K create namespace "$JNS" >/dev/null
node() { # NAME PRODUCT MEMORY_MIB COUNT POOL
  cat <<EOF
{"apiVersion":"v1","kind":"Node","metadata":{"name":"$1","labels":{"kubernetes.io/hostname":"host-$1",
 "nvidia.com/gpu.product":"$2","nvidia.com/gpu.memory":"$3","nvidia.com/gpu.count":"$4","pool":"$5"}},
 "status":{"capacity":{"cpu":"8","memory":"32Gi","pods":"110","nvidia.com/gpu":"$4"},
           "allocatable":{"cpu":"8","memory":"32Gi","pods":"110","nvidia.com/gpu":"$4"}}}
EOF
}
{ node gpu-a NVIDIA-L4 23034 2 a; node gpu-b NVIDIA-L4 23034 1 b; node gpu-k NVIDIA-L4 23034 2 k; } >"$dir/nodes.json"
check "fake GPU nodes (pools a, b and k, the kubelet's) are created" 0 "node/gpu-k created" -- K create -f "$dir/nodes.json"
# the model directory (a tiny Llama with grouped-query attention: 4 heads, 2 KV heads) and another
# with other weights of the same shape; token shards for training and validation (vocab 256)
$PY tests/ref/hf_models.py make "$dir/models/tiny-llama" --arch llama --kv 2 >/dev/null &&
  $PY tests/ref/hf_models.py make "$dir/other-llama" --arch llama --kv 2 --seed 9 >/dev/null
check "tests/ref/hf_models.py makes a Llama directory (config.json, model.safetensors)" 0 '"num_key_value_heads": 2' -- \
  cat "$dir/models/tiny-llama/config.json"
# (the kubelet gives claim NAME the directory kl/pvc/NAME)
mkdir -p "$dir/kl/pvc/tokens"
$PY - "$dir/kl/pvc/tokens" <<'PY'
import random, struct, sys
random.seed(3)
for name, n in (('train.bin', 20000), ('val.bin', 4000)):
    toks = [random.randrange(256) if i % 7 else 65 for i in range(n)]
    with open(f'{sys.argv[1]}/{name}', 'wb') as f:
        f.write(struct.pack('<256i', 20240520, 1, n, *[0] * 253))
        f.write(struct.pack(f'<{n}H', *toks))
PY

# ---- the CRD ------------------------------------------------------------------------------------------
check "the example fine-tuning job (GPT-2 from a claim, inline config.json) is accepted" 0 "created" -- \
  K -n "$JNS" create -f examples/jobs/cephalojob-finetune-gpt2.yaml
check "... and keeps its config.json (unknown fields preserved)" 0 '"n_embd":768' -- \
  jp cephalojob gpt2-finetune '{.spec.model.initFrom.config}'
K -n "$JNS" delete cephalojob gpt2-finetune >/dev/null 2>&1
crd_bad() { # MODEL_YAML: the apiserver's answer to a job with that model
  job crd-bad "$1" >"$dir/crd-bad.yaml"
  K apply --validate=false -f "$dir/crd-bad.yaml"
}
check "name and initFrom together are refused" 1 "spec.model" -- \
  crd_bad "    {name: gpt2-124m, initFrom: {volume: {hostPath: {path: /m}}, config: {model_type: gpt2}}}"
check "initFrom without volume is refused, naming the field" 1 "spec.model.initFrom.volume: Required value" -- \
  crd_bad "    {initFrom: {config: {model_type: gpt2}}}"
check "a claim without claimName is refused" 1 "spec.model.initFrom.volume.persistentVolumeClaim.claimName: Required value" -- \
  crd_bad "    {initFrom: {volume: {persistentVolumeClaim: {readOnly: true}}, config: {model_type: gpt2}}}"
check "a relative hostPath is refused" 1 "spec.model.initFrom.volume.hostPath.path: Invalid value" -- \
  crd_bad "    {initFrom: {volume: {hostPath: {path: models}}, config: {model_type: gpt2}}}"
check "data.validation without path is refused" 1 "spec.data.validation.path: Required value" -- \
  crd_bad "    {name: tiny-gpt}
  data: {validation: {every: 10}}"
check "data.validation.every 0 is refused" 1 "spec.data.validation.every: Invalid value: 0" -- \
  crd_bad "    {name: tiny-gpt}
  data: {validation: {path: val, every: 0}}"

# ---- the operator --------------------------------------------------------------------------------------
"$OP" --kubeconfig "$KUBECONFIG" --metrics-addr "127.0.0.1:$port" --log-level info --leader-elect=false \
  --worker-image registry.test/cephalo-worker:1 >"$dir/op.log" 2>&1 &
op_pid=$!
assert "the operator becomes ready" wait_for 20 curl -fsS "$M/readyz"

# ---- a Llama from a claim, its config.json in a ConfigMap, with validation data -------------------
bound_claim "$JNS" tokens && bound_claim "$JNS" hf-models # (no volume binder here)
K -n "$JNS" create configmap tiny-llama-config --from-file=config.json="$dir/models/tiny-llama/config.json" >/dev/null
job llama "    initFrom:
      volume: {persistentVolumeClaim: {claimName: hf-models}}
      path: models/tiny-llama/
      configMap: {name: tiny-llama-config}" "data: {pvc: tokens, path: train/*.bin, validation: {path: val/*.bin, every: 50, samples: 16}}
  gpus: {maxGPUs: 2, nodeSelector: {pool: a}}" >"$dir/llama.yaml"
K apply -f "$dir/llama.yaml" >/dev/null
assert "the job is planned (phase Planned) with its 2 pods" wait_for 30 bash -c \
  "[ \"\$(kubectl -n $JNS get cephalojob llama -o jsonpath='{.status.phase}')\" = Planned ] && [ \"\$(kubectl -n $JNS get pods -l cephalo.dev/job=llama -o name | wc -l)\" = 2 ]"
K -n "$JNS" get configmap llama-plan -o json >"$dir/llama-cm.json" 2>&1
check "status.model (the MODEL column) names the initFrom directory" 0 "tiny-llama (initFrom)" -- \
  kubectl -n "$JNS" get cephalojob llama -o jsonpath='{.status.model}'
check "the plan's model is the ConfigMap's config.json: Llama, 2 layers, d 64, 4 heads, 2 KV heads, d_ff 192" 0 \
  "model ok" -- $PY - "$dir/llama-cm.json" <<'PY'
import json, sys
p = json.loads(json.load(open(sys.argv[1]))['data']['plan.json'])
m = p['inputs']['model_spec']
want = {'name': 'tiny-llama', 'arch': 'llama', 'n_layer': 2, 'd_model': 64, 'n_head': 4, 'n_kv_head': 2,
        'd_ff': 192, 'vocab': 256, 'max_seq': 128, 'tied_head': False, 'norm_eps': 1e-6, 'rope_theta': 10000}
bad = {k: (m.get(k), v) for k, v in want.items() if m.get(k) != v}
assert not bad and p['world_size'] == 2 and p['inputs']['seq'] == 32, (bad, p['world_size'])
print('model ok')
PY
K -n "$JNS" get pods -l cephalo.dev/job=llama -o json >"$dir/llama-pods.json" 2>&1
check "every pod mounts the claim read-only at /cephalo/init, gets --init-from and the validation flags" 0 "pods ok" -- \
  $PY - "$dir/llama-pods.json" <<'PY'
import json, sys
pods = json.load(open(sys.argv[1]))['items']
assert len(pods) == 2
for p in pods:
    s, c = p['spec'], p['spec']['containers'][0]
    vols = {v['name']: v for v in s['volumes']}
    assert vols['init-from'] == {'name': 'init-from', 'persistentVolumeClaim': {'claimName': 'hf-models', 'readOnly': True}}, vols
    mounts = {m['name']: m for m in c['volumeMounts']}
    assert mounts['init-from']['mountPath'] == '/cephalo/init' and mounts['init-from']['readOnly'] is True, mounts
    a = c['args']
    flag = lambda f: a[a.index(f) + 1]
    assert a.count('--init-from') == 1 and flag('--init-from') == '/cephalo/init/models/tiny-llama', a
    assert flag('--data') == '/data/train/*.bin' and flag('--val-data') == '/data/val/*.bin', a
    assert flag('--val-every') == '50' and flag('--val-samples') == '16', a
print('pods ok')
PY
# what the garbage collector would delete with the job (there is no controller manager here)
K -n "$JNS" delete cephalojob llama >/dev/null
K -n "$JNS" delete pods,configmaps,services -l cephalo.dev/job=llama >/dev/null 2>&1
assert "the job and its pods are gone" wait_for 30 pods_are llama 0

# ---- bad initFrom specs: Failed, the field named, no pods ------------------------------------------------
LLAMA_CFG=$($PY -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1]))))' "$dir/models/tiny-llama/config.json")
bad_cfg=$($PY -c 'import json, sys; c = json.loads(sys.argv[1]); c["intermediate_size"] = 0; print(json.dumps(c))' "$LLAMA_CFG")
nohid_cfg=$($PY -c 'import json, sys; c = json.loads(sys.argv[1]); del c["hidden_size"]; print(json.dumps(c))' "$LLAMA_CFG")
K -n "$JNS" create configmap wrong-key --from-literal=llama.json="$LLAMA_CFG" >/dev/null
fails=(
  "two-sources|{volume: {persistentVolumeClaim: {claimName: hf-models}, hostPath: {path: /models}}, configMap: {name: tiny-llama-config}}|spec.model.initFrom.volume: expected exactly one volume source (persistentVolumeClaim, hostPath or nfs), got 2 (hostPath, persistentVolumeClaim)"
  "no-config|{volume: {hostPath: {path: /models}}, path: tiny-llama}|spec.model.initFrom: missing config or configMap"
  "both-configs|{volume: {hostPath: {path: /models}}, config: $LLAMA_CFG, configMap: {name: tiny-llama-config}}|spec.model.initFrom: give config or configMap, not both"
  "bad-field|{volume: {hostPath: {path: /models}}, config: $bad_cfg}|spec.model.initFrom.config: intermediate_size: expected an integer"
  "no-hidden|{volume: {hostPath: {path: /models}}, config: $nohid_cfg}|spec.model.initFrom.config: missing field 'hidden_size'"
  "no-cm|{volume: {hostPath: {path: /models}}, configMap: {name: nope}}|spec.model.initFrom.configMap: ConfigMap $JNS/nope not found"
  "no-key|{volume: {hostPath: {path: /models}}, configMap: {name: wrong-key}}|spec.model.initFrom.configMap: ConfigMap $JNS/wrong-key has no key config.json (it has: llama.json)"
  "escape|{volume: {hostPath: {path: /models}}, path: a/../../etc, config: $LLAMA_CFG}|spec.model.initFrom.path: 'a/../../etc' leaves the volume"
)
for f in "${fails[@]}"; do
  IFS='|' read -r name from _ <<<"$f"
  job "$name" "    {initFrom: $from}" >"$dir/$name.yaml"
  K apply -f "$dir/$name.yaml" >/dev/null || echo "# $name: not applied"
done
for f in "${fails[@]}"; do
  IFS='|' read -r name _ want <<<"$f"
  wait_for 20 phase_is "$name" Failed
  check "$name: Failed (InvalidSpec), the message names the field: ${want:0:60}..." 0 "InvalidSpec $want" -- \
    jp cephalojob "$name" '{.status.conditions[?(@.type=="Failed")].reason} {.status.message}'
done
names=$(for f in "${fails[@]}"; do echo "${f%%|*}"; done | paste -sd, -)
check "... and none of them got a pod or a plan ConfigMap" 0 "0 0" -- bash -c \
  "echo \$(kubectl -n $JNS get pods -l 'cephalo.dev/job in ($names)' -o name | wc -l) \$(kubectl -n $JNS get configmaps -l 'cephalo.dev/job in ($names)' -o name | wc -l)"
check "the operator kept running" 0 "" -- kill -0 "$op_pid"
K -n "$JNS" create configmap nope --from-literal=config.json="$LLAMA_CFG" >/dev/null
assert "the missing ConfigMap, created later, is read again (every 30 s while the job fails on it): the job is planned" wait_for 60 phase_is no-cm Planned
K -n "$JNS" get pod no-cm-0 -o json >"$dir/no-cm-0.json" 2>&1
check "... its pods mount the hostPath read-only (the source as given) and start from its root" 0 "hostPath ok" -- \
  $PY - "$dir/no-cm-0.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
vols = {v['name']: v for v in p['spec']['volumes']}
hp = vols['init-from']['hostPath']  # the API server defaults its type to ''
assert sorted(vols['init-from']) == ['hostPath', 'name'] and hp['path'] == '/models' and not hp.get('type'), vols
c = p['spec']['containers'][0]
assert {'name': 'init-from', 'mountPath': '/cephalo/init', 'readOnly': True} in c['volumeMounts'], c['volumeMounts']
a = c['args']
assert a[a.index('--init-from') + 1] == '/cephalo/init' and '--val-data' not in a, a
print('hostPath ok')
PY
for f in "${fails[@]}"; do IFS='|' read -r name _ <<<"$f"; K -n "$JNS" delete cephalojob "$name" --wait=false >/dev/null; done

# ---- end to end: fine-tuning a hostPath directory on the kubelet's node ---------------------------------
$PY tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" --nodes gpu-k --heartbeat 0 \
  --first-ip "127.0.$((RANDOM % 240 + 10)).1" --worker "$WORKER" --work "$dir/kl" --extra-arg=--device --extra-arg=cpu \
  --extra-arg=--threads --extra-arg=1 2>"$dir/kubelet.log" &
kl_pid=$!
assert "the kubelet lists the pods" wait_for 20 grep -q 'listed' "$dir/kubelet.log"
job ft "    initFrom:
      volume: {hostPath: {path: $dir/models, type: Directory}}
      path: tiny-llama
      config: $LLAMA_CFG" "data: {pvc: tokens, path: train.bin, validation: {path: val.bin, every: 3, samples: 8}}
  optimizer: {lr: 0.001}
  backoffLimit: 0
  gpus: {maxGPUs: 2, nodeSelector: {pool: k}}" >"$dir/ft.yaml"
K apply -f "$dir/ft.yaml" >/dev/null
wait_for 30 pods_are ft 2
bind ft gpu-k
assert "the fine-tuning job ends Succeeded" wait_moving 60 "$dir/kl/logs/*" phase_is ft Succeeded
# the reference: one local rank from the same directory (the invariant: any plan gives 1 rank's
# losses), and one from other weights of the same shape
ref() { "$WORKER" train --init-from "$1" --batch 4 --seq 32 --steps 6 --lr 0.001 --data "$dir/kl/pvc/tokens/train.bin" \
  --val-data "$dir/kl/pvc/tokens/val.bin" --val-every 3 --val-samples 8 --device cpu --threads 1 2>&1; }
ref "$dir/models/tiny-llama" >"$dir/ref.log"
ref "$dir/other-llama" >"$dir/other.log"
check "both ranks trained 6 steps from the directory's weights with validation: losses as 1 local rank's" 0 "e2e ok" -- \
  $PY - "$dir/ref.log" "$dir/other.log" "$dir"/kl/logs/${JNS}_ft-*.log <<'PY'
import re, sys
TOL = 2e-4  # 4 printed decimals; 2 ranks sum in another order than 1 (rounding)
def steps(f):
    return {int(m.group(1)): float(m.group(2)) for m in re.finditer(r'^step (\d+)/6 \| loss ([0-9.]+)', open(f).read(), re.M)}
def vals(f):
    return [float(v) for v in re.findall(r'\| val ([0-9.]+)', open(f).read())]
ref, other, logs = steps(sys.argv[1]), steps(sys.argv[2]), sys.argv[3:]
assert len(logs) == 2 and 1 in ref and 6 in ref and 1 in other and 6 in other, (logs, ref, other)
assert all(abs(ref[k] - other[k]) > 5 * TOL for k in (1, 6)), ('other weights give the same losses', ref, other)
want_vals = vals(sys.argv[1])
assert want_vals, 'the reference run reported no validation loss'
for f in logs:
    got = steps(f)
    assert all(abs(got.get(k, -1) - ref[k]) <= TOL for k in (1, 6)), (f, got, ref)
    v = vals(f)
    assert len(v) == len(want_vals) and all(abs(a - b) <= TOL for a, b in zip(v, want_vals)), (f, v, want_vals)
print('e2e ok')
PY
check "the workers ran with --init-from rewritten to the hostPath directory" 0 "init-from $dir/models/tiny-llama" -- \
  grep -ho "init-from $dir/models/tiny-llama" "$dir/kubelet.log"

# the CR's config.json says 1 KV head, the directory has 2: the workers refuse to start
mis_cfg=$($PY -c 'import json, sys; c = json.loads(sys.argv[1]); c["num_key_value_heads"] = 1; print(json.dumps(c))' "$LLAMA_CFG")
sed -e 's/name: ft,/name: ft-mismatch,/' -e "s|config: .*|config: $mis_cfg|" "$dir/ft.yaml" >"$dir/ft-mismatch.yaml"
K apply -f "$dir/ft-mismatch.yaml" >/dev/null
wait_for 30 pods_are ft-mismatch 2
bind ft-mismatch gpu-k
assert "a config differing from the directory's: the job Fails (backoffLimit 0)" wait_for 60 phase_is ft-mismatch Failed
check "... its workers said which fields differ" 0 "describes another model than the tiny-llama being trained" -- \
  bash -c "cat $dir/kl/logs/${JNS}_ft-mismatch-*.log"
check "... n_kv_head 2 vs 1" 0 "n_kv_head 2 vs 1" -- bash -c "cat $dir/kl/logs/${JNS}_ft-mismatch-*.log"
check "the operator never exited" 0 "" -- kill -0 "$op_pid"
check "the operator's log has no error line" 0 "" -- bash -c "! grep ' error ' '$dir/op.log'"
