#!/usr/bin/env bash
# Worker pods placed by kube-scheduler (docs/operator.md, "Placement"), end to end on the whole test
# control plane (tests/k8s/apiserver.sh start --control-plane: etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager) with tests/k8s/kubelet.py registering three mixed GPU Nodes (s-a: 2 L4,
# s-b: 1 A10G, s-c: 1 L4), heartbeating them and running what is bound there (worker pods as local
# `cephalo-worker --device cpu` processes, other pods as their command). Checks:
#  * taints: a job is planned around a node tainted against it (the note names the taint); a job
#    whose only nodes are tainted against it cannot plan (NoGPUs, naming the taint), one that
#    tolerates the taint runs there, and the taint removed, the first job plans and trains;
#  * the scheduler refusing what the accounting thinks is free (a node whose allocatable pods
#    are 0: "Too many pods"): the job says why (Restarting, reason Unschedulable; a Warning Event
#    naming the pod, its node and the scheduler's message), its gangs come 5 s, 10 s, 20 s apart
#    (no hot loop; the count in the plan ConfigMap's annotation), none counted against
#    backoffLimit 0; the node's pods restored, the next gang runs to the end and the count is
#    cleared;
#  * a GPU taken between planning and binding: with kube-scheduler stopped (SIGSTOP), a job's two
#    pods wait unbound; a foreign pod pinned to their node by nodeName takes one of the GPUs
#    (kubelet.py runs it); once the scheduler resumes, the job is re-planned around the foreign
#    pod (on the scheduler's refusal, or on seeing the pod, whichever comes first), says why,
#    is not failed (backoffLimit 0) and trains to the end;
#  * two jobs on a cluster that fits one: the second waits Queued (Admitted False, naming the GPUs
#    it waits for) while the first trains, starts when it succeeds, and both end Succeeded;
#  * minGPUs: a job starts on the GPUs another job leaves free, grows onto all of them once that
#    job ends (one re-plan, not before spec.elastic.minReplanSeconds), resumes from its checkpoint
#    and succeeds;
#  * a watcher (tests/k8s/gpuwatch.py) checks at every second that the GPU requests of the
#    non-terminal pods bound to a node, or pinned to it by affinity, stay within its allocatable
#    (paused while the test itself over-books s-a with the foreign pod, until the job has moved).
# About 2 minutes on 2 cores. Everything started is stopped on exit; KEEP_LOGS=DIR keeps the logs.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
AS=tests/k8s/apiserver.sh
OP=${BUILD:-build/rel}/bin/cephalo-operator
WORKER=$(pod_worker) # tests/cli/lib.sh: under SAN=1 the release worker, the operator sanitized
PY=/usr/bin/python3

skip_all() { echo "# test_operator_sched.sh: skipped: $*"; exit 0; }
[ -x "$OP" ] && [ -x "$WORKER" ] || skip_all "$OP or $WORKER is not built (make)"
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
"$AS" built || skip_all "the control plane is not built: run 'sudo tests/k8s/apiserver.sh build'"

dir=$(mktemp -d /tmp/cephalo-operator-sched.XXXXXX)
op_pid= kl_pid= watch_pid= sched_pid=
stop_pid() { # PID: SIGTERM, SIGKILL after 10 s
  [ -n "$1" ] || return 0
  kill "$1" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
cleanup() {
  [ -n "$sched_pid" ] && kill -CONT "$sched_pid" 2>/dev/null
  [ -z "$watch_pid" ] || { touch "$dir/gpuwatch.stop"; stop_pid "$watch_pid"; }
  stop_pid "$kl_pid"
  for f in "$dir"/kl/pids/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  stop_pid "$op_pid"
  "$AS" stop "$dir/k8s" >/dev/null 2>&1
  if [ -n "${KEEP_LOGS:-}" ]; then
    mkdir -p "$KEEP_LOGS" && cp -r "$dir"/*.log "$dir/kl/logs" "$dir"/k8s/*.log "$KEEP_LOGS/" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
t_start=$SECONDS
exports=$("$AS" start "$dir/k8s" --control-plane 2>"$dir/start.log") || {
  sed 's/^/#   /' "$dir/start.log"; echo "not ok 1 - the control plane starts"; exit 0; }
eval "$exports"
export KUBECONFIG
K() { kubectl --request-timeout=20s "$@"; }
jp() { K get "$1" "$2" -o jsonpath="$3" 2>/dev/null; }
phase_is() { [ "$(jp cephalojob "$1" '{.status.phase}')" = "$2" ]; }
pod_phases() { K get pods -l "cephalo.dev/job=$1" -o jsonpath='{range .items[*]}{.status.phase} {end}' 2>/dev/null; }
all_pods() { # JOB N PHASE: exactly N pods, all in PHASE
  local p; p=$(pod_phases "$1")
  [ "$(wc -w <<<"$p")" = "$2" ] && [ -z "$(tr ' ' '\n' <<<"$p" | grep -v "^$3\$" | grep -v '^$')" ]
}
untainted() { # the nodes NAME... exist, Ready, without taints (the scheduler places pods there)
  local n
  for n in "$@"; do
    [ "$(K get node "$n" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}/{.spec.taints}' 2>/dev/null)" = "True/" ] || return 1
  done
}
event() { K get events --field-selector "involvedObject.name=$1,reason=$2" -o jsonpath='{.items[*].message}' 2>/dev/null; }
# trained JOB STEPS: every worker log of the job's current pods reached step STEPS (retried: a
# kubectl call the loaded API server answers late must not read as a worker that stopped short)
trained() {
  local n u c=0 w=0
  while read -r n u; do
    [ -n "$n" ] || continue
    w=$((w + 1))
    grep -q "^step $2/$2 " "$dir/kl/logs/default_${n}_${u:0:8}.log" 2>/dev/null && c=$((c + 1))
  done < <(K get pods -l "cephalo.dev/job=$1" -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}')
  [ "$w" -gt 0 ] && [ "$c" = "$w" ]
}

# ---- the cluster: CRD, three GPU nodes registered by the kubelet, the operator -------------------
K apply -f crds/cephalojobs.cephalo.dev.yaml >/dev/null 2>&1
K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev >/dev/null 2>&1
K create namespace other >/dev/null
$PY tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" --nodes s-a,s-b,s-c \
  --register --node-gpus s-a=2 --node-gpus s-b=1 --node-gpus s-c=1 --heartbeat 5 \
  --node-label s-a:nvidia.com/gpu.product=NVIDIA-L4 --node-label s-a:nvidia.com/gpu.memory=23034 \
  --node-label s-b:nvidia.com/gpu.product=NVIDIA-A10G --node-label s-b:nvidia.com/gpu.memory=23028 \
  --node-label s-c:nvidia.com/gpu.product=NVIDIA-L4 --node-label s-c:nvidia.com/gpu.memory=23034 \
  --first-ip "127.0.$((RANDOM % 240 + 10)).1" --worker "$WORKER" --work "$dir/kl" --extra-arg=--device \
  --extra-arg=cpu --extra-arg=--threads --extra-arg=1 2>"$dir/kubelet.log" &
kl_pid=$!
assert "the kubelet registers 3 GPU nodes; they become Ready and lose the not-ready taint" wait_for 60 untainted s-a s-b s-c
: >"$dir/overbooked"
$PY tests/k8s/gpuwatch.py "$dir/overbooked" "$dir/gpuwatch.stop" "$dir/gpuwatch.pause" &
watch_pid=$!
"$OP" --kubeconfig "$KUBECONFIG" --metrics-addr 0 --leader-elect=false --log-level info \
  --worker-image registry.test/cephalo-worker:1 >"$dir/op.log" 2>&1 &
op_pid=$!
job() { # NAME STEPS [SPEC-LINES...]: tiny-gpt, seq 64, batch 8
  local name=$1 steps=$2
  shift 2
  printf 'apiVersion: cephalo.dev/v1alpha1\nkind: CephaloJob\nmetadata: {name: %s}\nspec:\n  model: {name: tiny-gpt}\n  seqLen: 64\n  globalBatch: 8\n  steps: %s\n  data: {path: synthetic}\n  optimizer: {lr: 0.003, warmup: 5}\n  commTimeout: 60\n' "$name" "$steps"
  local l
  for l in "$@"; do printf '  %s\n' "$l"; done
}

# ---- taints: planned around; NoGPUs naming the taint; tolerations -----------------------------
K taint node s-c cephalo.dev/test=refuse:NoSchedule >/dev/null
job taint-only 10 'gpus: {nodeSelector: {kubernetes.io/hostname: s-c}}' | K apply -f - >/dev/null
assert "a job whose only node is tainted against it cannot plan: NoGPUs, the message names the taint" wait_for 30 bash -c \
  "kubectl get cephalojob taint-only -o jsonpath='{.status.phase} {.status.conditions[?(@.type==\"Failed\")].reason} {.status.message}' | grep -q '^Failed NoGPUs .*node s-c has the taint cephalo.dev/test=refuse:NoSchedule, which spec.tolerations does not tolerate'"
check "... and it has no pods" 0 "" -- pod_phases taint-only
job tolerant 10 'gpus: {nodeSelector: {kubernetes.io/hostname: s-c}}' \
  'tolerations: [{key: cephalo.dev/test, operator: Equal, value: refuse, effect: NoSchedule}]' | K apply -f - >/dev/null
assert "a job tolerating the taint is placed on s-c by the scheduler and trains to the end" wait_moving 60 "$dir/kl/logs/*" phase_is tolerant Succeeded
check "... its pod was bound to s-c" 0 "s-c" -- jp pod tolerant-0 '{.spec.nodeName}'
K delete cephalojob tolerant >/dev/null
job around 10 | K apply -f - >/dev/null
assert "a job that may use any node is planned around the tainted one and trains to the end" wait_moving 60 "$dir/kl/logs/*" phase_is around Succeeded
check "... its plan's notes name the taint" 0 "" -- bash -c \
  "kubectl get configmap around-plan -o json | grep -q 'node s-c has the taint cephalo.dev/test=refuse:NoSchedule'"
check "... and none of its pods is on s-c" 0 "" -- bash -c \
  "! kubectl get pods -l cephalo.dev/job=around -o jsonpath='{.items[*].spec.nodeName}' | grep -q s-c"
K delete cephalojob around >/dev/null
K taint node s-c cephalo.dev/test- >/dev/null
assert "the taint removed, the job that could not plan plans on s-c and trains to the end" wait_moving 60 "$dir/kl/logs/*" phase_is taint-only Succeeded
K delete cephalojob taint-only >/dev/null
wait_for 30 bash -c "[ -z \"\$(kubectl get pods -o name 2>/dev/null)\" ]"

# ---- the scheduler refusing what the accounting thinks is free: Unschedulable, backoff --------
# s-c takes no more pods (allocatable pods 0; the accounting counts GPUs only): every gang is
# refused with "Too many pods". kubelet.py's heartbeats patch the conditions only, so this stays.
node_pods() { K patch node s-c --subresource=status --type=merge -p "{\"status\":{\"allocatable\":{\"pods\":\"$1\"}}}" >/dev/null; }
node_pods 0
job refused 40 'gpus: {nodeSelector: {kubernetes.io/hostname: s-c}}' 'backoffLimit: 0' | K apply -f - >/dev/null
assert "a job whose pod the scheduler refuses says so: Restarting, reason Unschedulable" wait_for 30 bash -c \
  "[ \"\$(kubectl get cephalojob refused -o jsonpath='{.status.phase} {.status.conditions[?(@.type==\"Restarting\")].reason}')\" = 'Restarting Unschedulable' ]"
check "... a Warning Event names the pod, its node and the scheduler's message" 0 "" -- bash -c \
  "$(declare -f K event); event refused Unschedulable | grep -E 'worker pod refused-0 \\(rank 0, planned on node s-c\\) cannot be scheduled: 0/3 nodes are available: .*Too many pods.*; the gang is stopped and planned again on the GPUs free now \\(its GPU may have been taken after planning; not counted against backoffLimit\\), the next gang in 5 s at the earliest \\(refusal 1 in a row; 5 s doubling to 300 s\\)'"
assert "... while it waits, the status says when the next gang comes" wait_for 20 bash -c \
  "kubectl get cephalojob refused -o jsonpath='{.status.message}' | grep -q 'the scheduler refused a worker pod of the last gang (refusal [0-9] in a row): the next gang is created in [0-9]* s'"
sleep 14
refusals() { jp configmap refused-plan '{.metadata.annotations.cephalo\.dev/unschedulable}' | cut -d' ' -f1; }
r=$(refusals)
check "no hot loop: about 20 s of refusals made 2 or 3 gangs (5 s, 10 s, 20 s apart), not hundreds" 0 "" -- \
  test "${r:-0}" -ge 2 -a "${r:-0}" -le 3
check "... counted in the plan ConfigMap's annotation, not against backoffLimit 0" 0 "Restarting restarts=0" -- \
  jp cephalojob refused '{.status.phase} restarts={.status.restarts}'
node_pods 110
assert "s-c's pods restored, the next gang (after its backoff) is placed and the job trains to the end" wait_moving 60 "$dir/kl/logs/*" phase_is refused Succeeded
check "... the backoff is cleared once a gang ran" 0 "none" -- bash -c \
  "v=\$(kubectl get configmap refused-plan -o jsonpath='{.metadata.annotations.cephalo\\.dev/unschedulable}'); echo \${v:-none}"
assert "... and its worker reached step 40" wait_for 20 trained refused 40

# ---- a GPU taken between planning and binding ----------------------------------------------------
# the operator sees a foreign pod it could not count at planning time either when the scheduler
# refuses a worker (Unschedulable) or when the pod shows up in its accounting, whichever comes
# first: both re-plan the job around it; the job never fails for it
sched_pid=$(cat "$dir/k8s/scheduler.pid")
kill -STOP "$sched_pid"
job grab 200 'gpus: {maxGPUs: 2}' 'backoffLimit: 0' | K apply -f - >/dev/null
unbound() { # JOB N: N pods, none bound
  [ "$(K get pods -l "cephalo.dev/job=$1" -o jsonpath='{range .items[*]}{.metadata.name}={.spec.nodeName};{end}' 2>/dev/null |
       tr ';' '\n' | grep -c '=$')" = "$2" ]
}
assert "with the scheduler stopped, a job's 2 worker pods wait unbound" wait_for 30 unbound grab 2
check "... planned on s-a's 2 L4s" 0 "s-a s-a" -- jp cephalojob grab '{.status.plan.ranks[*].node}'
# the test over-books s-a itself here (the intruder on GPUs the job's unbound pods hold): the watcher
# judges again once the operator has moved the job
touch "$dir/gpuwatch.pause"
printf '%s\n' 'apiVersion: v1' 'kind: Pod' 'metadata: {name: intruder, namespace: other}' 'spec:' '  nodeName: s-a' \
  '  restartPolicy: Never' \
  '  containers: [{name: c, image: registry.test/sleep:1, command: [sleep, "3600"], resources: {limits: {nvidia.com/gpu: "1"}}}]' |
  K apply -f - >/dev/null
assert "a foreign pod pinned by nodeName to s-a takes one of its GPUs (the kubelet runs it)" wait_for 30 bash -c \
  "[ \"\$(kubectl -n other get pod intruder -o jsonpath='{.status.phase}')\" = Running ]"
kill -CONT "$sched_pid"
sched_pid=
placed() { # JOB NODES...: the job's current plan and its bound pods are on NODES (sorted)
  local want="$2" plan pods
  plan=$(jp cephalojob "$1" '{.status.plan.ranks[*].node}')
  pods=$(K get pods -l "cephalo.dev/job=$1" -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' | sort | xargs)
  [ "$plan" = "$want" ] && [ "$pods" = "$want" ]
}
assert "the job is re-planned around the foreign pod: the scheduler binds it to s-a and s-b" wait_for 60 placed grab "s-a s-b"
placed grab "s-a s-b" >/dev/null 2>&1 ||
  { # what to look at when it was not (the job's status, its pods, the operator's last words)
    jp cephalojob grab '{.status.phase} {.status.message} plan={.status.plan.ranks[*].node}'
    K get pods -l cephalo.dev/job=grab -o jsonpath='{range .items[*]}{.metadata.name} {.spec.nodeName} {.status.phase} {.status.reason}{"\n"}{end}'
    tail -n 15 "$dir/op.log"
  } 2>&1 | sed 's/^/#   /'
rm -f "$dir/gpuwatch.pause"
check "... saying why (an Unschedulable or a Replanned event)" 0 "" -- bash -c \
  "$(declare -f K event); event grab Unschedulable | grep -q 'planned on node s-a) cannot be scheduled' || event grab Replanned | grep -q 'the usable GPUs changed'"
assert "... and trains to the end (Succeeded)" wait_moving 60 "$dir/kl/logs/*" phase_is grab Succeeded
check "... never counted against backoffLimit 0, one re-plan" 0 "restarts=0 replans=1" -- \
  jp cephalojob grab 'restarts={.status.restarts} replans={.status.replans}'
assert "... both workers reached step 200" wait_for 20 trained grab 200
check "the foreign pod ran on undisturbed" 0 "Running" -- K -n other get pod intruder -o jsonpath='{.status.phase}'
K -n other delete pod intruder --wait=false >/dev/null
assert "... and is gone when deleted (the kubelet ends it)" wait_for 30 bash -c "! kubectl -n other get pod intruder >/dev/null 2>&1"

# ---- two jobs, a cluster that fits one -----------------------------------------------------------
job first 400 | K apply -f - >/dev/null
assert "a job takes the whole cluster (4 GPUs) and runs" wait_for 60 bash -c \
  "[ \"\$(kubectl get cephalojob first -o jsonpath='{.status.phase} {.status.plan.worldSize}')\" = 'Running 4' ]"
sleep 1.1 # a later creationTimestamp
job second 40 | K apply -f - >/dev/null
assert "a second job waits (Queued)" wait_for 30 phase_is second Queued
check "... Admitted False, naming the GPUs it waits for" 0 "False WaitingForGPUs needs 4 GPUs (3 L4, 1 A10G) of its plan; 0 free" -- \
  jp cephalojob second '{.status.conditions[?(@.type=="Admitted")].status} {.status.conditions[?(@.type=="Admitted")].reason} {.status.conditions[?(@.type=="Admitted")].message}'
check "... with no pods" 0 "0" -- bash -c "kubectl get pods -l cephalo.dev/job=second -o name | wc -l"
assert "the first job trains to the end (Succeeded)" wait_moving 60 "$dir/kl/logs/*" phase_is first Succeeded
assert "... every worker reached step 400" wait_for 20 trained first 400
assert "the second then starts on the 4 GPUs" wait_for 60 bash -c \
  "[ \"\$(kubectl get cephalojob second -o jsonpath='{.status.conditions[?(@.type==\"Admitted\")].status} {.status.plan.worldSize}')\" = 'True 4' ]"
assert "... and trains to the end (Succeeded)" wait_moving 60 "$dir/kl/logs/*" phase_is second Succeeded
assert "... every worker reached step 40" wait_for 20 trained second 40

# ---- minGPUs: start on what is free, grow when the other job ends ---------------------------------
job holder 300 'gpus: {maxGPUs: 2}' | K apply -f - >/dev/null
assert "a job holds s-a's 2 GPUs" wait_for 60 bash -c \
  "[ \"\$(kubectl get cephalojob holder -o jsonpath='{.status.phase} {.status.plan.ranks[*].node}')\" = 'Running s-a s-a' ]"
MIN_REPLAN=8
job elastic 1200 'gpus: {minGPUs: 1}' "elastic: {minReplanSeconds: $MIN_REPLAN}" \
  "checkpoint: {dir: $dir/ckpt/elastic, every: 10}" | K apply -f - >/dev/null
assert "a job with minGPUs 1 starts on the 2 GPUs left (s-b, s-c)" wait_for 60 bash -c \
  "[ \"\$(kubectl get cephalojob elastic -o jsonpath='{.status.phase} {.status.plan.ranks[*].node}')\" = 'Running s-b s-c' ]"
assert "the holder ends (Succeeded)" wait_moving 60 "$dir/kl/logs/*" phase_is holder Succeeded
assert "the elastic job grows onto all 4 GPUs and runs" wait_for 90 bash -c \
  "[ \"\$(kubectl get cephalojob elastic -o jsonpath='{.status.phase} {.status.plan.worldSize}')\" = 'Running 4' ]"
check "... one re-plan, no restart counted" 0 "replans=1 restarts=0" -- \
  jp cephalojob elastic 'replans={.status.replans} restarts={.status.restarts}'
check "... with a Replanned event" 0 "re-planned on 4 GPUs (the usable GPUs changed)" -- event elastic Replanned
check "... not before spec.elastic.minReplanSeconds ($MIN_REPLAN s) after it was planned" 0 "waited ok" -- $PY -c '
import datetime, json, subprocess, sys
ev = json.loads(subprocess.run(["kubectl", "get", "events", "--field-selector", "involvedObject.name=elastic", "-o", "json"],
                               capture_output=True, text=True).stdout)["items"]
t = {e["reason"]: datetime.datetime.fromisoformat(e["firstTimestamp"].replace("Z", "+00:00")) for e in ev}
waited = (t["Replanned"] - t["Planned"]).total_seconds()
assert waited >= int(sys.argv[1]) - 1, waited  # timestamps in whole seconds
print("waited ok")' "$MIN_REPLAN"
resumed() { # the 4 current workers resumed from a checkpoint of a step > 0
  local n u c=0
  while read -r n u; do
    [ -n "$n" ] && grep -q 'resumed from .* at step [1-9]' "$dir/kl/logs/default_${n}_${u:0:8}.log" 2>/dev/null && c=$((c + 1))
  done < <(K get pods -l cephalo.dev/job=elastic -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}')
  [ "$c" = 4 ]
}
assert "... the 4 new workers resume from the 2-rank checkpoint" wait_for 30 resumed
assert "... and train to the end (Succeeded)" wait_moving 60 "$dir/kl/logs/*" phase_is elastic Succeeded
assert "... every worker reached step 1200" wait_for 20 trained elastic 1200
check "... with exactly one re-plan" 0 "replans=1" -- jp cephalojob elastic 'replans={.status.replans}'

# ---- at every moment, no GPU booked twice ---------------------------------------------------------
touch "$dir/gpuwatch.stop"
wait "$watch_pid"; watch_pid=
check "no node's GPUs were ever over-booked (bound and affinity-pinned pods' requests <= allocatable)" 0 "gpus ok" -- \
  bash -c "[ ! -s '$dir/overbooked' ] && [ \"\$(cat '$dir/overbooked.polls')\" -gt 30 ] && echo gpus ok || { cat '$dir/overbooked'; cat '$dir/overbooked.polls'; }"
assert "the operator never exited" kill -0 "$op_pid"
check "every line of the operator's log carries the timestamp and the level" 0 "log ok" -- $PY - "$dir/op.log" <<'PY'
import re, sys
form = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ (debug|info|warn|error) \S')
bad = [l for l in open(sys.argv[1]).read().splitlines() if not form.match(l)]
assert not bad, bad[:5]
print('log ok')
PY
echo "# $((SECONDS - t_start)) s"
