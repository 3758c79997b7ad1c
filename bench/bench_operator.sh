#!/usr/bin/env bash
# make bench-operator: cephalo-operator at scale against the real test control plane
# (tests/k8s/apiserver.sh start --control-plane: etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager). tests/k8s/kubelet.py registers BENCH_OP_NODES GPU Nodes (a mix of
# products and counts, with GPU Feature Discovery labels) and runs the worker pods bound to them as
# bench/bench_operator_worker.sh (sleeps until SIGTERM, serves no /metrics: the operator then
# writes no progress status). BENCH_OP_JOBS CephaloJobs (tiny-gpt, spec.gpus.maxGPUs 2..8, all
# fitting at once) are created from 8 API connections at once (BENCH_OP_SUBMIT=kubectl: one
# `kubectl apply`, which takes seconds itself); bench/bench_operator.py watches them and
# their pods and measures (1) the time until every job has all its worker pods created, and all
# bound (spec.nodeName), target < 3 s, with the CPU seconds each process spent and the operator's
# API requests until then; then, once every job is Running and BENCH_OP_SETTLE seconds
# have passed, (2) the operator's own API requests over BENCH_OP_WINDOW seconds at rest (nothing
# changing), from its /metrics (cephalo_operator_api_requests_total{verb}): requests/s in total and
# per job, by verb, target < 0.05 per job (issue 17). Prints a table and writes
# runs/bench-operator/bench-DATE.json. Everything started is stopped on exit.
#
# Environment: OPERATOR (the binary, default build/rel/bin/cephalo-operator), BENCH_OP_NODES (300),
# BENCH_OP_JOBS (50), BENCH_OP_WINDOW (60 s), BENCH_OP_SETTLE (15 s), BENCH_OP_KUBELETS (2
# kubelet.py processes, each with a share of the nodes: each watches every pod, where a kubelet
# watches its node's, so each one more adds a watcher and a parse of every pod event on the cores
# the control plane shares), BENCH_OP_HEARTBEAT (10 s: how often each
# node's Lease is renewed, as a kubelet's; the node lifecycle controller taints a node after 40 s
# without one; the Ready condition is reported at start and every 5 minutes), BENCH_OP_TIMEOUT (180 s for the
# jobs to run), BENCH_OP_ROUNDS (1: how many times the start-up is measured, each round's jobs in
# a namespace of their own, started once the previous round's jobs are deleted and their pods gone;
# the report gives every round and the median), BENCH_OP_ARGS (more operator flags),
# BENCH_OP_SCHEDULER_ARGS (more kube-scheduler flags: its client's default rate limit, 50 requests
# a second after a burst of 100, one per pod bound, puts 247 pods bound at 2.9 s after the first
# bind at the earliest), KEEP_LOGS=DIR (copy the logs there).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
AS=tests/k8s/apiserver.sh
OP=${OPERATOR:-${BUILD:-build/rel}/bin/cephalo-operator}
PY=/usr/bin/python3
NODES=${BENCH_OP_NODES:-300}
JOBS=${BENCH_OP_JOBS:-50}
WINDOW=${BENCH_OP_WINDOW:-60}
SETTLE=${BENCH_OP_SETTLE:-15}
KUBELETS=${BENCH_OP_KUBELETS:-2}
HEARTBEAT=${BENCH_OP_HEARTBEAT:-10}
TIMEOUT=${BENCH_OP_TIMEOUT:-180}
ROUNDS=${BENCH_OP_ROUNDS:-1}
JNS=bench

for v in NODES JOBS WINDOW SETTLE KUBELETS HEARTBEAT TIMEOUT ROUNDS; do
  [[ ${!v} =~ ^[0-9]+$ ]] && [ "${!v}" -gt 0 ] || { echo "BENCH_OP_$v=${!v}: expected a positive integer"; exit 2; }
done
[ -x "$OP" ] || { echo "not built: $OP (make, or OPERATOR=...)"; exit 1; }
command -v kubectl >/dev/null || { echo "kubectl is not installed (make deps)"; exit 1; }
"$AS" built || { echo "the control plane is not built: run 'sudo tests/k8s/apiserver.sh build'"; exit 1; }
[ "$KUBELETS" -le "$NODES" ] || KUBELETS=$NODES

T0=$SECONDS
LOAD0=$(cut -d" " -f1-3 /proc/loadavg)
say() { echo "# $(printf '%4d' $((SECONDS - T0))) s  $*"; }
dir=$(mktemp -d /tmp/cephalo-bench-operator.XXXXXX)
op_pid='' watch_pid='' kl_pids=()
stop_pids() { # PID...: SIGTERM to all, SIGKILL to what is left after 10 s
  local p
  [ $# -gt 0 ] || return 0
  kill "$@" 2>/dev/null
  for _ in $(seq 1 100); do
    local alive=0
    for p in "$@"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 1 ] || break
    sleep 0.1
  done
  kill -9 "$@" 2>/dev/null
  for p in "$@"; do wait "$p" 2>/dev/null; done
}
cleanup() {
  trap - EXIT INT TERM
  [ -z "$watch_pid" ] || stop_pids "$watch_pid"
  [ -z "$op_pid" ] || stop_pids "$op_pid"
  # the kubelets stop their pods' processes; what is left (a kubelet killed) by the pid files
  [ ${#kl_pids[@]} = 0 ] || stop_pids "${kl_pids[@]}"
  for f in "$dir"/kl*/pids/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  "$AS" stop "$dir/k8s" >/dev/null 2>&1
  if [ -n "${KEEP_LOGS:-}" ]; then
    mkdir -p "$KEEP_LOGS" && cp "$dir"/*.log "$dir"/*.json "$dir"/*.txt "$dir"/jobs-*.yaml "$dir"/k8s/*.log "$KEEP_LOGS/" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the control plane and the CRD --------------------------------------------------------------
say "starting the control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager)"
exports=$(CEPHALO_K8S_SCHEDULER_ARGS=${BENCH_OP_SCHEDULER_ARGS:-} "$AS" start "$dir/k8s" --control-plane 2>"$dir/start.log") ||
  { sed 's/^/#   /' "$dir/start.log"; echo "the control plane did not start"; exit 1; }
eval "$exports"
export KUBECONFIG
K() { kubectl --request-timeout=30s "$@"; }
K apply -f charts/cephalo/crds/cephalojobs.cephalo.dev.yaml >/dev/null &&
  K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev >/dev/null ||
  { echo "the CRD was not established"; exit 1; }

# ---- the nodes: a mix of GPU products and counts, GPU Feature Discovery labels -----------------
# node i: the i % 10th of these (product, memory MiB, count): per 10 nodes 42 GPUs
MIX=("NVIDIA-L4 23034 1" "NVIDIA-L4 23034 2" "NVIDIA-L4 23034 4" "NVIDIA-A10G 23028 1"
     "NVIDIA-A10G 23028 4" "Tesla-T4 15360 4" "NVIDIA-A100-SXM4-80GB 81920 8"
     "NVIDIA-A100-SXM4-80GB 81920 8" "NVIDIA-H100-80GB-HBM3 81559 8" "NVIDIA-L40S 46068 2")
declare -a kl_nodes kl_args
gpus=0
for ((i = 0; i < NODES; i++)); do
  name=$(printf 'bench-node-%04d' "$i")
  read -r prod mem cnt <<<"${MIX[i % 10]}"
  gpus=$((gpus + cnt))
  k=$((i % KUBELETS))
  kl_nodes[k]+="${kl_nodes[k]:+,}$name"
  kl_args[k]+=" --node-gpus $name=$cnt --node-label $name:nvidia.com/gpu.product=$prod"
  kl_args[k]+=" --node-label $name:nvidia.com/gpu.memory=$mem --node-label $name:nvidia.com/gpu.count=$cnt"
done
ipbase=$((20 + RANDOM % 200))  # pod IPs 127.B.x.y, B per kubelet: parallel runs do not collide
say "registering $NODES nodes ($gpus GPUs) through $KUBELETS kubelet.py processes, heartbeat ${HEARTBEAT}s"
for ((k = 0; k < KUBELETS; k++)); do
  # shellcheck disable=SC2086 # kl_args holds words without spaces
  $PY tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" \
    --nodes "${kl_nodes[k]}" --register ${kl_args[k]} --heartbeat "$HEARTBEAT" \
    --first-ip "127.$(((ipbase + k) % 250 + 2)).0.1" --worker bench/bench_operator_worker.sh \
    --work "$dir/kl$k" 2>"$dir/kubelet$k.log" &
  kl_pids+=($!)
done
# node_state: "READY UNTAINTED TOTAL" (Ready=True; no taint at all: the not-ready taint is gone)
node_state() {
  K get nodes -o json 2>/dev/null | $PY -c 'import json, sys
items = json.load(sys.stdin)["items"]
ready = [n for n in items if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))]
print(len(ready), sum(1 for n in ready if not n["spec"].get("taints")), len(items))'
}
deadline=$((SECONDS + 300))
while :; do
  read -r ready clean total <<<"$(node_state)"
  [ "${clean:-0}" = "$NODES" ] && break
  if [ $SECONDS -ge $deadline ]; then
    echo "the nodes did not all become Ready and untainted in 300 s: $ready Ready, $clean untainted, $total registered"
    exit 1
  fi
  sleep 3
done
say "$NODES nodes Ready, untainted"

# ---- the operator ---------------------------------------------------------------------------------
port=$($PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
M="http://127.0.0.1:$port"
# shellcheck disable=SC2086 # BENCH_OP_ARGS: flags split on spaces
"$OP" --kubeconfig "$KUBECONFIG" --metrics-addr "127.0.0.1:$port" --leader-elect=false --log-level info \
  --worker-image registry.test/cephalo-worker:1 ${BENCH_OP_ARGS:-} >"$dir/operator.log" 2>&1 &
op_pid=$!
for _ in $(seq 1 300); do curl -fsS "$M/readyz" >/dev/null 2>&1 && break; kill -0 "$op_pid" 2>/dev/null || break; sleep 0.1; done
curl -fsS "$M/readyz" >/dev/null 2>&1 || { echo "the operator did not become ready"; tail -5 "$dir/operator.log"; exit 1; }
# read whole, then searched: `curl | grep -q` fails under pipefail when grep stops reading first
metrics=$(curl -fsS "$M/metrics")
grep -q '^cephalo_operator_api_requests_total{' <<<"$metrics" ||
  { echo "$OP exports no cephalo_operator_api_requests_total on /metrics: nothing to measure"; exit 1; }
say "operator $OP ready (metrics on $M)"

# ---- the jobs: one kubectl apply, watched ---------------------------------------------------------
# what the start-up costs each process, until every pod is bound
cpu_args=(--cpu "operator=$op_pid")
for c in etcd apiserver scheduler controller-manager; do
  [ -f "$dir/k8s/$c.pid" ] && cpu_args+=(--cpu "$c=$(cat "$dir/k8s/$c.pid")")
done
for p in "${kl_pids[@]}"; do cpu_args+=(--cpu "kubelet.py=$p"); done
# pods_left NS: how many pods NS still has
pods_left() { K get pods -n "$1" -o name 2>/dev/null | wc -l; }
timings=()
for ((round = 1; round <= ROUNDS; round++)); do
  ns=$JNS
  [ "$ROUNDS" = 1 ] || ns=$JNS-$round
  K create namespace "$ns" >/dev/null || exit 1
  gpus_asked=0
  for ((j = 0; j < JOBS; j++)); do
    g=$((2 + j % 7))
    gpus_asked=$((gpus_asked + g))
    printf -- '---\n{"apiVersion": "cephalo.dev/v1alpha1", "kind": "CephaloJob", "metadata": {"name": "bench-%03d", "namespace": "%s"}, "spec": {"model": {"name": "tiny-gpt"}, "data": {"path": "synthetic"}, "seqLen": 64, "globalBatch": 32, "steps": 1000000, "gpus": {"maxGPUs": %d}, "terminationGracePeriodSeconds": 5}}\n' \
      "$j" "$ns" "$g"
  done >"$dir/jobs-$round.yaml"
  [ "$gpus_asked" -le "$gpus" ] || say "warning: the jobs ask for $gpus_asked GPUs, the nodes have $gpus: not all fit at once"
  say "round $round of $ROUNDS: applying $JOBS CephaloJobs ($gpus_asked GPUs) in namespace $ns; waiting until every job is Running (at most $TIMEOUT s)"
  $PY bench/bench_operator.py watch --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" \
    --namespace "$ns" --jobs-file "$dir/jobs-$round.yaml" --out "$dir/timings-$round.json" --timeout "$TIMEOUT" \
    --submit "${BENCH_OP_SUBMIT:-parallel}" --metrics "$M/metrics" "${cpu_args[@]}" \
    2> >(sed 's/^/    /' >&2) &
  watch_pid=$!
  wait "$watch_pid"
  wrc=$?
  watch_pid=
  [ -f "$dir/timings-$round.json" ] || { echo "the watcher failed (exit $wrc)"; exit 1; }
  timings+=("$dir/timings-$round.json")
  if [ "$wrc" != 0 ]; then
    say "warning: not every job was Running within $TIMEOUT s"
  else
    say "every job Running"
  fi
  [ "$round" -lt "$ROUNDS" ] || break
  # the next round starts on an empty cluster: the jobs deleted, their pods gone (garbage collector)
  K delete cephalojobs --all -n "$ns" --wait=false >/dev/null || exit 1
  deadline=$((SECONDS + 120))
  while [ "$(pods_left "$ns")" != 0 ]; do
    [ $SECONDS -lt $deadline ] || { echo "round $round: the pods of namespace $ns were not all gone in 120 s"; exit 1; }
    sleep 1
  done
  say "round $round: its jobs deleted and their pods gone"
done

# ---- at rest -----------------------------------------------------------------------------------------
cpu_s() { # PID: user + system CPU seconds so far
  awk -v hz="$(getconf CLK_TCK)" '{print ($14 + $15) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0
}
ap_pid=$(cat "$dir/k8s/apiserver.pid")
say "settling ${SETTLE}s, then counting the operator's requests for ${WINDOW}s"
sleep "$SETTLE"
curl -fsS "$M/metrics" >"$dir/metrics0.txt" || { echo "cannot read $M/metrics"; exit 1; }
op_cpu0=$(cpu_s "$op_pid") ap_cpu0=$(cpu_s "$ap_pid") t_w0=$(date +%s.%N)
sleep "$WINDOW"
curl -fsS "$M/metrics" >"$dir/metrics1.txt" || { echo "cannot read $M/metrics"; exit 1; }
op_cpu1=$(cpu_s "$op_pid") ap_cpu1=$(cpu_s "$ap_pid") t_w1=$(date +%s.%N)
read -r ready clean total <<<"$(node_state)"
[ "$clean" = "$NODES" ] || say "warning: $((NODES - clean)) nodes not Ready or tainted at the end (heartbeats too slow?)"
kill -0 "$op_pid" 2>/dev/null || { echo "the operator exited"; tail -5 "$dir/operator.log"; exit 1; }

mkdir -p runs/bench-operator
OUT=runs/bench-operator/bench-$(date +%Y%m%d-%H%M%S).json
$PY - "$dir/params.json" <<EOF
import json, sys
json.dump({"date": "$(date -u +%FT%TZ)", "operator": "$OP", "operator_args": "${BENCH_OP_ARGS:-}",
           "nodes": $NODES, "gpus": $gpus, "gpu_mix": "$(printf '%s; ' "${MIX[@]}" | sed 's/; $//')",
           "kubelets": $KUBELETS, "heartbeat_s": $HEARTBEAT, "jobs": $JOBS, "settle_s": $SETTLE, "timeout_s": $TIMEOUT,
           "cores": $(nproc), "loadavg_start": "$LOAD0", "loadavg_end": "$(cut -d' ' -f1-3 /proc/loadavg)",
           "nodes_ready_untainted_end": ${clean:-0},
           "operator_cpu_s": round($op_cpu1 - $op_cpu0, 2), "apiserver_cpu_s": round($ap_cpu1 - $ap_cpu0, 2),
           "bench_s": $((SECONDS - T0))}, open(sys.argv[1], "w"), indent=1)
EOF
window=$(awk -v a="$t_w0" -v b="$t_w1" 'BEGIN {printf "%.3f", b - a}')
$PY bench/bench_operator.py report --before "$dir/metrics0.txt" --after "$dir/metrics1.txt" \
  --window "$window" --timings "${timings[@]}" --params "$dir/params.json" --json "$OUT"
