#!/usr/bin/env bash
# Two cephalo-operator replicas, one leader (docs/operator.md, "Leader election and the fence"), on
# the whole test control plane (tests/k8s/apiserver.sh start --control-plane, with the API
# server's audit log: CEPHALO_K8S_AUDIT=1) and six GPU nodes kept by tests/k8s/kubelet.py, whose
# worker pods sleep (bench/bench_operator_worker.sh). Every write the API server accepted is read
# back from its audit log, attributed to a replica by the User-Agent that names it. Checks:
#  * fencing: the leader is stopped (SIGSTOP) in the middle of bringing jobs up for longer than
#    the lease; the standby takes over, brings those jobs up and new ones; the old leader resumed
#    (SIGCONT) sends not one write, says why and exits (a write already past the fence when it
#    stopped may land: the client reports it with the time it passed, which must precede the stop);
#  * the same with the Lease deleted by hand while the leader is stopped: the standby creates it
#    only after it has been missing for a lease duration, then leads;
#  * the Lease deleted by hand while the leader runs: it stops leading at its next renewal and
#    none of its writes lands after the new leader's first one (never two leaders);
#  * partial gangs: the jobs the stopped leader left with some of their pods get the missing ones
#    from the new leader, none of the existing pods deleted or recreated;
#  * a graceful stop (SIGTERM): the time to exit and the standby's takeover, printed (the Lease is
#    released: the standby needs at most a retry period, never a lease duration);
#  * waking: a job that may use the node of a job restarting its gang (the scheduler refused it,
#    so it waits 5 s) waits behind it (Queued), and is woken once that gang is created: its pods
#    follow within seconds (the figure printed), not at the next full re-check.
# Lease 6 s, renew deadline 4 s, retry 1 s. About 2 minutes on 2 cores. Everything started is
# stopped on exit; KEEP_LOGS=DIR keeps the logs and the audit log.
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
AS=tests/k8s/apiserver.sh
OP=${BUILD:-build/rel}/bin/cephalo-operator
PY=/usr/bin/python3

skip_all() { echo "# test_operator_ha.sh: skipped: $*"; exit 0; }
[ -x "$OP" ] || skip_all "$OP is not built (make)"
command -v kubectl >/dev/null || skip_all "kubectl is not installed (make deps)"
"$AS" built || skip_all "the control plane is not built: run 'sudo tests/k8s/apiserver.sh build'"

dir=$(mktemp -d /tmp/cephalo-operator-ha.XXXXXX)
kl_pid=
declare -A op_pid op_port
stop_pid() { # PID: SIGCONT, SIGTERM, SIGKILL after 10 s
  [ -n "$1" ] || return 0
  kill -CONT "$1" 2>/dev/null; kill "$1" 2>/dev/null
  for _ in $(seq 1 100); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$1" 2>/dev/null
  wait "$1" 2>/dev/null
}
cleanup() {
  local r
  for r in "${!op_pid[@]}"; do stop_pid "${op_pid[$r]:-}"; done
  stop_pid "$kl_pid"
  "$AS" stop "$dir/k8s" >/dev/null 2>&1
  if [ -n "${KEEP_LOGS:-}" ]; then
    mkdir -p "$KEEP_LOGS" && cp "$dir"/*.log "$dir"/k8s/*.log "$KEEP_LOGS/" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
exports=$(CEPHALO_K8S_AUDIT=1 "$AS" start "$dir/k8s" --control-plane 2>"$dir/start.log") || {
  sed 's/^/#   /' "$dir/start.log"; echo "not ok 1 - the control plane starts"; exit 0; }
eval "$exports"
export KUBECONFIG
AUDIT=$dir/k8s/audit.log
K() { kubectl --request-timeout=20s "$@"; }
jp() { K get "$1" "$2" -o jsonpath="$3" 2>/dev/null; }
holder() { jp lease cephalo-operator '{.spec.holderIdentity}'; }
holder_is() { [ "$(holder)" = "$1" ]; }
now() { date +%s.%N; }
free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start_op() { # NAME: a replica with POD_NAME=NAME (its Lease identity and User-Agent)
  op_port[$1]=$(free_port)
  POD_NAME=$1 "$OP" --kubeconfig "$KUBECONFIG" --metrics-addr "127.0.0.1:${op_port[$1]}" --log-level info \
    --worker-image registry.test/cephalo-worker:1 --leader-elect=true --leader-election-namespace default \
    --leader-election-lease-duration 6s --leader-election-renew-deadline 4s \
    --leader-election-retry-period 1s >>"$dir/op-$1.log" 2>&1 &
  op_pid[$1]=$!
}
ready() { curl -fsS "http://127.0.0.1:${op_port[$1]}/readyz" >/dev/null; }
exited() { ! kill -0 "${op_pid[$1]}" 2>/dev/null; }
reap() { wait "${op_pid[$1]}" 2>/dev/null; rc=$?; op_pid[$1]=; } # NAME: its exit status in $rc

# writes NAME FROM [TO]: the writes of replica NAME the API server received in [FROM, TO) (epoch
# seconds), from its audit log, one "TIME VERB URI CODE NAME" line each
writes() {
  $PY - "$AUDIT" "($1)" "$2" "${3:-1e12}" <<'PY'
import datetime, json, sys
path, who, t0, t1 = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
for line in open(path):
    e = json.loads(line)
    if not e.get('userAgent', '').endswith(who):
        continue
    t = datetime.datetime.strptime(e['requestReceivedTimestamp'], '%Y-%m-%dT%H:%M:%S.%fZ')
    t = t.replace(tzinfo=datetime.timezone.utc).timestamp()
    if t0 <= t < t1:
        print('%.6f %s %s %s %s' % (t, e['verb'], e['requestURI'], e.get('responseStatus', {}).get('code'),
                                    e.get('objectRef', {}).get('name', '-')))
PY
}
count() { writes "$@" | wc -l; }
# unfenced NAME STOP CONT: the writes of replica NAME the API server received after CONT (SIGCONT)
# that did not pass its fence before STOP (SIGSTOP); exit 1 if any. The one kind allowed is a
# write already past the fence when the process stopped: the client says so when it finds the
# fence closed after sending it ("in flight when the leader Lease ran out: it passed the fence at
# T"), and T tells it from a write let through after the fence closed. No client can close that
# window between its last check and the send (docs/operator.md, "The fence").
unfenced() {
  local w
  w=$(writes "$1" "$3") || return 2
  [ -z "$w" ] && return 0
  $PY - "$dir/op-$1.log" "$2" "$w" <<'PY'
import re, sys
log, t_stop, writes = sys.argv[1], float(sys.argv[2]), sys.argv[3]
late = [(m.group(1), m.group(2), float(m.group(3))) for m in
        re.finditer(r'(POST|PUT|PATCH|DELETE) https?://[^/ ]+(/\S*): in flight when the leader Lease '
                    r'ran out: it passed the fence at ([0-9.]+)', open(log).read())]
method = {'create': 'POST', 'update': 'PUT', 'patch': 'PATCH', 'delete': 'DELETE'}
bad = 0
for line in writes.split('\n'):
    t, verb, uri = line.split()[:3]
    hit = next((x for x in late if x[0] == method.get(verb) and x[1] == uri and x[2] < t_stop), None)
    if hit:
        late.remove(hit)
        print('%s: in flight at the stop (passed the fence at %.6f, before the stop at %.6f)' % (line, hit[2], t_stop))
    else:
        bad += 1
        print('%s: sent after the fence closed' % line)
sys.exit(1 if bad else 0)
PY
}

# jobs NAME... GPUS: tiny-gpt jobs of GPUS GPUs each (spec.gpus.maxGPUs), applied at once
jobs() {
  local g=${*: -1} j
  for j in "${@:1:$#-1}"; do
    printf -- '---\n{"apiVersion": "cephalo.dev/v1alpha1", "kind": "CephaloJob", "metadata": {"name": "%s"}, "spec": {"model": {"name": "tiny-gpt"}, "data": {"path": "synthetic"}, "seqLen": 64, "globalBatch": 32, "steps": 1000000, "gpus": {"maxGPUs": %d}, "terminationGracePeriodSeconds": 5}}\n' "$j" "$g"
  done | K apply -f - >/dev/null
}
# complete JOB...: every job has as many worker pods as its plan's world size, none being deleted
complete() {
  local j w p
  for j in "$@"; do
    w=$(jp cephalojob "$j" '{.status.plan.worldSize}')
    p=$(K get pods -l "cephalo.dev/job=$j" -o jsonpath='{range .items[*]}{.metadata.name}{.metadata.deletionTimestamp}{"\n"}{end}' | grep -c -- '-[0-9]*$')
    [ -n "$w" ] && [ "$p" = "$w" ] || return 1
  done
}
plan_ids() { K get configmaps -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.annotations.cephalo\.dev/plan-id}{"\n"}{end}' | grep -- '-plan=' | sort; }
pod_uids() { K get pods -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{"\n"}{end}' | sort; }

# ---- the cluster -----------------------------------------------------------------------------------
K apply -f crds/cephalojobs.cephalo.dev.yaml >/dev/null 2>&1
K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev >/dev/null 2>&1
nodes=() kl_args=()
for i in 0 1 2 3 4 5 6 7; do
  nodes+=("ha-$i")
  kl_args+=(--node-gpus "ha-$i=4" --node-label "ha-$i:nvidia.com/gpu.product=NVIDIA-L4" --node-label "ha-$i:nvidia.com/gpu.memory=23034")
done
$PY tests/k8s/kubelet.py --server "$K8S_SERVER" --token "$K8S_TOKEN" --ca "$K8S_CA" \
  --nodes "$(IFS=,; echo "${nodes[*]}")" --register "${kl_args[@]}" --heartbeat 5 \
  --first-ip "127.$((RANDOM % 200 + 20)).0.1" --worker bench/bench_operator_worker.sh --work "$dir/kl" 2>"$dir/kubelet.log" &
kl_pid=$!
untainted() {
  [ "$(K get nodes -o json | $PY -c 'import json, sys
print(sum(1 for n in json.load(sys.stdin)["items"] if not n["spec"].get("taints") and
          any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))))')" = 8 ]
}
assert "the kubelet registers 8 nodes of 4 GPUs; they become Ready and untainted" wait_for 90 untainted

start_op op-a
assert "replica op-a takes the Lease" wait_for 30 holder_is op-a
start_op op-b
assert "replica op-b is a ready standby" wait_for 30 ready op-b
check "... every write is attributed: op-a's User-Agent names it in the audit log" 0 "" -- \
  bash -c "$(declare -f writes count); AUDIT='$AUDIT'; PY=$PY; [ \$(count op-a 0) -gt 0 ]"

# ---- 1. the leader stopped past the lease duration, then resumed -----------------------------------
# stopped at its first pod creation (the audit log shows it at once): gangs of 6, 5 created at once
jobs s1 s2 s3 6
first_pod() { grep -qE '"requestURI":"/api/v1/namespaces/default/pods","verb":"create".*\(op-a\)"' "$AUDIT"; }
end=$((SECONDS + 30))
until first_pod || [ $SECONDS -ge $end ]; do sleep 0.01; done
kill -STOP "${op_pid[op-a]}"
t_stop=$(now)
pod_uids >"$dir/pods.at-stop"
plan_ids >"$dir/plans.at-stop"
a_before=$(count op-a 0 "$t_stop")
# two jobs more while no one leads: the new leader finds them with the others, first in its queue
# (listed by name): GPUs of the ranks op-a did not create yet must not go to them
jobs a4 a5 3
assert "op-a stopped: op-b takes the Lease after the lease duration" wait_for 40 holder_is op-b
assert "op-b brings every job up: the stopped leader's and two new ones" wait_for 60 complete s1 s2 s3 a4 a5
t_cont=$(now)
kill -CONT "${op_pid[op-a]}"
assert "op-a resumed exits (it does not lead)" wait_for 20 exited op-a
reap op-a
check "... with status 1, so that a fresh process campaigns" 0 "" -- test "$rc" = 1
check "... saying it is no longer leading" 0 "no longer leading" -- cat "$dir/op-op-a.log"
sleep 1
check "op-a sent no write after it resumed (audit log; $a_before before the stop), but one in flight then" 0 "" -- \
  bash -c "$(declare -f writes unfenced); AUDIT='$AUDIT'; PY=$PY; dir='$dir'; unfenced op-a $t_stop $t_cont"
echo "# op-a: $a_before writes before SIGSTOP, $(count op-a "$t_stop" "$t_cont") in flight then, $(count op-a "$t_cont") after SIGCONT; op-b: $(count op-b "$t_stop") after the stop"
# the pods that existed when op-a stopped are all still there, the same ones (uids)
check "partial gangs completed: no pod that op-a had created was deleted or recreated" 0 "" -- \
  bash -c "pods=\$(kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{\"\\n\"}{end}'); \
    missing=\$(grep -vxF -f <(echo \"\$pods\") '$dir/pods.at-stop'); echo \"\$missing\"; [ -z \"\$missing\" ]"
echo "# op-a had created $(wc -l <"$dir/pods.at-stop") pods of 18 when it stopped: $(cut -d- -f1 "$dir/pods.at-stop" | sort | uniq -c | xargs)"
plan_ids >"$dir/plans.end"
cut -d- -f1 "$dir/pods.at-stop" | sort -u | sed 's/$/-plan=/' >"$dir/started"
check "... on the plans op-a had made for them (plan ids kept)" 0 "" -- \
  bash -c "grep -F -f '$dir/started' '$dir/plans.at-stop' | grep -vxF -f '$dir/plans.end'; [ \$? = 1 ]"

# ---- 2. the leader stopped, the Lease deleted by hand ----------------------------------------------
start_op op-c
assert "replica op-c is a ready standby" wait_for 30 ready op-c
kill -STOP "${op_pid[op-b]}"
t_stop=$(now)
K delete lease cephalo-operator >/dev/null
t_del=$(now)
assert "op-b stopped and its Lease deleted: op-c creates it" wait_for 40 holder_is op-c
t_lead=$(now)
check "... only after it was missing for a lease duration (6 s: the old holder may not know)" 0 "" -- \
  $PY -c "import sys; d = $t_lead - $t_del; print(d); sys.exit(0 if d >= 5.5 else 1)"
jobs s6 2
assert "op-c brings the new job up" wait_for 60 complete s6
t_cont=$(now)
kill -CONT "${op_pid[op-b]}"
assert "op-b resumed exits" wait_for 20 exited op-b
sleep 1
check "op-b sent no write after it resumed, but one in flight then" 0 "" -- \
  bash -c "$(declare -f writes unfenced); AUDIT='$AUDIT'; PY=$PY; dir='$dir'; unfenced op-b $t_stop $t_cont"

# ---- 3. the Lease deleted by hand while the leader runs --------------------------------------------
start_op op-d
assert "replica op-d is a ready standby" wait_for 30 ready op-d
jobs s7 s8 2
sleep 0.2
K delete lease cephalo-operator >/dev/null
t_del=$(now)
assert "op-c, its Lease gone, stops leading and exits" wait_for 20 exited op-c
check "... saying the Lease is gone" 0 "is gone: no longer leading" -- cat "$dir/op-op-c.log"
assert "op-d creates the Lease and leads" wait_for 40 holder_is op-d
assert "... and brings the jobs up" wait_for 60 complete s7 s8
sleep 1
check "never two leaders: op-c's last write landed before op-d's first" 0 "" -- \
  bash -c "$(declare -f writes); AUDIT='$AUDIT'; PY=$PY; c=\$(writes op-c 0 | tail -n 1 | cut -d' ' -f1); \
    d=\$(writes op-d 0 | head -n 1 | cut -d' ' -f1); echo \"op-c last \$c, op-d first \$d\"; \
    $PY -c \"import sys; sys.exit(0 if float('\$c' or 0) < float('\$d' or 1e12) else 1)\""
echo "# op-c: $(count op-c "$t_del") writes after the Lease was deleted"

# ---- a graceful stop: exit time and takeover -------------------------------------------------------
start_op op-e
assert "replica op-e is a ready standby" wait_for 30 ready op-e
sleep 2
t0=$(now)
kill "${op_pid[op-d]}"
wait_for 20 exited op-d
t_exit=$(now)
reap op-d
check "SIGTERM stops the leader cleanly (status 0)" 0 "" -- test "$rc" = 0
assert "the standby takes the released Lease" wait_for 10 holder_is op-e
t_take=$(now)
check "... within a lease duration (it was released, not left to expire)" 0 "" -- \
  $PY -c "import sys; d = $t_take - $t0; sys.exit(0 if d < 6 else 1)"
echo "# graceful stop: leader exited $($PY -c "print('%.2f' % ($t_exit - $t0))") s after SIGTERM; standby held the Lease $($PY -c "print('%.2f' % ($t_take - $t0))") s after it"
assert "op-e brings nothing down: every job keeps its pods" complete s1 s2 s3 a4 a5 s6 s7 s8

# ---- a job waiting behind another's gang restart is woken when that gang is created ----------------
K delete cephalojobs --all --wait=false >/dev/null
assert "every job deleted, their pods go (garbage collector, kubelet)" wait_for 60 bash -c "[ -z \"\$(kubectl get pods -o name)\" ]"
K label node ha-5 ha-7 pool=wake >/dev/null
node_pods() { K patch node "$1" --subresource=status --type=merge -p "{\"status\":{\"allocatable\":{\"pods\":\"$2\"}}}" >/dev/null; }
# r's gang on ha-5 is refused by the scheduler (no pods allowed there): it restarts, its next gang 5 s
# later; w (which may use ha-5) comes meanwhile and must wait for r's new gang, not take its GPUs
node_pods ha-5 0
printf '%s\n' '{"apiVersion": "cephalo.dev/v1alpha1", "kind": "CephaloJob", "metadata": {"name": "r"}, "spec": {"model": {"name": "tiny-gpt"}, "data": {"path": "synthetic"}, "seqLen": 64, "globalBatch": 32, "steps": 1000000, "gpus": {"maxGPUs": 4, "nodeSelector": {"kubernetes.io/hostname": "ha-5"}}, "terminationGracePeriodSeconds": 5}}' | K apply -f - >/dev/null
assert "a job whose gang the scheduler refuses restarts (Restarting, Unschedulable)" wait_for 40 bash -c \
  "[ \"\$(kubectl get cephalojob r -o jsonpath='{.status.phase} {.status.conditions[?(@.type==\"Restarting\")].reason}')\" = 'Restarting Unschedulable' ]"
node_pods ha-5 110
t_w=$(now)
printf '%s\n' '{"apiVersion": "cephalo.dev/v1alpha1", "kind": "CephaloJob", "metadata": {"name": "w"}, "spec": {"model": {"name": "tiny-gpt"}, "data": {"path": "synthetic"}, "seqLen": 64, "globalBatch": 32, "steps": 1000000, "gpus": {"maxGPUs": 2, "nodeSelector": {"pool": "wake"}}, "terminationGracePeriodSeconds": 5}}' | K apply -f - >/dev/null
assert "a job that may use r's node waits for r's gang restart (Queued)" wait_for 20 bash -c \
  "kubectl get cephalojob w -o jsonpath='{.status.message}' | grep -q 'waiting for CephaloJob default/r to restart its gang'"
assert "... r's new gang comes, and then w's" wait_for 60 complete r w
sleep 1
# from r's first new pod to w's first pod, as the API server received them
wake=$(writes op-e "$t_w" | $PY -c '
import sys
first = {}
for line in sys.stdin:
    t, verb, uri, code, name = line.split()
    if verb == "create" and uri.endswith("/pods"):
        first.setdefault(name.rsplit("-", 1)[0], float(t))
print("%.2f" % (first["w"] - first["r"]) if "r" in first and "w" in first else "")')
echo "# w's first pod $wake s after r's new gang's first"
check "... w is woken by the new gang of r: its pods come within 5 s of those (a second plus the planning)" 0 "" -- \
  $PY -c "import sys; print('$wake'); sys.exit(0 if 0 <= float('${wake:-99}') < 5 else 1)"

# ---- kill -9 of the leader mid-bring-up: the new leader completes the partial gangs ------------------
# as section 1, but the leader dies (no SIGCONT, no last words): op-f finds gangs of 6 half created
start_op op-f
assert "replica op-f is a ready standby" wait_for 30 ready op-f
t_k=$(now)
jobs k1 k2 k3 6
end=$((SECONDS + 30))
until writes op-e "$t_k" | grep -q ' create /api/v1/namespaces/default/pods ' || [ $SECONDS -ge $end ]; do sleep 0.01; done
kill -9 "${op_pid[op-e]}"
reap op-e
pod_uids >"$dir/pods.at-kill"
plan_ids >"$dir/plans.at-kill"
assert "op-e killed (-9) mid-bring-up: op-f takes the Lease after the lease duration" wait_for 40 holder_is op-f
assert "op-f brings k1 k2 k3 up" wait_for 60 complete k1 k2 k3 r w
check "kill -9: no pod that op-e had created was deleted or recreated" 0 "" -- \
  bash -c "pods=\$(kubectl get pods -o jsonpath='{range .items[*]}{.metadata.name}={.metadata.uid}{\"\\n\"}{end}'); \
    missing=\$(grep -vxF -f <(echo \"\$pods\") '$dir/pods.at-kill'); echo \"\$missing\"; [ -z \"\$missing\" ]"
echo "# op-e had created $(grep -c '^k' "$dir/pods.at-kill") pods of k1 k2 k3's 18 when it was killed: $(grep '^k' "$dir/pods.at-kill" | cut -d- -f1 | sort | uniq -c | xargs)"
plan_ids >"$dir/plans.after-kill"
grep '^k' "$dir/pods.at-kill" | cut -d- -f1 | sort -u | sed 's/$/-plan=/' >"$dir/started-k"
check "... on the plans op-e had made for them (plan ids kept)" 0 "" -- \
  bash -c "[ ! -s '$dir/started-k' ] || { grep -F -f '$dir/started-k' '$dir/plans.at-kill' | grep -vxF -f '$dir/plans.after-kill'; [ \$? = 1 ]; }"
