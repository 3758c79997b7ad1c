#!/usr/bin/env bash
# test_crd_doc.sh - every CephaloJob field is documented (mk/crd_doc.py): the tree passes, and in
# copies the checker names a spec field without a row, a field its parent's row does not name, an
# inline model field docs/formats.md lacks, a status field without a row, and a documented field
# the CRD does not have.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=/usr/bin/python3
CRD=crds/cephalojobs.cephalo.dev.yaml

check "the tree: every CRD field is documented in docs/k8s.md" 0 "every CRD field is documented" -- $PY mk/crd_doc.py
check "the chart's CRD is the same file" 0 "" -- cmp "$CRD" charts/cephalo/crds/cephalojobs.cephalo.dev.yaml

# crd_with DOTTED.PATH.IN.SPEC FIELD [status]: a copy of the CRD with a new integer field there
crd_with() {
  $PY - "$CRD" "$T/crd.yaml" "$1" "$2" "${3:-spec}" <<'PY'
import sys, yaml
src, dst, where, field, part = sys.argv[1:]
crd = yaml.safe_load(open(src))
s = crd['spec']['versions'][0]['schema']['openAPIV3Schema']['properties'][part]
for k in [x for x in where.split('.') if x]:
    s = s['properties'][k]
    if s.get('type') == 'array':
        s = s['items']
s.setdefault('properties', {})[field] = {'type': 'integer'}
yaml.safe_dump(crd, open(dst, 'w'))
PY
}
crd_with gpus fancyGPUs
check "a new spec field without a row is named" 1 "spec.gpus.fancyGPUs: not in docs/k8s.md's spec table (give it a row)" -- \
  $PY mk/crd_doc.py --crd "$T/crd.yaml"
crd_with tolerations shiny
check "a field its parent's row does not name is named, with the row to name it in" 1 \
  "spec.tolerations.shiny: not in docs/k8s.md's spec table (give it a row, or name it in \`tolerations\`'s row)" -- \
  $PY mk/crd_doc.py --crd "$T/crd.yaml"
crd_with model.inline n_experts
check "an inline model field that docs/formats.md's model file table lacks is named" 1 \
  "spec.model.inline.n_experts: an inline model field that docs/formats.md's model file table lacks" -- \
  $PY mk/crd_doc.py --crd "$T/crd.yaml"
crd_with "" tokensPerSecond status
check "a status field without a row is named" 1 "status.tokensPerSecond: not in docs/k8s.md's status table" -- \
  $PY mk/crd_doc.py --crd "$T/crd.yaml"
mkdir -p "$T/docs" && cp docs/formats.md "$T/docs/" &&
  sed 's/^| `priority` | integer |/| `priority`, `urgency` | integer |/' docs/k8s.md >"$T/docs/k8s.md"
check "a documented field the CRD lacks is named" 1 "spec.urgency: documented in docs/k8s.md's spec table but not in" -- \
  $PY mk/crd_doc.py --docs "$T/docs"
