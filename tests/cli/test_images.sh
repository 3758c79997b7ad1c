#!/usr/bin/env bash
# The container images, built for real from docker/Dockerfile.operator and docker/Dockerfile.worker
# (CPU variant: CUDA=0) by docker/build-images.sh: buildah (vfs, chroot isolation) FROM a Debian
# bookworm base that mmdebstrap makes from the Debian archive, everything cached in
# ~/.cache/cephalo-images. Then each image's entry point runs inside it: `cephalo-operator --help`,
# `cephalo-worker --help` and a 2-step CPU training of tiny-gpt on synthetic data that writes a
# checkpoint to /checkpoints, as the images' non-root USER 10001. A rebuild of the unchanged tree
# must hit the layer cache.
#
# Skipped (one "# ..." line, no checks) where it cannot build: not root, buildah/mmdebstrap not
# installable, or the Debian archive unreachable (docker/build-images.sh exits 3), and when
# CEPHALO_TEST_IMAGES=0.
# Time on 2 cores: see docs/k8s.md, "Building the images" (cold: base + apt + compile, minutes;
# warm: seconds).
set -u
cd "$(dirname "$0")/../.."
. tests/cli/lib.sh
S=docker/build-images.sh
skip_all() { echo "# test_images.sh: skipped: $*"; exit 0; }
[ "${CEPHALO_TEST_IMAGES:-1}" = 0 ] && skip_all "CEPHALO_TEST_IMAGES=0"
# the images build from the source tree, not from $BUILD: the sanitizer run would build and check
# the same images again (CI runs make test SAN=1, then make test)
case "${BUILD:-build/rel}" in *san*) skip_all "the sanitizer run (the images do not depend on \$BUILD; make test builds them)" ;; esac

T=$(mktemp -d /tmp/cephalo-images-test.XXXXXX)
trap 'rm -rf "$T"' EXIT

start=$SECONDS
"$S" build operator worker-cpu >"$T/tags" 2>"$T/build.log"
rc=$?
cold=$((SECONDS - start))
if [ "$rc" = 3 ]; then skip_all "$(tail -n 1 "$T/build.log" | sed 's/^build-images.sh: //')"; fi
n=$((n + 1))
if [ "$rc" != 0 ]; then
  echo "not ok $n - the operator and CPU worker images build (exit $rc)"; tail -n 15 "$T/build.log" | sed 's/^/#   /'
  exit 0
fi
echo "ok $n - the operator and CPU worker images build ($cold s)"
OP=$(sed -n 1p "$T/tags")
WK=$(sed -n 2p "$T/tags")
VERSION=$(head -n 1 VERSION 2>/dev/null | tr -d '[:space:]')
VERSION=${VERSION:-0.1.0}
check "the operator image is tagged with the project's version" 0 "cephalo-operator:$VERSION" -- echo "$OP"
check "the CPU worker image is tagged VERSION-cpu" 0 "cephalo-worker:$VERSION-cpu" -- echo "$WK"

img() { "$S" buildah inspect --type image --format "$2" "$1"; }
check "operator image: USER 10001:10001" 0 "user=10001:10001" -- img "$OP" 'user={{.OCIv1.Config.User}}'
check "operator image: entry point /usr/local/bin/cephalo-operator" 0 "ep=[/usr/local/bin/cephalo-operator]" -- \
  img "$OP" 'ep={{.OCIv1.Config.Entrypoint}}'
check "worker image: USER 10001:10001" 0 "user=10001:10001" -- img "$WK" 'user={{.OCIv1.Config.User}}'
check "CPU worker image: no GPU for the NVIDIA runtime (NVIDIA_VISIBLE_DEVICES=void)" 0 "NVIDIA_VISIBLE_DEVICES=void" -- \
  img "$WK" '{{.OCIv1.Config.Env}}'
check "worker image: entry point cephalo-worker, default command train" 0 \
  "ep=[/usr/local/bin/cephalo-worker] cmd=[train]" -- img "$WK" 'ep={{.OCIv1.Config.Entrypoint}} cmd={{.OCIv1.Config.Cmd}}'

check "operator image: cephalo-operator --help runs" 0 "usage: cephalo-operator" -- "$S" run "$OP" --help
check "operator image: runs as uid 10001, not root" 0 "uid=10001(cephalo) gid=10001(cephalo)" -- "$S" sh "$OP" id
check "operator image: every shared library resolves" 0 "" -- \
  "$S" sh "$OP" sh -c '! ldd /usr/local/bin/cephalo-operator | grep "not found"'
check "worker image: cephalo-worker --help runs" 0 "usage: cephalo-worker train" -- "$S" run "$WK" --help
# built without .git (.dockerignore): the release alone, what the operator and workers compare
check "the images' binaries are version VERSION (the operator's and the worker's --version)" 0 \
  "cephalo-operator $VERSION (commit unknown) cephalo-worker $VERSION (commit unknown)" -- \
  bash -c "echo \$('$S' run '$OP' --version) \$('$S' run '$WK' --version)"
check "worker image: runs as uid 10001 in /home/cephalo" 0 "uid=10001 gid=10001 /home/cephalo" -- \
  "$S" sh "$WK" sh -c 'echo "uid=$(id -u) gid=$(id -g) $PWD"'
check "worker image: the CPU build (no CUDA libraries)" 0 "" -- \
  "$S" sh "$WK" sh -c '! ldd /usr/local/bin/cephalo-worker | grep -E "libcuda|libcublas|libnccl"'
check "worker image: 2-step CPU training of tiny-gpt on synthetic data (the entry point)" 0 "step 2/2" -- \
  "$S" run "$WK" train --model tiny-gpt --batch 4 --microbatch 2 --seq 32 --threads 2 --steps 2 \
    --data synthetic --ckpt-dir /checkpoints
check "worker image: the checkpoint in /checkpoints is written by uid 10001" 0 \
  "10001:10001 /checkpoints/step_00000002.safetensors" -- "$S" sh "$WK" sh -c 'cephalo-worker train --data synthetic \
    --model tiny-gpt --batch 4 --microbatch 2 --seq 32 --threads 2 --steps 2 --ckpt-dir /checkpoints \
    >/dev/null 2>&1; stat -c "%u:%g %n" /checkpoints/step_00000002.safetensors'
check "worker image: the cephalo CLI plans" 0 "cephalo plan: tiny-gpt" -- \
  "$S" sh "$WK" sh -c 'cat >/tmp/cluster.yaml && cephalo plan --cluster /tmp/cluster.yaml --model tiny-gpt --batch 4 --seq 32' \
  <examples/clusters/local-cpu.yaml

# warm: nothing changed, so the build is a no-op (its stamp: the same inputs, the same images)
start=$SECONDS
"$S" build operator worker-cpu >"$T/tags2" 2>"$T/build2.log"
rc=$?
warm=$((SECONDS - start))
check "a rebuild of the unchanged tree is a no-op ($warm s; the first build: $cold s)" 0 "" -- \
  bash -c "[ $rc = 0 ] && cmp -s '$T/tags' '$T/tags2' && [ \$(grep -c 'is up to date' '$T/build2.log') = 2 ] && [ $warm -le 30 ]"
# and buildah's layer cache, which serves any change (a source edit reruns COPY and make only): the
# operator once more through buildah bud, every RUN/COPY step from the cache, the same image
id1=$("$S" buildah inspect --type image --format '{{.FromImageID}}' "$OP")
start=$SECONDS
CEPHALO_IMAGES_REBUILD=1 "$S" build operator >"$T/tags3" 2>"$T/build3.log"
rc=$?
check "buildah's layer cache: no RUN/COPY step runs again ($((SECONDS - start)) s)" 0 "(0 RUN/COPY steps ran" -- \
  bash -c "[ $rc = 0 ] && cat '$T/build3.log'"
check "... and makes the same image" 0 "$id1" -- "$S" buildah inspect --type image --format '{{.FromImageID}}' "$OP"
