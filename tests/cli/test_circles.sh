#!/usr/bin/env bash
# test_circles.sh - no file circles beyond the listed ones (docs/development.md, "Layers";
# mk/circles.py --allow mk/circles.allow): the build keeps it, and the checker, on small objects
# built here, catches a new circle and a listed one grown by a file, allows a listed one whole or
# shrunk, names a listed one that is gone, passes over one whose objects are not built (the .cu
# objects exist only where CUDA is built), and leaves out a stale object (its source gone).
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
BUILD=${BUILD:-build/rel}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

check "the build: no circle but the listed ones" 0 ", 0 not allowed" -- \
  python3 mk/circles.py --allow mk/circles.allow "$BUILD"

# obj FILE CALLS...: $T/b/FILE.o defining FILE's own function and calling those of CALLS. FILE
# names a source of the tree (planner/cost: planner/cost.c): objects of no source are stale and
# left out.
fn() { local f=${1##*/}; echo "f_${f%.cu}"; }
obj() {
  local f=$1 src="" c
  shift
  for c in "$@"; do src+="void $(fn "$c")(void); "; done
  src+="void $(fn "$f")(void); void $(fn "$f")(void) {"
  for c in "$@"; do src+=" $(fn "$c")();"; done
  mkdir -p "$T/b/$(dirname "$f")" && printf '%s }\n' "$src" | cc -x c -c - -o "$T/b/$f.o"
}
fresh() { rm -rf "$T/b" && mkdir -p "$T/b"; }
allow() { printf '# test\n' >"$T/allow" && printf '%s\n' "$@" >>"$T/allow"; }
circles() { python3 mk/circles.py --allow "$T/allow" "$T/b"; }
X=planner/cost Y=planner/gpu Z=planner/inputs

fresh && obj $X $Y && obj $Y $X && obj $Z $X
allow
check "a circle not listed is refused, with the symbols that close it" 1 "$X uses $Y: f_gpu" -- circles
allow "$X <-> $Y"
check "a listed circle is allowed" 0 "allowed circle: $X <-> $Y" -- circles
allow "$X <-> $Y <-> $Z"
check "a listed circle that shrank is allowed" 0 "allowed circle (shrunk): $X <-> $Y" -- circles

fresh && obj $X $Y && obj $Y $Z && obj $Z $X
allow "$X <-> $Y"
check "a listed circle grown by a file is refused" 1 "circle grew from $X <-> $Y: $X <-> $Y <-> $Z" -- circles

fresh && obj $X $Y && obj $Y && obj cli/job cli/report && obj cli/report cli/job
allow "$X <-> $Y" 'cli/job <-> cli/report'
check "a listed circle that is gone is named (its line can go)" 0 \
  "allow:2: no longer a circle: $X <-> $Y (remove the line)" -- circles

A=worker/devices/cuda_attention.cu B=worker/devices/cuda_device.cu
fresh && obj $A $B && obj $B $A
allow "$A <-> $B"
check "a circle of .cu objects is named by its .cu files" 0 "allowed circle: $A <-> $B" -- circles

fresh && obj worker/devices/device worker/devices/cpu_device && obj worker/devices/cpu_device worker/devices/device
allow 'worker/devices/cpu_device <-> worker/devices/device' "$A <-> $B"
check "a listed circle whose objects are not built here (no CUDA) is passed over" 0 ", 0 not allowed" -- circles
assert "... without being called gone" eval '! circles | grep -q "no longer a circle"'

fresh && obj $X planner/no_such_file && obj planner/no_such_file $X
allow
check "a stale object (its source gone) is left out: no false circle" 0 "circles: 0 among 1 files" -- circles

check "an allow file that cannot be read is an error" 2 "circles:" -- \
  python3 mk/circles.py --allow "$T/none" "$T/b"
check "a build folder without objects is an error" 2 "no objects under" -- \
  python3 mk/circles.py --allow "$T/allow" "$T/empty"
