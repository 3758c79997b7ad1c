#!/usr/bin/env bash
# Builds the container images from docker/Dockerfile.* without a Docker engine or a container
# registry: Debian's buildah (vfs storage, chroot isolation) builds FROM a local Debian bookworm
# base image that mmdebstrap makes from the Debian archive. The Dockerfiles stay the build
# description; this script only passes their BUILD_IMAGE/BASE_IMAGE (and CUDA=0) arguments.
#
#   docker/build-images.sh [build] [IMAGE...]   build (default: operator worker-cpu), print the tags
#   docker/build-images.sh run IMAGE [ARG...]   run IMAGE's entry point with ARGs (as the image's
#                                               USER, in its WORKDIR), e.g. run cephalo-operator:0.1.0 --help
#   docker/build-images.sh sh IMAGE CMD...      run CMD in IMAGE instead of the entry point
#   docker/build-images.sh save IMAGE FILE      write IMAGE to FILE as a docker-archive tarball
#                                               (docker load, kind load image-archive, ctr image import)
#   docker/build-images.sh buildah ARG...       buildah with this script's storage (images, inspect, push)
#   docker/build-images.sh tags                 print the tags the build makes
#   docker/build-images.sh clean                remove the cache (base tarballs and image storage)
#
# IMAGE for build: operator (localhost/cephalo-operator:VERSION), worker-cpu
# (localhost/cephalo-worker:VERSION-cpu, Dockerfile.worker with CUDA=0 on the Debian base), or
# worker-cuda (localhost/cephalo-worker:VERSION: Dockerfile.worker's defaults, FROM nvidia/cuda;
# needs a registry that serves nvidia/cuda, so not here). VERSION: the first line of ./VERSION,
# else 0.1.0.
#
# Caching (everything under $CEPHALO_IMAGES_CACHE, else ~/.cache/cephalo-images):
#   debian-bookworm-KEY.tar   the mmdebstrap root filesystem (minbase, slim: no man pages, docs or
#                             locales, like debian:bookworm-slim; ~120 MB); KEY hashes the
#                             mmdebstrap command line, so a changed package list or option makes a
#                             new one. Imported once as localhost/cephalo-debian:bookworm-KEY.
#   storage/, run/            buildah's --root and --runroot (not /var/lib/containers); builds use
#                             --layers: a source change reruns only COPY and make (the apt layers
#                             stay), a change elsewhere (docs, tests) no step at all (the
#                             Dockerfiles' own .dockerignore lets only make's inputs in).
#   stamp-IMAGE               the inputs of the last build of IMAGE (the tree's content, the
#                             Dockerfile's arguments, the base image, buildah's version) and the
#                             image made: with the same inputs and image, `build` skips buildah
#                             altogether (seconds; CEPHALO_IMAGES_REBUILD=1 runs it anyway).
# Stale layers of earlier source trees are pruned after each build.
# The archive is $CEPHALO_IMAGES_MIRROR, else http://deb.debian.org/debian (security updates
# from $CEPHALO_IMAGES_SECURITY, else the mirror's -security); the builds' apt-get uses the same.
#
# Needs root (buildah's vfs storage and chroot isolation as an unprivileged user need subuids and
# user namespaces; not done here). buildah and mmdebstrap are installed with apt-get when missing.
# Exit status 3: cannot build here (not root, the packages cannot be installed, or the archive is
# unreachable); 1: a build failed; 2: usage.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${CEPHALO_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephalo-images}
MIRROR=${CEPHALO_IMAGES_MIRROR:-http://deb.debian.org/debian}
SECURITY=${CEPHALO_IMAGES_SECURITY:-${MIRROR%/}-security}
VERSION=$( { head -n 1 VERSION 2>/dev/null || true; } | tr -d '[:space:]')
VERSION=${VERSION:-0.1.0}
B=(buildah --root "$CACHE/storage" --runroot "$CACHE/run" --storage-driver vfs)
export BUILDAH_ISOLATION=chroot
log() { echo "build-images.sh: $*" >&2; }
cannot() { log "$*"; exit 3; }

# -- the base: mmdebstrap's command line is the cache key ------------------------------------------
SUITE=bookworm
MM=(mmdebstrap --variant=minbase --format=tar
    --aptopt='Acquire::Languages "none"'
    # slim, as Docker's debian:bookworm-slim: dpkg leaves these out, now and in the images' apt-get
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*'
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias'
    --dpkgopt='path-exclude=/usr/share/lintian/*'
    # the layout of the result: no apt lists (the Dockerfiles run apt-get update)
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin'
    "$SUITE" OUT
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY $SUITE-security main")
KEY=$(printf '%s\n' "cephalo-images base 1" "${MM[@]}" | sha256sum | cut -c1-12)
TARBALL=$CACHE/debian-$SUITE-$KEY.tar
BASE=localhost/cephalo-debian:$SUITE-$KEY

tag_of() {
  case $1 in
    operator) echo "localhost/cephalo-operator:$VERSION" ;;
    worker-cpu) echo "localhost/cephalo-worker:$VERSION-cpu" ;;
    worker-cuda) echo "localhost/cephalo-worker:$VERSION" ;;
    *) log "unknown image '$1' (operator, worker-cpu, worker-cuda)"; exit 2 ;;
  esac
}

need_tools() {
  local missing=() t
  for t in buildah mmdebstrap; do command -v "$t" >/dev/null || missing+=("$t"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$CACHE/apt.log" 2>&1 ||
    { tail -5 "$CACHE/apt.log" >&2; cannot "could not install ${missing[*]}"; }
}

reachable() { timeout 30 /usr/lib/apt/apt-helper download-file "$MIRROR/dists/$SUITE/Release" "$CACHE/.probe" >/dev/null 2>&1; local rc=$?; rm -f "$CACHE/.probe"; return $rc; }

ensure_base() {
  if [ ! -s "$TARBALL" ]; then
    reachable || cannot "the Debian archive $MIRROR is unreachable"
    log "making the Debian $SUITE base with mmdebstrap (once per package list; about a minute)"
    local tmp=$CACHE/.base-$$.tar mm=("${MM[@]}")
    mm[${#mm[@]} - 4]=$tmp
    "${mm[@]}" >"$CACHE/mmdebstrap.log" 2>&1 || { tail -5 "$CACHE/mmdebstrap.log" >&2; rm -f "$tmp"; log "mmdebstrap failed"; exit 1; }
    mv "$tmp" "$TARBALL"
    # older bases (another package list) go
    find "$CACHE" -maxdepth 1 -name "debian-$SUITE-*.tar" ! -name "${TARBALL##*/}" -delete
  fi
  if ! "${B[@]}" inspect --type image "$BASE" >/dev/null 2>&1; then
    log "importing $TARBALL as $BASE"
    local c
    c=$("${B[@]}" from --pull-never scratch)
    "${B[@]}" add "$c" "$TARBALL" / >/dev/null
    "${B[@]}" config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      --cmd bash --label org.opencontainers.image.title="Debian $SUITE (mmdebstrap $KEY)" "$c"
    "${B[@]}" commit -q --rm "$c" "$BASE" >/dev/null
  fi
}

build_one() {
  local what=$1 tag file args=()
  tag=$(tag_of "$what")
  case $what in
    operator) file=docker/Dockerfile.operator; args=(--build-arg "BUILD_IMAGE=$BASE" --build-arg "BASE_IMAGE=$BASE" --pull-never) ;;
    worker-cpu) file=docker/Dockerfile.worker; args=(--build-arg CUDA=0 --build-arg GPU_DEVICES=void --build-arg "BUILD_IMAGE=$BASE" --build-arg "BASE_IMAGE=$BASE" --pull-never) ;;
    worker-cuda) file=docker/Dockerfile.worker ;;   # nvidia/cuda from its registry
  esac
  # the Dockerfile's own ignore file (only the sources make reads), as BuildKit would use it
  [ -f "$file.dockerignore" ] && args+=(--ignorefile "$CTX/$file.dockerignore")
  # nothing changed since the last build of this image (the same tree, Dockerfile, arguments, base
  # image and buildah): no buildah bud at all, which would still copy every stage's image (vfs)
  local key stamp=$CACHE/stamp-$what id
  key=$(printf '%s\n' "stamp 1" "$CTXKEY" "$what" "$file" "${args[@]}" "$(buildah --version)" \
        "$(image_id "$BASE")" | sha256sum | cut -c1-64)
  if [ -z "${CEPHALO_IMAGES_REBUILD:-}" ] && [ -f "$stamp" ] && [ "$(head -n 1 "$stamp")" = "$key" ] &&
     id=$(image_id "$tag") && [ "$(sed -n 2p "$stamp")" = "$id" ]; then
    log "$tag is up to date (no input changed since it was built)"
    echo "$tag"; return 0
  fi
  rm -f "$stamp"
  local start=$SECONDS blog=$CACHE/build-$what.log
  log "building $tag from $file"
  # the build stage gets a tag of its own, so that pruning keeps its layers (the final image is
  # not based on them); both builds read the same snapshot of the tree
  if ! "${B[@]}" bud --layers --isolation chroot "${args[@]}" -f "$CTX/$file" --target build -t "$tag-build" "$CTX" >"$blog" 2>&1 ||
     ! "${B[@]}" bud --layers --isolation chroot "${args[@]}" -f "$CTX/$file" -t "$tag" "$CTX" >>"$blog" 2>&1; then
    tail -20 "$blog" >&2
    reachable || cannot "the build of $tag failed and the Debian archive $MIRROR is unreachable"
    log "the build of $tag failed (log: $blog)"; exit 1
  fi
  # a RUN/COPY/ADD step not followed by "Using cache" ran
  local ran
  ran=$(awk '/STEP [0-9]+\/[0-9]+: (RUN|COPY|ADD) /{s=1; next} s{if ($0 !~ /^--> Using cache/) n++; s=0} END{print n+0}' "$blog")
  log "$tag built in $((SECONDS - start)) s ($ran RUN/COPY steps ran, the others came from the cache)"
  printf '%s\n%s\n' "$key" "$(image_id "$tag")" >"$stamp"
  echo "$tag"
}

image_id() { "${B[@]}" inspect --type image --format '{{.FromImageID}}' "$1" 2>/dev/null; }

run_in() {   # run_in entrypoint|sh IMAGE ARGS...
  local mode=$1 image=$2 c rc=0 ep=()
  shift 2
  need_tools
  if [ "$mode" = entrypoint ]; then
    read -r -a ep < <("${B[@]}" inspect --type image --format '{{range .OCIv1.Config.Entrypoint}}{{.}} {{end}}' "$image") || true
    [ ${#ep[@]} -gt 0 ] || { log "$image has no entry point"; exit 1; }
  fi
  c=$("${B[@]}" from --pull-never "$image")
  "${B[@]}" run --isolation chroot "$c" -- "${ep[@]}" "$@" || rc=$?
  "${B[@]}" rm "$c" >/dev/null
  return $rc
}

cmd=${1:-build}
[ $# -gt 0 ] && shift
case $cmd in tags|clean|help|-h|--help) ;; *) [ "$(id -u)" = 0 ] || cannot "needs root (buildah with vfs storage and chroot isolation)" ;; esac
mkdir -p "$CACHE"
case $cmd in
  build)
    [ $# -gt 0 ] || set -- operator worker-cpu
    for w in "$@"; do tag_of "$w" >/dev/null; done
    need_tools
    exec 9>"$CACHE/lock"; flock 9   # one build at a time per cache
    case " $* " in *" operator "*|*" worker-cpu "*) ensure_base ;; esac
    # the build context: a snapshot of the tree (what .dockerignore keeps out, buildah leaves out
    # again), so that a file edited during the build cannot make its two halves differ
    CTX=$CACHE/context
    rm -rf "$CTX"; mkdir -p "$CTX"
    tar -C . --exclude=./.git --exclude=./build --exclude=./runs --exclude='./fuzz/corpus-*' -cf - . | tar -C "$CTX" -xf -
    # its content (names, modes, bytes; not times): the up-to-date check's key
    CTXKEY=$(tar -C "$CTX" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -cf - . | sha256sum | cut -c1-64)
    for w in "$@"; do build_one "$w"; done
    # layers no tagged image uses any more (earlier source trees); repeated, as each pass frees
    # the parents of what the last one removed
    for _ in 1 2 3 4 5 6; do
      [ -n "$("${B[@]}" images --all --filter dangling=true -q 2>/dev/null)" ] || break
      "${B[@]}" rmi --prune >/dev/null 2>&1 || break
    done ;;
  run) [ $# -ge 1 ] || exit 2; run_in entrypoint "$@" ;;
  sh) [ $# -ge 2 ] || exit 2; run_in sh "$@" ;;
  save) [ $# -eq 2 ] || exit 2; need_tools; rm -f "$2"; "${B[@]}" push -q "$1" "docker-archive:$2:$1" ;;
  buildah) need_tools; exec "${B[@]}" "$@" ;;
  tags) for w in operator worker-cpu worker-cuda; do echo "$w $(tag_of $w)"; done; echo "base $BASE" ;;
  clean)
    if command -v buildah >/dev/null && [ -d "$CACHE/storage" ]; then "${B[@]}" rmi --all --force >/dev/null 2>&1 || true; fi
    rm -rf "$CACHE" ;;
  help|-h|--help) sed -n '/^#   docker/p' "$0"; exit 0 ;;
  *) sed -n '/^#   docker/p' "$0" >&2; exit 2 ;;
esac
