#!/usr/bin/env bash
# `make k8s-demo`: Cephalo on Kubernetes in one command, no GPU and no registry needed. It brings
# up the project's test control plane (tests/k8s/apiserver.sh: etcd, kube-apiserver,
# kube-scheduler, kube-controller-manager), registers the README's cluster as fake GPU nodes (two
# NVIDIA L4, an A10G and a T4, with GPU Feature Discovery's labels; tests/k8s/kubelet.py plays
# their kubelet and runs each worker pod as `cephalo-worker --device cpu`), installs the chart
# (the operator's image mapped to the local cephalo-operator), creates the claims
# (examples/k8s/storage.yaml), puts token shards on the data claim with
# examples/k8s/data-prep.yaml, applies examples/jobs/cephalojob-cpu.yaml and watches it
# (`kubectl get cephalojobs -w`) until it succeeds; then it prints what the dashboard shows, from
# the operator's and a worker's /metrics, and tears everything down (also on Ctrl-C).
#   KEEP=DIR make k8s-demo     keeps the logs in DIR
set -euo pipefail
cd "$(dirname "$0")/.."
B=${BUILD:-build/rel}
AS=tests/k8s/apiserver.sh
PY=/usr/bin/python3
OP=$(realpath "$B/bin/cephalo-operator") WORKER=$(realpath "$B/bin/cephalo-worker") CLI=$(realpath "$B/bin/cephalo")
OP_IMAGE=ghcr.io/cephalo/cephalo-operator WORKER_IMAGE=ghcr.io/cephalo/cephalo-worker
NS=ml
TIMEOUT=${K8S_DEMO_TIMEOUT:-600}
rule() { printf '\n== %s ==\n' "$*"; }
say() { printf '%s\n' "$*"; }
die() { printf 'k8s-demo: %s\n' "$*" >&2; exit 1; }

for b in "$OP" "$WORKER" "$CLI"; do [ -x "$b" ] || die "$b is not built (make)"; done
command -v kubectl >/dev/null || die "kubectl is not installed (make deps)"
"$AS" built || die "the test control plane is not built (make controlplane)"
HELM=$(mk/helm.sh) || die "helm is not available (mk/helm.sh failed)"

dir=$(mktemp -d /tmp/cephalo-k8s-demo.XXXXXX)
kl_pid='' watch_pid=''
cleanup() {
  local rc=$?
  set +e # every step runs, whatever the one before it did (a process already gone)
  [ -n "$watch_pid" ] && kill "$watch_pid" 2>/dev/null
  if [ -n "$kl_pid" ]; then # SIGTERM stops the pods' processes; SIGKILL after 10 s
    kill "$kl_pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$kl_pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$kl_pid" 2>/dev/null || true
  fi
  for f in "$dir"/kl/pids/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  "$AS" stop "$dir/k8s" >/dev/null 2>&1 || true
  if [ -n "${KEEP:-}" ]; then
    mkdir -p "$KEEP" && cp -r "$dir"/*.log "$dir/kl/logs" "$dir"/k8s/*.log "$KEEP/" 2>/dev/null
    say "k8s-demo: logs kept in $KEEP"
  fi
  rm -rf "$dir"
  say "k8s-demo: torn down (control plane stopped, pods' processes ended)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
t0=$SECONDS

rule "the control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager (v1.20.2)"
exports=$("$AS" start "$dir/k8s" --control-plane 2>"$dir/start.log") || { cat "$dir/start.log" >&2; die "the control plane did not start"; }
eval "$exports"
export KUBECONFIG
export HELM_CACHE_HOME=$dir/helm HELM_CONFIG_HOME=$dir/helm HELM_DATA_HOME=$dir/helm
K() { kubectl --request-timeout=20s "$@"; }
say "API server $K8S_SERVER (up in $((SECONDS - t0)) s)"

rule "the nodes: cpu-0 for the operator, and the README's GPUs as fake GPU nodes"
gfd() { # NODE PRODUCT MEMORY_MIB: GPU Feature Discovery's labels and one nvidia.com/gpu
  echo "--node-label=$1:nvidia.com/gpu.product=$2 --node-label=$1:nvidia.com/gpu.memory=$3"
  echo "--node-label=$1:nvidia.com/gpu.count=1 --node-label=$1:nvidia.com/gpu.present=true --node-gpus=$1=1"
}
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# shellcheck disable=SC2046
$PY tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" \
  --nodes cpu-0,l4-a,l4-b,a10g,t4 --register \
  $(gfd l4-a NVIDIA-L4 23034) $(gfd l4-b NVIDIA-L4 23034) $(gfd a10g NVIDIA-A10G 23028) $(gfd t4 Tesla-T4 15360) \
  --heartbeat 5 --first-ip "127.0.$((RANDOM % 240 + 10)).1" --work "$dir/kl" \
  --image-cmd "$OP_IMAGE=$OP" --image-cmd "$WORKER_IMAGE=$CLI" --service-account-tokens \
  --worker "$WORKER" --extra-arg=--device --extra-arg=cpu --extra-arg=--threads --extra-arg=1 \
  2>"$dir/kubelet.log" &
kl_pid=$!
ready() { [ "$(K get nodes -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{.spec.taints}{end}' 2>/dev/null)" = TrueTrueTrueTrueTrue ]; }
# while kubelet.py lives: a busy machine registers the nodes in minutes, not seconds
end=$((SECONDS + 600))
until ready || [ $SECONDS -ge $end ] || ! kill -0 "$kl_pid" 2>/dev/null; do sleep 0.5; done
ready || die "the nodes did not become Ready (see KEEP=DIR make k8s-demo: kubelet.log)"
K get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.memory

rule "helm install cephalo charts/cephalo (the operator's image runs the local cephalo-operator)"
port=$(free_port)
"$HELM" install cephalo charts/cephalo --namespace cephalo-system --create-namespace --wait --timeout 120s \
  --set operator.image.tag=demo --set worker.image.tag=demo --set operator.metrics.port="$port" \
  --set operator.restartBackoff.initial=2s >"$dir/helm.out" 2>&1 || { cat "$dir/helm.out" >&2; die "helm install failed"; }
sed -n '1,/^NOTES:/p' "$dir/helm.out" | grep -v '^NOTES:'
K get deployment,pods -n cephalo-system

rule "the claims (examples/k8s/storage.yaml) and shards on the data claim (examples/k8s/data-prep.yaml)"
K create namespace "$NS" >/dev/null
# the test control plane has no volume provisioner: two local volumes for the claims to bind to
for c in cephalo-data cephalo-checkpoints; do
  printf '{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"%s"},"spec":{"capacity":{"storage":"10Gi"},"accessModes":["ReadWriteMany"],"hostPath":{"path":"%s"},"claimRef":{"namespace":"%s","name":"%s"}}}' \
    "$c-pv" "$dir/kl/pvc/$c" "$NS" "$c"
done | K apply -f - >/dev/null
K apply -n "$NS" -f examples/k8s/storage.yaml
TEXT=/usr/share/games/fortunes
corpus=$(find "$TEXT" -maxdepth 1 -type f ! -name '*.dat' -size -900k | sort | head -1)
[ -n "$corpus" ] || die "no text in $TEXT (make deps installs the fortunes package)"
K create configmap corpus -n "$NS" --from-file=input.txt="$corpus"
sed "s#image: $WORKER_IMAGE:[^ ]*#image: $WORKER_IMAGE:demo#" examples/k8s/data-prep.yaml | K apply -n "$NS" -f -
phase() { K get "$@" -o jsonpath='{.status.phase}' 2>/dev/null; }
end=$((SECONDS + 600)) # until the pod ends (the kubelet's log of it says what it does meanwhile)
while [ $SECONDS -lt $end ]; do case $(phase pod cephalo-data-prep -n "$NS") in Succeeded|Failed) break ;; esac; sleep 0.5; done
[ "$(phase pod cephalo-data-prep -n "$NS")" = Succeeded ] || die "the data-prep pod did not succeed: $(cat "$dir"/kl/logs/"${NS}"_cephalo-data-prep_*.log 2>/dev/null)"
cat "$dir"/kl/logs/"${NS}"_cephalo-data-prep_*.log
ls -l "$dir/kl/pvc/cephalo-data/corpus"

rule "kubectl apply -f examples/jobs/cephalojob-cpu.yaml; kubectl get cephalojobs -w"
K apply -n "$NS" -f examples/jobs/cephalojob-cpu.yaml
t_job=$SECONDS
kubectl get cephalojobs -n "$NS" -w --request-timeout=0 &
watch_pid=$!
worker_metrics=''
while :; do
  p=$(phase cephalojob cpu-demo -n "$NS")
  case $p in Succeeded|Failed) break ;; esac
  [ $((SECONDS - t_job)) -lt "$TIMEOUT" ] || die "the job is still $p after $TIMEOUT s"
  if [ -z "$worker_metrics" ] && [ "$p" = Running ]; then # a worker's own numbers, while it trains
    ip=$(K get pod cpu-demo-0 -n "$NS" -o jsonpath='{.status.podIP}' 2>/dev/null || true)
    [ -n "$ip" ] && worker_metrics=$(curl -fsS --max-time 2 "http://$ip:9400/metrics" 2>/dev/null |
      grep -E '^cephalo_(train_(step|loss|samples_per_second|val_loss)|memory_bytes|checkpoint_step|plan_batch|step_seconds_(sum|count))' || true)
  fi
  sleep 1
done
sleep 1
kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null || true
watch_pid=''
echo
K get cephalojob cpu-demo -n "$NS" -o wide
[ "$(phase cephalojob cpu-demo -n "$NS")" = Succeeded ] ||
  die "the job failed: $(K get cephalojob cpu-demo -n "$NS" -o jsonpath='{.status.message}')"

rule "what the dashboard shows (charts/cephalo/dashboards/cephalo.json), from /metrics"
say "rank 0's worker (cephalo_train_*, while it trained):"
printf '%s\n' "${worker_metrics:-  (the job ended before rank 0 answered)}" | sed 's/^/  /'
say "the operator:"
curl -fsS --max-time 5 "http://127.0.0.1:$port/metrics" |
  grep -E '^cephalo_operator_(jobs|reconciles_total|plans_total|jobs_succeeded_total|jobs_restarted_total|pods_created_total|api_requests_total)' | sed 's/^/  /'
say "the job's status:"
K get cephalojob cpu-demo -n "$NS" -o json | $PY -c '
import json, sys
s = json.load(sys.stdin)["status"]
print("  step %d, loss %.4f, %s samples/s on %d GPUs (the %s plan predicts %.0f samples/s on the real GPUs), "
      "last checkpoint at step %d" % (s["step"], s["loss"], s["samplesPerSecondText"], s["plan"]["worldSize"],
      s["plan"]["strategy"], s["plan"]["predictedSamplesPerSecond"], s["lastCheckpointStep"]))'
K get cephalojob cpu-demo -n "$NS" -o jsonpath='{range .status.plan.ranks[*]}  rank {.rank} on {.node} ({.device}): batch {.batch} in {.microbatches} x {.microbatch}, state share {.stateRatio}{"\n"}{end}'
say "checkpoints on the claim: $(ls "$dir/kl/pvc/cephalo-checkpoints/cpu-demo" | tr '\n' ' ')"
rule "k8s-demo: the job Succeeded in $((SECONDS - t_job)) s ($((SECONDS - t0)) s in all)"
