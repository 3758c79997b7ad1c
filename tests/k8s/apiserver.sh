#!/usr/bin/env bash
# A real Kubernetes API server (kube-apiserver + etcd) on loopback, for the CRD, chart and operator
# tests (tests/cli/test_k8s.sh). The project's own copy of shared/k8s/kube-apiserver.sh's approach.
#
# kube-apiserver is built from Debian's own `kubernetes` source package (v1.20.2, the one that
# Debian's kubectl is built from) with Debian's Go; etcd is Debian's etcd-server. Nothing is
# downloaded from anywhere but Debian's package archive. Like controller-runtime's envtest, there
# is no scheduler, kubelet or controller-manager: pods stay Pending until a test writes their
# status, and ownerReference garbage collection never runs.
#
#   apiserver.sh build          build (once) into the cache; ~5 min on 2 cores, then cached (needs root)
#   apiserver.sh built          exit 0 when the cache holds a build and etcd is installed, else 1
#   apiserver.sh start DIR      start etcd + apiserver, state in DIR; prints shell exports
#   apiserver.sh stop DIR       stop what `start DIR` started (by pid) and wait until it is gone
#   apiserver.sh restart DIR    restart kube-apiserver alone (same port, certificates, tokens and
#                               service-account keys; etcd and its data untouched), wait for /readyz
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

built() { [ -x "$BIN/kube-apiserver" ] && command -v etcd >/dev/null; }

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
  mv "$work"/gopath/src/k8s.io/kubernetes-* "$work/gopath/src/k8s.io/kubernetes"
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
  mkdir -p "$BIN"
  log "compiling kube-apiserver (a few minutes)"
  go build -o "$BIN/kube-apiserver.tmp.$$" ./cmd/kube-apiserver
  mv "$BIN/kube-apiserver.tmp.$$" "$BIN/kube-apiserver"
}

# wait_ready PORT TOKEN: up to 60 s for /readyz
wait_ready() {
  for _ in $(seq 1 120); do
    if curl -fsk -H "Authorization: Bearer $2" "https://127.0.0.1:$1/readyz" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  return 1
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() {
  dir=$1; build; mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
  ep=$(free_port); pp=$(free_port); ap=$(free_port)
  openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
  token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
  echo "$token,cephalo-test,cephalo-test-uid,system:masters" >"$dir/tokens.csv"
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
  printf '%s\n' "${args[@]}" >"$dir/apiserver.args"
  echo "$ap" >"$dir/apiserver.port"
  "$BIN/kube-apiserver" "${args[@]}" >"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  wait_ready "$ap" "$token" || { log "apiserver did not become ready; see $dir/apiserver.log"; stop "$dir"; exit 1; }
  cat >"$dir/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: "https://127.0.0.1:$ap", certificate-authority: "$dir/certs/apiserver.crt"}
users:
- name: test
  user: {token: "$token"}
contexts:
- name: test
  context: {cluster: test, user: test, namespace: default}
current-context: test
EOF
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
  for p in apiserver etcd; do stop_one "$dir" "$p"; done
}

restart() {
  dir=$(cd "$1" && pwd)
  [ -f "$dir/apiserver.args" ] && [ -f "$dir/etcd.pid" ] || { log "nothing was started in $dir"; exit 1; }
  mapfile -t args <"$dir/apiserver.args"
  ap=$(cat "$dir/apiserver.port")
  token=$(cut -d, -f1 "$dir/tokens.csv")
  stop_one "$dir" apiserver
  echo "---- restarted $(date -u +%FT%TZ)" >>"$dir/apiserver.log"
  "$BIN/kube-apiserver" "${args[@]}" >>"$dir/apiserver.log" 2>&1 &
  echo $! >"$dir/apiserver.pid"
  wait_ready "$ap" "$token" || { log "apiserver did not become ready again; see $dir/apiserver.log"; exit 1; }
}

case "${1:-}" in
  build) build ;;
  built) built ;;
  start) start "${2:?start DIR}" ;;
  stop) stop "${2:?stop DIR}" ;;
  restart) restart "${2:?restart DIR}" ;;
  *) sed -n '2,21p' "$0"; exit 2 ;;
esac
