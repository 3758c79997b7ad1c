#!/usr/bin/env bash
# A real Kubernetes control plane on loopback for the CRD, chart, operator and scheduler tests
# (tests/cli/test_k8s.sh, test_operator*.sh, test_controlplane.sh). The project's own copy of
# shared/k8s/kube-apiserver.sh's approach.
#
# kube-apiserver, kube-scheduler and kube-controller-manager are built from Debian's own
# `kubernetes` source package (v1.20.2, the one that Debian's kubectl is built from) with Debian's
# Go, linked with the release's version (GET /version says v1.20.2); etcd is Debian's etcd-server.
# Nothing is downloaded from anywhere but Debian's package archive.
#
# By default only etcd + kube-apiserver run, like controller-runtime's envtest: no scheduler and
# no controller-manager, so pods stay Pending unless something sets spec.nodeName (a test), and
# ownerReference garbage collection never runs. With --control-plane (or
# CEPHALO_K8S_CONTROL_PLANE=1) kube-scheduler and kube-controller-manager (all its default
# controllers) run too. There is never a kubelet: tests/k8s/kubelet.py plays it.
# CEPHALO_K8S_AUDIT=1: an audit log of every write (create, update, patch, delete; level Metadata,
# one JSON line per request once answered: verb, requestURI, user, userAgent, responseStatus,
# requestReceivedTimestamp) in DIR/audit.log, so that a test can tell which client sent what, and
# when (cephalo-operator's User-Agent names its replica). Reads are not logged.
# CEPHALO_K8S_START_S (600): the longest a component may take to get ready while its process lives
# (a process that exits fails the start at once; a loaded machine takes minutes, not seconds).
# CEPHALO_K8S_SCHEDULER_ARGS: more kube-scheduler flags, split on spaces (bench-operator's
# BENCH_OP_SCHEDULER_ARGS, e.g. --kube-api-qps=200 --kube-api-burst=400: by default its client
# sends at most 50 requests a second after a burst of 100, one per pod bound).
#
#   apiserver.sh build          build (once) into the cache; ~10 min on 2 cores, then cached (needs root)
#   apiserver.sh built          exit 0 when the cache holds a complete build and etcd is installed
#   apiserver.sh start DIR [--control-plane]
#                               start etcd + apiserver (+ scheduler + controller-manager), state in
#                               DIR; prints shell exports
#   apiserver.sh stop DIR       stop what `start DIR` started (by pid) and wait until it is gone
#   apiserver.sh restart DIR    restart kube-apiserver alone (same port, certificates, tokens and
#                               service-account keys; etcd and its data untouched), wait for /readyz;
#                               a scheduler and controller-manager keep running and reconnect (one
#                               that has exited is started again)
#
# The cache is $CEPHALO_K8S_CACHE, else ~/.cache/cephalo-k8s (the same as the shared script's, so
# one build serves both). apt-get waits up to 10 minutes for another apt-get's lock.
# After `eval "$(apiserver.sh start /tmp/k8s)"`: KUBECONFIG, K8S_SERVER (https://127.0.0.1:PORT),
# K8S_TOKEN (a bearer token in system:masters), K8S_CA (the server's CA certificate) are set.
set -euo pipefail
CACHE=${CEPHALO_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephalo-k8s}
BIN=$CACHE/bin
log() { echo "apiserver.sh: $*" >&2; }
APT=(apt-get -o DPkg::Lock::Timeout=600)

need_root() { [ "$(id -u)" = 0 ] || { log "installing packages needs root"; exit 1; }; }

# What a complete build holds. The stamp names the build's format: a cache from before it (only
# kube-apiserver, version v0.0.0-master) does not match and is rebuilt once by `build`.
COMPONENTS=(kube-apiserver kube-scheduler kube-controller-manager)
STAMP="cephalo-k8s build 2: ${COMPONENTS[*]}, version ldflags"

built() {
  [ "$(cat "$BIN/STAMP" 2>/dev/null)" = "$STAMP" ] || return 1
  for c in "${COMPONENTS[@]}"; do [ -x "$BIN/$c" ] || return 1; done
  command -v etcd >/dev/null
}

build() {
  if built; then return 0; fi
  need_root
  # one build at a time per cache (another session may be building into it too)
  mkdir -p "$CACHE"; exec 9>"$CACHE/build.lock"; flock 9
  if built; then return 0; fi
  export DEBIAN_FRONTEND=noninteractive
  if ! grep -rqs '^Types:.*deb-src' /etc/apt/sources.list.d/ && ! grep -qs '^deb-src' /etc/apt/sources.list; then
    log "enabling Debian source packages"
    sed -e 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources \
      >/etc/apt/sources.list.d/debian-src.sources
  fi
  "${APT[@]}" update -qq >/dev/null
  "${APT[@]}" install -y -qq golang-go etcd-server golang-github-modern-go-reflect2-dev openssl curl >/dev/null
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  (cd "$work" && apt-get source --download-only -qq kubernetes >/dev/null)
  mkdir -p "$work/gopath/src/k8s.io"
  tar xzf "$work"/kubernetes_*.orig.tar.gz -C "$work/gopath/src/k8s.io"
  # The tree is kubernetes-1.20.2 (Debian's package version, 1.20.5+really1.20.2, names a
  # re-upload of 1.20.2): the directory's name is the version the binaries report.
  src=$(echo "$work"/gopath/src/k8s.io/kubernetes-*)
  version=v${src##*/kubernetes-}
  [[ $version =~ ^v([0-9]+)\.([0-9]+)\.[0-9]+$ ]] || { log "cannot tell the version from $src"; exit 1; }
  major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]}
  mv "$src" "$work/gopath/src/k8s.io/kubernetes"
  cd "$work/gopath/src/k8s.io/kubernetes"
  export GOPATH=$work/gopath GO111MODULE=off CGO_ENABLED=0 GOCACHE=$CACHE/gocache GOFLAGS=
  # The vendored reflect2 1.0.1 crashes under Go >= 1.18; Debian's 1.0.2 is the fix.
  rm -rf vendor/github.com/modern-go/reflect2
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 vendor/github.com/modern-go/reflect2
  # The OpenAPI definitions are generated at build time upstream; generate them here the same way.
  go build -o "$work/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen
  dirs=$( set +o pipefail
         { find pkg cmd plugin -name '*.go'; find -L vendor -name '*.go' 2>/dev/null |
           grep -v -E 'vendor/k8s.io/(code-generator|sample-apiserver)/'; } |
         xargs grep -l '+k8s:openapi-gen=' 2>/dev/null | xargs -n1 dirname | LC_ALL=C sort -u |
         sed 's#^#k8s.io/kubernetes/#' | paste -sd, )
  [ -n "$dirs" ] || { log "found no packages to generate OpenAPI definitions for"; exit 1; }
  "$work/openapi-gen" -i "$dirs" -p k8s.io/kubernetes/pkg/generated/openapi -O zz_generated.openapi \
    -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt -r "$work/violations.report" >/dev/null 2>&1
  # The version the binaries report (GET /version, --version), set at link time as upstream's
  # hack/lib/version.sh does. Without it they say v0.0.0-master, which Helm refuses for a chart's
  # kubeVersion: ">=1.20.0". In this GOPATH build the packages are the vendored copies, so the
  # paths carry the vendor/ prefix. gitCommit is already in the source (the release's commit).
  ldflags=()
  for pkg in k8s.io/kubernetes/vendor/k8s.io/component-base/version \
             k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version; do
    ldflags+=("-X '$pkg.gitVersion=$version'" "-X '$pkg.gitMajor=$major'" "-X '$pkg.gitMinor=$minor'"
              "-X '$pkg.gitTreeState=clean'" "-X '$pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)'")
  done
  mkdir -p "$BIN" "$work/out"
  log "compiling ${COMPONENTS[*]} $version (several minutes)"
  # one go build for the three: it shares the packages they have in common and keeps both cores busy
  go build -ldflags "${ldflags[*]}" -o "$work/out/" "${COMPONENTS[@]/#/./cmd/}"
  rm -f "$BIN/STAMP"
  for c in "${COMPONENTS[@]}"; do
    "$work/out/$c" --version | grep -qx "Kubernetes $version" ||
      { log "$c does not report $version: $("$work/out/$c" --version 2>&1)"; exit 1; }
    # the same file system as the cache? not necessarily (/tmp): copy, then rename into place
    cp "$work/out/$c" "$BIN/$c.tmp.$$" && mv "$BIN/$c.tmp.$$" "$BIN/$c"
  done
  echo "$STAMP" >"$BIN/STAMP"
}

# The waits below wait for what they await, a process getting ready, for as long as the process
# lives: on a machine whose cores are busy with other work a start takes minutes, not seconds (a
# fixed 60 s failed there). START_S bounds them against a process that hangs without exiting.
START_S=${CEPHALO_K8S_START_S:-600}

# wait_up PID URL [CURL_ARGS...]: URL answered 2xx; 1 at once when the process PID has exited
wait_up() {
  local pid=$1 url=$2 end=$((SECONDS + START_S))
  shift 2
  while [ "$SECONDS" -lt "$end" ]; do
    kill -0 "$pid" 2>/dev/null || return 1
    if curl -fsk "$@" "$url" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  return 1
}

# wait_ready PORT TOKEN PID: the API server's /readyz answered
wait_ready() { wait_up "$3" "https://127.0.0.1:$1/readyz" -H "Authorization: Bearer $2"; }

# wait_healthz PORT PID: https://127.0.0.1:PORT/healthz answered (served to anyone: /healthz is the
# components' always-allowed path)
wait_healthz() { wait_up "$2" "https://127.0.0.1:$1/healthz"; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

new_token() { head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n'; }

# kubeconfig FILE SERVER CA TOKEN: a kubeconfig with a bearer token
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "$2", certificate-authority: "$3"}
users:
- name: test
  user: {token: "$4"}
contexts:
- name: test
  context: {cluster: test, user: test, namespace: default}
current-context: test
EOF
}

# launch DIR NAME: start kube-NAME with the flags in DIR/NAME.args, its output appended to
# DIR/NAME.log after a "---- started" line (wait_component reads the log from there)
launch() {
  local a
  mapfile -t a <"$1/$2.args"
  echo "---- started $(date -u +%FT%TZ)" >>"$1/$2.log"
  "$BIN/kube-$2" "${a[@]}" >>"$1/$2.log" 2>&1 &
  echo $! >"$1/$2.pid"
}

# wait_component DIR NAME: until kube-NAME answers /healthz; for the controller manager
# also until its garbage collector has synced, which is after every controller was started: it
# answers /healthz while it is still starting them, and if the API server goes away meanwhile
# (a test's `restart`), the namespace controller's start ends the process (a Fatal in 1.20)
wait_component() {
  local pid port from
  pid=$(cat "$1/$2.pid") port=$(cat "$1/$2.port")
  wait_healthz "$port" "$pid" || { log "kube-$2 did not become healthy; see $1/$2.log"; return 1; }
  [ "$2" = controller-manager ] || return 0
  from=$(grep -n '^---- started' "$1/$2.log" | tail -n 1 | cut -d: -f1)
  local end=$((SECONDS + START_S))
  while [ "$SECONDS" -lt "$end" ]; do
    kill -0 "$pid" 2>/dev/null || break
    if tail -n "+$from" "$1/$2.log" | grep -q 'Garbage collector: all resource monitors have synced'; then return 0; fi
    sleep 0.5
  done
  log "kube-$2 did not start its controllers; see $1/$2.log"
  return 1
}

# control_plane DIR PORT: start kube-scheduler and kube-controller-manager against the API server
# on PORT and wait until both are ready. Their tokens are already in DIR/tokens.csv; their command
# lines are kept in DIR/NAME.args for `restart`.
control_plane() {
  local dir=$1 ap=$2 sp cp server ca
  server=https://127.0.0.1:$ap ca=$dir/certs/apiserver.crt
  kubeconfig "$dir/scheduler.kubeconfig" "$server" "$ca" "$(sed -n 's/,system:kube-scheduler,.*//p' "$dir/tokens.csv")"
  kubeconfig "$dir/controller-manager.kubeconfig" "$server" "$ca" \
    "$(sed -n 's/,system:kube-controller-manager,.*//p' "$dir/tokens.csv")"
  sp=$(free_port); cp=$(free_port)
  echo "$sp" >"$dir/scheduler.port"
  echo "$cp" >"$dir/controller-manager.port"
  # Common to both: no leader election (one instance, and no Lease to wait for at start); the
  # insecure HTTP port (--port, 10251/10252 by default) off so that parallel test clusters do not
  # collide; HTTPS on a free loopback port with a self-signed certificate in DIR. No
  # --authentication-kubeconfig/--authorization-kubeconfig: then /healthz (always allowed) is all
  # they serve, which is all the tests need; with them, they would look for the client CA in
  # kube-system/extension-apiserver-authentication, which this API server (no --client-ca-file)
  # does not write, and log an error for it several times a second.
  printf '%s\n' --kubeconfig="$dir/scheduler.kubeconfig" --leader-elect=false --port=0 \
    --bind-address=127.0.0.1 --secure-port="$sp" --cert-dir="$dir/scheduler-certs" >"$dir/scheduler.args"
  # shellcheck disable=SC2086 # flags split on spaces
  [ -z "${CEPHALO_K8S_SCHEDULER_ARGS:-}" ] || printf '%s\n' $CEPHALO_K8S_SCHEDULER_ARGS >>"$dir/scheduler.args"
  # --controllers=*: every controller that kube-controller-manager runs by default (deployment,
  # replicaset, job, garbage collector, namespace, serviceaccount + token, node lifecycle, ...;
  # bootstrapsigner and tokencleaner stay off, as upstream's default). No cloud provider, so the
  # cloud controllers (service load balancers, routes, cloud node lifecycle) do nothing.
  # The node lifecycle controller stays on: it is what takes the node.kubernetes.io/not-ready
  # taint (put on every new Node by the API server's TaintNodesByCondition admission) off a Node
  # once its Ready condition is True, without which the scheduler places nothing. It also taints
  # a Node unreachable (NoExecute: its pods are evicted 5 minutes later) when neither its Ready
  # condition nor its Lease in kube-node-lease was renewed for --node-monitor-grace-period (40 s;
  # 1 min after creation for a Node that never reported): tests/k8s/kubelet.py renews the Lease
  # every 10 s and reports Ready at start and every 5 minutes, as a kubelet does. A Node that no
  # kubelet.py keeps is tainted unreachable after a minute.
  # The service-account token controller signs the tokens of ServiceAccount Secrets with the
  # API server's signing key, and puts the API server's CA (--root-ca-file) in them.
  # The FlexVolume plugin directory is in DIR: by default it is /usr/libexec/kubernetes/..., which
  # the controller manager creates when it is missing.
  printf '%s\n' --kubeconfig="$dir/controller-manager.kubeconfig" --leader-elect=false --port=0 \
    --bind-address=127.0.0.1 --secure-port="$cp" --cert-dir="$dir/controller-manager-certs" \
    --controllers='*' --service-account-private-key-file="$dir/sa.key" --root-ca-file="$ca" \
    --flex-volume-plugin-dir="$dir/flexvolume" >"$dir/controller-manager.args"
  launch "$dir" scheduler
  launch "$dir" controller-manager
  wait_component "$dir" scheduler && wait_component "$dir" controller-manager
}

start() {
  dir=$1 cplane=$2; build; mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
  ep=$(free_port); pp=$(free_port); ap=$(free_port)
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
  token=$(new_token)
  # the tests' token first (restart reads it from line 1); the scheduler's and the controller
  # manager's identities are the users of their bootstrap RBAC roles. The scheduler gets no more
  # than its roles (system:kube-scheduler, system:volume-scheduler). The controller manager is in
  # system:masters too: its own role is made for --use-service-account-credentials (one account
  # per controller, each waiting for its token at start); one all-powerful identity starts faster.
  {
    echo "$token,cephalo-test,cephalo-test-uid,system:masters"
    echo "$(new_token),system:kube-scheduler,system:kube-scheduler-uid"
    echo "$(new_token),system:kube-controller-manager,system:kube-controller-manager-uid,system:masters"
  } >"$dir/tokens.csv"
  etcd --data-dir "$dir/etcd" --listen-client-urls "http://127.0.0.1:$ep" \
    --advertise-client-urls "http://127.0.0.1:$ep" --listen-peer-urls "http://127.0.0.1:$pp" \
    >"$dir/etcd.log" 2>&1 &
  echo $! >"$dir/etcd.pid"
  # the command line is kept for `restart`
  args=(--etcd-servers="http://127.0.0.1:$ep" --cert-dir="$dir/certs"
    --secure-port="$ap" --bind-address=127.0.0.1 --advertise-address=127.0.0.1
    --service-cluster-ip-range=10.0.0.0/24 --service-account-issuer=https://kubernetes.default.svc
    --service-account-key-file="$dir/sa.pub" --service-account-signing-key-file="$dir/sa.key"
    --authorization-mode=RBAC --token-auth-file="$dir/tokens.csv" --allow-privileged=true
    --disable-admission-plugins=ServiceAccount)
  case "${CEPHALO_K8S_AUDIT:-0}" in
    1|true|yes)
      printf '%s\n' 'apiVersion: audit.k8s.io/v1' 'kind: Policy' 'omitStages: [RequestReceived]' 'rules:' \
        '- level: Metadata' '  verbs: [create, update, patch, delete, deletecollection]' '- level: None' \
        >"$dir/audit-policy.yaml"
      args+=(--audit-policy-file="$dir/audit-policy.yaml" --audit-log-path="$dir/audit.log" --audit-log-mode=blocking) ;;
    0|false|no|'') ;;
    *) log "CEPHALO_K8S_AUDIT=$CEPHALO_K8S_AUDIT: expected 1 or 0"; exit 2 ;;
  esac
  printf '%s\n' "${args[@]}" >"$dir/apiserver.args"
  echo "$ap" >"$dir/apiserver.port"
  "$BIN/kube-apiserver" "${args[@]}" >"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  wait_ready "$ap" "$token" "$(cat "$dir/apiserver.pid")" ||
    { log "apiserver did not become ready; see $dir/apiserver.log"; stop "$dir"; exit 1; }
  kubeconfig "$dir/kubeconfig" "https://127.0.0.1:$ap" "$dir/certs/apiserver.crt" "$token"
  if [ "$cplane" = 1 ]; then
    control_plane "$dir" "$ap" || { stop "$dir"; exit 1; }
  fi
  echo "export KUBECONFIG='$dir/kubeconfig' K8S_SERVER='https://127.0.0.1:$ap' K8S_TOKEN='$token' K8S_CA='$dir/certs/apiserver.crt'"
}

stop_one() { # DIR NAME: the process of DIR/NAME.pid, SIGKILL after 5 s
  local pid
  [ -f "$1/$2.pid" ] || return 0
  pid=$(cat "$1/$2.pid")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  rm -f "$1/$2.pid"
}

stop() {
  dir=$1
  # the API server's clients first, so that they do not log its going away as errors
  for p in controller-manager scheduler apiserver etcd; do stop_one "$dir" "$p"; done
}

restart() {
  dir=$(cd "$1" && pwd)
  [ -f "$dir/apiserver.args" ] && [ -f "$dir/etcd.pid" ] || { log "nothing was started in $dir"; exit 1; }
  mapfile -t args <"$dir/apiserver.args"
  ap=$(cat "$dir/apiserver.port")
  token=$(head -n 1 "$dir/tokens.csv" | cut -d, -f1)
  stop_one "$dir" apiserver
  echo "---- restarted $(date -u +%FT%TZ)" >>"$dir/apiserver.log"
  "$BIN/kube-apiserver" "${args[@]}" >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  wait_ready "$ap" "$token" "$(cat "$dir/apiserver.pid")" ||
    { log "apiserver did not become ready again; see $dir/apiserver.log"; exit 1; }
  # the scheduler and the controller manager (with --control-plane) ride the restart out; one
  # that exited meanwhile is started again, as the kubelet restarts a control plane's static pods
  for c in scheduler controller-manager; do
    [ -f "$dir/$c.args" ] || continue
    if [ -f "$dir/$c.pid" ] && kill -0 "$(cat "$dir/$c.pid")" 2>/dev/null; then continue; fi
    log "kube-$c had exited (see $dir/$c.log); starting it again"
    launch "$dir" "$c"
    wait_component "$dir" "$c" || exit 1
  done
}

case "${1:-}" in
  build) build ;;
  built) built ;;
  start)
    [ -n "${2:-}" ] || { log "usage: start DIR [--control-plane]"; exit 2; }
    cplane=0
    case "${CEPHALO_K8S_CONTROL_PLANE:-0}" in 1|true|yes) cplane=1 ;; 0|false|no|'') ;;
      *) log "CEPHALO_K8S_CONTROL_PLANE=$CEPHALO_K8S_CONTROL_PLANE: expected 1 or 0"; exit 2 ;; esac
    case "${3:-}" in --control-plane) cplane=1 ;; '') ;; *) log "start: unknown option '$3'"; exit 2 ;; esac
    start "$2" "$cplane" ;;
  stop) stop "${2:?stop DIR}" ;;
  restart) restart "${2:?restart DIR}" ;;
  *) sed -n '2,31p' "$0"; exit 2 ;;
esac
