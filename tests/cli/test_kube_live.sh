#!/usr/bin/env bash
# The operator's Kubernetes client (operator/) against a real kube-apiserver + etcd on loopback
# (tests/k8s/apiserver.sh, built by test_k8s.sh or `sudo tests/k8s/apiserver.sh build`): runs
# tests/unit/test_kube_live.c with CEPHALO_TEST_KUBECONFIG pointing at the server, one "ok" line
# per cmocka test. Everything started is stopped on exit.
set -u
cd "$(dirname "$0")/../.."
AS=tests/k8s/apiserver.sh
BIN=${BUILD:-build/rel}/tests/test_kube_live

skip_all() { echo "not ok 1 - kube client against kube-apiserver: $*"; exit 0; }
[ -x "$BIN" ] || skip_all "$BIN is not built (make)"
"$AS" built || skip_all "kube-apiserver is not built: run 'sudo tests/k8s/apiserver.sh build'"

dir=$(mktemp -d /tmp/cephalo-kube-live.XXXXXX)
cleanup() { "$AS" stop "$dir/k8s" >/dev/null 2>&1; rm -rf "$dir"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
exports=$("$AS" start "$dir/k8s" 2>"$dir/start.log") || {
  sed 's/^/#   /' "$dir/start.log"; skip_all "the API server did not start"; }
eval "$exports"

out=$(CEPHALO_TEST_KUBECONFIG=$KUBECONFIG CMOCKA_MESSAGE_OUTPUT=stdout timeout 300 "$BIN" 2>&1)
rc=$?
n=0
while read -r status name; do
  n=$((n + 1))
  if [ "$status" = OK ]; then echo "ok $n - $name"; else echo "not ok $n - $name"; fi
done < <(sed -n 's/^\[ *\(OK\|FAILED\|SKIPPED\) *\] \(test_[a-z_0-9]*\)$/\1 \2/p' <<<"$out")
if [ "$rc" -ne 0 ] || [ "$n" -eq 0 ]; then
  echo "not ok $((n + 1)) - test_kube_live exited $rc"
  grep -E 'ERROR|LINE|error' <<<"$out" | head -20 | sed 's/^/#   /'
fi
