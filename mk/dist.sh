#!/usr/bin/env bash
# make dist: the release files of this tree, named by its version (mk/version.sh) in DIR (dist/):
#   cephalo-V.tar.gz      the source (git ls-files: what is committed or staged, working-tree
#                         contents), under cephalo-V/, with VERSION; it builds without git, as the
#                         release V's version alone
#   cephalo-V.tgz         the Helm chart (helm package; chart version V, appVersion = VERSION, the
#                         images' default tag)
#   SHA256SUMS            of both
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-dist}
V=$(mk/version.sh)
REL=$(tr -d ' \t\r\n' <VERSION)
git rev-parse --show-toplevel >/dev/null 2>&1 || { echo "make dist: needs the git checkout (it lists the files with git ls-files)" >&2; exit 1; }
HELM=$(mk/helm.sh) || { echo "make dist: no helm (mk/helm.sh could not fetch it)" >&2; exit 1; }
mkdir -p "$DIR"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/cephalo-$V"
git ls-files -z --cached | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
  tar --null -T - -cf - | tar -xf - -C "$tmp/cephalo-$V"
tar -C "$tmp" --sort=name --owner=0 --group=0 --numeric-owner -czf "$DIR/cephalo-$V.tar.gz" "cephalo-$V"
"$HELM" package charts/cephalo --version "$V" --app-version "$REL" -d "$tmp/chart" >/dev/null
mv "$tmp/chart/cephalo-$V.tgz" "$DIR/"
(cd "$DIR" && sha256sum "cephalo-$V.tar.gz" "cephalo-$V.tgz" >SHA256SUMS)
echo "make dist: $DIR/cephalo-$V.tar.gz ($(du -h "$DIR/cephalo-$V.tar.gz" | cut -f1)), $DIR/cephalo-$V.tgz, $DIR/SHA256SUMS"
