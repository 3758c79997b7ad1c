#!/usr/bin/env bash
# test_version.sh - one release everywhere (docs/development.md, "Versions"): the three binaries'
# --version, the plan JSON and checkpoint metadata carry mk/version.sh's version (VERSION + git
# describe); a worker started by an operator of another release refuses, naming both; the chart
# and the image script name VERSION; `make dist` writes the source tarball (which builds as the
# release alone) and the chart package; LICENSE is Apache-2.0 and the README says so.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
B=${BUILD:-build/rel}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=/usr/bin/python3
REL=$(tr -d ' \t\r\n' <VERSION)
# the build's version, as compiled in (mk/version.sh when it was built: a commit since makes the
# tree's newer, which `make` compiles in again)
V=$("$B/bin/cephalo" --version | cut -d' ' -f2)

# ---- the version itself --------------------------------------------------------------------------
check "VERSION holds a release number MAJOR.MINOR.PATCH" 0 "" -- bash -c "[[ '$REL' =~ ^[0-9]+\.[0-9]+\.[0-9]+\$ ]]"
check "mk/version.sh: VERSION, + git describe in a git checkout" 0 "" -- bash -c \
  "v=\$(mk/version.sh); [ \"\${v%%+*}\" = '$REL' ] && { ! git rev-parse --git-dir >/dev/null 2>&1 || [ \"\${v#*+}\" = \"\$(git describe --always --dirty --abbrev=12 --match 'v[0-9]*')\" ] || [ \"\$v\" = '$REL' ]; }"
check "the build's version is VERSION, + a commit (hex, maybe -dirty) or a tag description" 0 "" -- bash -c \
  "[[ '$V' =~ ^$REL(\\+(v[0-9.]+-[0-9]+-g)?[0-9a-f]{7,40}(-dirty)?)?\$ ]]"
printf '0.1\n' >"$T/VERSION.bad"
check "a VERSION that is not MAJOR.MINOR.PATCH is refused, naming it" 1 "VERSION: '0.1' is not a release number" -- \
  bash -c "d=\$(mktemp -d) && mkdir \$d/mk && cp mk/version.sh \$d/mk/ && cp '$T/VERSION.bad' \$d/VERSION && \$d/mk/version.sh; rc=\$?; rm -rf \$d; exit \$rc"

# ---- --version of the three binaries --------------------------------------------------------------
for bin in cephalo cephalo-worker cephalo-operator; do
  check "$bin --version: '$bin $V (commit ...)'" 0 "$bin $V (commit " -- "$B/bin/$bin" --version
done
check "cephalo version = cephalo --version" 0 "cephalo $V (commit " -- "$B/bin/cephalo" version
check "cephalo --help lists the version command" 0 "version   the release and commit" -- "$B/bin/cephalo" --help
check "cephalo-worker --help and cephalo-operator --help list --version" 0 "--version" -- \
  bash -c "'$B/bin/cephalo-worker' --help | grep -q -- --version && '$B/bin/cephalo-operator' --help"

# ---- files: the plan JSON and checkpoints record who wrote them ------------------------------------
"$B/bin/cephalo" plan --cluster examples/clusters/cluster-a.yaml --model gpt2-124m --batch 32 -o "$T/plan.json" >/dev/null 2>&1
check "plan JSON: cephalo_version beside the format version" 0 "$V format 1" -- \
  $PY -c "import json; p = json.load(open('$T/plan.json')); print(p['cephalo_version'], 'format', p['version'])"
"$B/bin/cephalo-worker" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --quiet --ckpt-dir "$T/ck" >/dev/null 2>&1
check "checkpoint metadata: cephalo.release beside the format's cephalo.version" 0 "$V 1" -- $PY -c "
import json, struct, glob
f = open(sorted(glob.glob('$T/ck/step_*'))[-1], 'rb')
m = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))['__metadata__']
print(m['cephalo.release'], m['cephalo.version'])"

# ---- a worker of another release than its operator's refuses ---------------------------------------
other=$((${REL%%.*} + 1)).0.0
check "a worker started by an operator of another release refuses (exit 2), naming both versions" 2 \
  "cephalo-worker is version $V, but the cephalo-operator that started it is version $other" -- \
  env CEPHALO_OPERATOR_VERSION=$other "$B/bin/cephalo-worker" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --quiet
check "... and says which worker image to use" 2 "use the worker image of release $other" -- \
  env CEPHALO_OPERATOR_VERSION=$other+abc "$B/bin/cephalo-worker" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --quiet
check "a worker of the same release but another build runs" 0 "" -- \
  env CEPHALO_OPERATOR_VERSION=$REL+0123456789ab-dirty "$B/bin/cephalo-worker" train --data synthetic --model tiny-gpt --batch 2 --steps 1 --quiet

# ---- the chart, the images and the license name the same release -----------------------------------
check "the chart's version and appVersion are VERSION" 0 "$REL $REL" -- \
  $PY -c "import yaml; c = yaml.safe_load(open('charts/cephalo/Chart.yaml')); print(c['version'], c['appVersion'])"
check "the chart's image tags default to its appVersion" 0 "'' ''" -- $PY -c "
import yaml; v = yaml.safe_load(open('charts/cephalo/values.yaml'))
print(repr(v['operator']['image']['tag']), repr(v['worker']['image']['tag']))"
check "docker/build-images.sh tags the images with VERSION" 0 "" -- grep -q 'head -n 1 VERSION\|< *VERSION\|<VERSION\|cat VERSION' docker/build-images.sh
check "LICENSE is the Apache License 2.0" 0 "Apache License" -- head -3 LICENSE
check "the README names the license" 0 "Apache-2.0" -- grep -i 'license' README.md
check "CHANGELOG.md keeps an Unreleased section (Keep a Changelog)" 0 "## [Unreleased]" -- cat CHANGELOG.md

# ---- make dist --------------------------------------------------------------------------------------
if ! mk/helm.sh >/dev/null 2>&1; then
  n=$((n + 1)); echo "not ok $n - make dist needs helm (mk/helm.sh could not fetch it)"
else
  D=$(mk/version.sh) # the tree's version names the files
  check "make dist writes the source tarball, the chart package and SHA256SUMS" 0 "cephalo-$D.tar.gz" -- mk/dist.sh "$T/dist"
  check "... the checksums verify" 0 "" -- bash -c "cd '$T/dist' && sha256sum -c --quiet SHA256SUMS"
  mkdir -p "$T/x" && tar -xzf "$T/dist/cephalo-$D.tar.gz" -C "$T/x" 2>/dev/null
  check "... the tarball holds the tree under cephalo-$D/ (Makefile, VERSION, LICENSE, sources)" 0 "" -- \
    test -f "$T/x/cephalo-$D/Makefile" -a -f "$T/x/cephalo-$D/VERSION" -a -f "$T/x/cephalo-$D/LICENSE" -a -f "$T/x/cephalo-$D/common/version.c"
  check "... and, built without git, is the release itself" 0 "$REL" -- bash -c "cd '$T/x/cephalo-$D' && mk/version.sh | grep -x '$REL'"
  check "... the chart package: version $D, appVersion $REL" 0 "$D $REL" -- bash -c \
    "tar -xzOf '$T/dist/cephalo-$D.tgz' cephalo/Chart.yaml | $PY -c 'import sys, yaml; c = yaml.safe_load(sys.stdin); print(c[\"version\"], c[\"appVersion\"])'"
fi
