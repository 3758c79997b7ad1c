#!/usr/bin/env bash
# The CephaloJob CRD and the Helm chart's manifests against a real kube-apiserver + etcd on loopback
# (tests/k8s/apiserver.sh; built once, ~3-5 minutes, then cached): the CRD is accepted, the
# example jobs validate, bad jobs are refused naming the field, defaults are applied, the printer
# columns and the status subresource work, and the chart's RBAC grants the operator exactly what it
# needs (kubectl auth can-i as its ServiceAccount). Everything started is stopped on exit.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
AS=tests/k8s/apiserver.sh

skip_all() { echo "not ok 1 - kube-apiserver test: $*"; exit 0; }
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
python3 -c 'import yaml' 2>/dev/null || skip_all "python3-yaml is not installed (make deps)"
if ! "$AS" built; then
  [ "$(id -u)" = 0 ] || skip_all "kube-apiserver is not built and building it needs root: run 'sudo tests/k8s/apiserver.sh build'"
  echo "# building kube-apiserver from Debian's kubernetes source package (once; a few minutes)"
  blog=$(mktemp)
  "$AS" build >"$blog" 2>&1 || { tail -5 "$blog" | sed 's/^/#   /'; rm -f "$blog"; skip_all "the kube-apiserver build failed"; }
  rm -f "$blog"
fi

dir=$(mktemp -d /tmp/cephalo-k8s-test.XXXXXX)
cleanup() { "$AS" stop "$dir" >/dev/null 2>&1; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
exports=$("$AS" start "$dir/k8s" 2>"$dir/start.log") || {
  sed 's/^/#   /' "$dir/start.log"; tail -5 "$dir/k8s/apiserver.log" 2>/dev/null | sed 's/^/#   /'
  skip_all "the API server did not start"; }
eval "$exports"
export KUBECONFIG
K() { kubectl --request-timeout=20s "$@"; }
API="$K8S_SERVER/apis/cephalo.dev/v1alpha1/namespaces/default/cephalojobs"
curl_api() { curl -sS --cacert "$K8S_CA" -H "Authorization: Bearer $K8S_TOKEN" "$@"; }

# ---- the CRD ------------------------------------------------------------------------------------
check "CRD is accepted by the API server" 0 "created" -- K apply -f charts/cephalo/crds/cephalojobs.cephalo.dev.yaml
check "CRD becomes Established" 0 "condition met" -- K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev
check "example jobs validate and are created" 0 "cephalojob.cephalo.dev/llama-bf16 created" -- \
  K apply -f examples/jobs/cephalojob-gpt-mixed.yaml -f examples/jobs/cephalojob-llama-bf16.yaml \
    -f examples/jobs/cephalojob-suspended.yaml

# bad jobs: the gpt-mixed example with one change, refused by the server's validation (the
# client-side check is off so that the message is the API server's)
bad() {
  python3 - "$1" >"$dir/bad.yaml" <<'PY'
import sys, yaml
j = yaml.safe_load(open('examples/jobs/cephalojob-gpt-mixed.yaml'))
j['metadata']['name'] = 'bad'
for k, v in yaml.safe_load(sys.argv[1]).items():
    if v is None:
        j['spec'].pop(k, None)
    else:
        j['spec'][k] = v
print(yaml.safe_dump(j))
PY
  K apply --validate=false -f "$dir/bad.yaml"
}
check "globalBatch: -1 is refused, naming the field" 1 "spec.globalBatch: Invalid value: -1" -- bad '{globalBatch: -1}'
check "precision: fp8 is refused, naming the field" 1 'spec.precision: Unsupported value: "fp8"' -- bad '{precision: fp8}'
check "precision: fp16 is accepted (the gpt-mixed example's, for its T4s)" 0 "fp16" -- \
  K get cephalojob gpt2-mixed -o jsonpath='{.spec.precision}'
check "an unknown strategy is refused, naming the field" 1 'spec.strategy: Unsupported value: "zero"' -- bad '{strategy: zero}'
check "a missing steps is refused" 1 "spec.steps: Required value" -- bad '{steps: null}'
check "a missing data is refused (synthetic tokens only when named)" 1 "spec.data: Required value" -- bad '{data: null}'
check "data without path is refused" 1 "spec.data.path: Required value" -- bad '{data: {pvc: tokens}}'
check "optimizer.lr above 10 is refused" 1 "spec.optimizer.lr: Invalid value" -- bad '{optimizer: {lr: 11}}'
check "memCap 0 is refused (exclusive minimum)" 1 "spec.memCap: Invalid value" -- bad '{memCap: 0}'
check "model with both name and inline is refused" 1 "spec.model" -- bad '{model: {name: gpt2-124m, inline: {base: gpt2-124m}}}'
check "gpus.maxGPUs 0 is refused" 1 "spec.gpus.maxGPUs: Invalid value" -- bad '{gpus: {maxGPUs: 0}}'
check "a checkpoint without dir is refused" 1 "spec.checkpoint.dir: Required value" -- bad '{checkpoint: {every: 10}}'
check "checkpoint.keepLast -1 is refused, naming the field" 1 "spec.checkpoint.keepLast: Invalid value: -1" -- \
  bad '{checkpoint: {dir: ckpt, keepLast: -1}}'
check "checkpoint.keepEvery -5 is refused, naming the field" 1 "spec.checkpoint.keepEvery: Invalid value: -5" -- \
  bad '{checkpoint: {dir: ckpt, keepEvery: -5}}'
check "metricsPort 70000 is refused" 1 "spec.metricsPort: Invalid value" -- bad '{metricsPort: 70000}'
check "no bad job was stored" 0 "" -- bash -c '! kubectl get cephalojob bad 2>/dev/null'

# defaults (the suspended example gives only model, seqLen, globalBatch, steps, strategy, data, checkpoint)
K get cephalojob bert-suspended -o json >"$dir/suspended.json" 2>&1
check "defaults are applied" 0 "defaults ok" -- python3 - "$dir/suspended.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))['spec']
want = {'precision': 'fp32', 'seed': 1, 'memCap': 0.8, 'backoffLimit': 3, 'suspend': True,
        'metricsPort': 9400, 'commTimeout': 60, 'data': {'path': 'synthetic'}, 'gpus': {},
        'optimizer': {'lr': 0.0003, 'schedule': 'cosine', 'warmup': 0, 'weightDecay': 0.1, 'beta1': 0.9, 'beta2': 0.95,
                      'eps': 1e-08, 'clip': 1}}
bad = {k: (s.get(k), v) for k, v in want.items() if s.get(k) != v}
assert s['checkpoint']['resume'] == 'auto', s['checkpoint']
assert 'keepLast' not in s['checkpoint'] and 'keepEvery' not in s['checkpoint'], s['checkpoint']  # the directory's
assert 'minLr' not in s['optimizer']
print('defaults ok' if not bad else f'differ (got, want): {bad}')
PY

# ---- printer columns and the status subresource --------------------------------------------------
check "kubectl get shows the printer columns" 0 "PHASE   GPUS   STEP   SAMPLES/S   AGE" -- K get cephalojobs
check "kubectl get -o wide adds model, strategy, restarts" 0 "MODEL" -- K get cephalojobs -o wide
check "the short name cephjob works" 0 "gpt2-mixed" -- K get cephjob gpt2-mixed
gen0=$(K get cephalojob gpt2-mixed -o jsonpath='{.metadata.generation}')
now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
status='{"spec":{"steps":7},"status":{"phase":"Running","step":120,"lastCheckpointStep":100,
  "samplesPerSecond":311.4821,"samplesPerSecondText":"311.5","model":"gpt2-124m","restarts":1,"observedGeneration":1,"startTime":"'$now'",
  "plan":{"worldSize":6,"strategy":"cephalo","predictedIterMs":205.4,"ranks":[{"rank":0,"node":"l4-a",
  "device":"L4","pod":"gpt2-mixed-0","batch":12,"microbatch":4,"microbatches":3,"stateRatio":0.2}]},
  "conditions":[{"type":"Running","status":"True","reason":"AllPodsRunning","message":"6/6 workers",
  "lastTransitionTime":"'$now'","observedGeneration":1}]}}'
check "PATCH of /status is accepted" 0 '"phase":"Running"' -- \
  curl_api -f -X PATCH -H 'Content-Type: application/merge-patch+json' --data "$status" "$API/gpt2-mixed/status"
check "the status PATCH left the spec and generation alone" 0 "5000 $gen0" -- \
  K get cephalojob gpt2-mixed -o jsonpath='{.spec.steps} {.metadata.generation}'
check "the columns show the status" 0 "Running   6      120    311.5" -- K get cephalojob gpt2-mixed
check "... SAMPLES/S is the one-decimal text (the number 311.4821 kept), MODEL status.model" 0 "311.5 gpt2-124m 311.4821" -- \
  bash -c "kubectl get cephalojob gpt2-mixed -o wide --no-headers | awk '{printf \"%s %s \", \$5, \$6}'; kubectl get cephalojob gpt2-mixed -o jsonpath='{.status.samplesPerSecond}'"
check "status through the main resource is ignored" 0 "Running" -- bash -c \
  "kubectl patch cephalojob gpt2-mixed --type merge -p '{\"status\":{\"phase\":\"Failed\"}}' >/dev/null &&
   kubectl get cephalojob gpt2-mixed -o jsonpath='{.status.phase}'"
check "a bad status phase is refused" 0 'status.phase: Unsupported value: \"Bogus\"' -- \
  curl_api -X PATCH -H 'Content-Type: application/merge-patch+json' --data '{"status":{"phase":"Bogus"}}' "$API/gpt2-mixed/status"
check "a condition without reason is refused" 0 "reason: Required value" -- \
  curl_api -X PATCH -H 'Content-Type: application/merge-patch+json' \
  --data '{"status":{"conditions":[{"type":"Planned","status":"True","message":"","lastTransitionTime":"'$now'"}]}}' \
  "$API/gpt2-mixed/status"
check "a spec change bumps the generation" 0 "$((gen0 + 1))" -- bash -c \
  "kubectl patch cephalojob gpt2-mixed --type merge -p '{\"spec\":{\"suspend\":true}}' >/dev/null &&
   kubectl get cephalojob gpt2-mixed -o jsonpath='{.metadata.generation}'"

# ---- the chart's manifests and RBAC --------------------------------------------------------------
K create namespace cephalo-system >/dev/null 2>&1
python3 tests/k8s/check_chart.py --emit "$dir/chart.yaml" >/dev/null 2>&1
check "the chart's manifests are accepted" 0 "deployment.apps/cephalo-operator created" -- K apply -f "$dir/chart.yaml"
SA=system:serviceaccount:cephalo-system:cephalo-operator
can() { K auth can-i --as="$SA" "$@"; }
for a in "watch cephalojobs.cephalo.dev -A" "patch cephalojobs.cephalo.dev --subresource=status -n ml" \
         "create pods -n ml" "delete pods -n ml" "create configmaps -n ml" "patch services -n ml" \
         "list nodes" "create events -n ml" "update leases.coordination.k8s.io -n cephalo-system"; do
  # shellcheck disable=SC2086
  check "the operator may $a" 0 "yes" -- can $a
done
for a in "get secrets -n ml" "create deployments.apps -n ml" "update pods --subresource=status -n ml" \
         "delete cephalojobs.cephalo.dev -n ml" "create cephalojobs.cephalo.dev -n ml" \
         "update nodes" "get leases.coordination.k8s.io -n ml" "create roles.rbac.authorization.k8s.io -n ml"; do
  # shellcheck disable=SC2086
  check "the operator may not $a" 1 "no" -- can $a
done

# ---- stop ---------------------------------------------------------------------------------------
pids=$(cat "$dir/k8s/apiserver.pid" "$dir/k8s/etcd.pid" 2>/dev/null | tr '\n' ' ')
"$AS" stop "$dir/k8s"
check "the API server and etcd are stopped" 0 "" -- bash -c "for p in $pids; do ! kill -0 \$p 2>/dev/null || exit 1; done"
