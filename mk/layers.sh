#!/usr/bin/env bash
# layers.sh - the include rule of docs/development.md ("Layers"): every project header is included
# by its path, and no include runs from a lower room to a higher one.
#
#   mk/layers.sh [ROOT]      checks ROOT (default: the tree this script is in); prints one line per
#                            bad include, "FILE:LINE: ..." naming both rooms, and exits 1 if any
#
# The rooms and what each may include (besides itself):
#   common                 nothing else
#   planner                common
#   worker/formats         common planner                   (a leaf: the file codecs)
#   worker/devices         common planner formats
#   worker/comm            common planner formats devices
#   worker/model           ... comm
#   worker/state           ... model
#   worker/cmd             ... state                        (cmd > state > model > comm > devices)
#   cli                    common planner formats
#   operator/client        common                           (the Kubernetes client: transport,
#                                                            config, watches, caches, lease, work queue)
#   operator               common planner client            (the controller)
# Tests, benchmarks and fuzz targets may include any room. A header is named by its path:
# "common/log.h", "planner/model.h", inside the worker by its layer, "model/train.h" (the Makefile's
# -I. -Iworker). The build's generated header and a test's or benchmark's own header in its own
# folder are the only includes without a folder.
set -u
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT" || exit 2

# room -> the rooms it may include (itself included)
declare -A allowed=(
  [common]="common"
  [planner]="common planner"
  [formats]="common planner formats"
  [devices]="common planner formats devices"
  [comm]="common planner formats devices comm"
  [model]="common planner formats devices comm model"
  [state]="common planner formats devices comm model state"
  [cmd]="common planner formats devices comm model state cmd"
  [cli]="common planner formats cli"
  [client]="common client"
  [operator]="common planner client operator"
)
# the folder an include path starts with -> its room (worker layers are named without worker/)
known_room() { [ -n "${allowed[$1]+x}" ]; }

room_of_file() { # worker/model/train.c -> model; cli/run.c -> cli; tests/... -> "" (any)
  case $1 in
    worker/*/*) local r=${1#worker/}; echo "${r%%/*}" ;;
    worker/*) echo "worker-top" ;;
    operator/client/*) echo client ;;
    common/* | planner/* | cli/* | operator/*) echo "${1%%/*}" ;;
    *) echo "" ;;
  esac
}

bad=0
report() { echo "$1"; bad=$((bad + 1)); }

while IFS= read -r f; do
  room=$(room_of_file "$f")
  if [ "$room" = worker-top ]; then
    report "$f: a source file at worker/'s top; it belongs in one of its layers (formats devices comm model state cmd)"
    continue
  fi
  if [ -n "$room" ] && ! known_room "$room"; then
    report "$f: worker/$room is not a layer (formats devices comm model state cmd)"
    continue
  fi
  while IFS=: read -r line inc; do
    case $inc in
      cephalo_build_version.h) continue ;; # generated into the build directory
      */*) ;;
      *)
        # a header beside a test or benchmark (tests/unit/fake_http.h) may go by its name alone
        if [ -z "$room" ] && [ -f "$(dirname "$f")/$inc" ]; then continue; fi
        report "$f:$line: \"$inc\" is included by its name; include it by its path (e.g. \"common/log.h\", \"model/train.h\")"
        continue
        ;;
    esac
    to=${inc%%/*}
    case $inc in operator/client/*) to=client ;; esac
    if ! known_room "$to"; then
      report "$f:$line: \"$inc\": '$to/' is no room (common planner cli operator, or a worker layer)"
      continue
    fi
    [ -z "$room" ] && continue
    case " ${allowed[$room]} " in
      *" $to "*) ;;
      *) report "$f:$line: \"$inc\": $room may not include $to (it may include: ${allowed[$room]})" ;;
    esac
  done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]+"' "$f" | sed -E 's/^([0-9]+):[^"]*"([^"]*)".*/\1:\2/')
done < <(find common planner cli operator worker tests bench fuzz -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \) 2>/dev/null | sort)

if [ "$bad" -gt 0 ]; then
  echo "layers: $bad bad include(s) (the rule: docs/development.md, \"Layers\")" >&2
  exit 1
fi
echo "layers: every include goes by its path and downwards"
