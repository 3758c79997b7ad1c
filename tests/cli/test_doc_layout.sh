#!/usr/bin/env bash
# test_doc_layout.sh - docs/development.md's layout names every source file (mk/doc_layout.sh):
# the tree keeps it, and the checker catches, in a copy of the tree, a new source file, a file
# whose name the layout gives only in another folder, a header-only module, and a name left
# behind by a deleted file.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

check "the tree: the layout names every source file" 0 "layout names every source file" -- mk/doc_layout.sh

copy() { copy_tree "$T/tree" common planner cli operator worker docs mk; }

copy && printf 'int x;\n' >"$T/tree/cli/new_cmd.c"
check "a new source file is named, with the entry it belongs to" 1 \
  "cli/new_cmd.c: not in docs/development.md's layout (name it under cli's entry)" -- mk/doc_layout.sh "$T/tree"

copy && printf 'int x;\n' >"$T/tree/worker/comm/train.c"
check "a name the layout gives another layer does not count (train.c is model's and cmd's)" 1 \
  "worker/comm/train.c: not in" -- mk/doc_layout.sh "$T/tree"

copy && printf '#define X 1\n' >"$T/tree/planner/limits.h"
check "a header with no source of its own is named too" 1 "planner/limits.h: not in" -- mk/doc_layout.sh "$T/tree"

copy && printf '#define X 1\n' >"$T/tree/planner/gpu_extra.h" && printf 'int x;\n' >"$T/tree/planner/gpu_extra.c" &&
  sed -i 's|\<gpu\.c |gpu.c gpu_extra.c |' "$T/tree/docs/development.md" # beside gpu.c, in planner/'s entry
check "a header beside its source is covered by the source's entry" 0 "layout names every source file" -- mk/doc_layout.sh "$T/tree"

copy && rm "$T/tree/worker/devices/optime.c"
check "a name the layout keeps for a deleted file is refused" 1 \
  "worker/devices/optime.c: named in docs/development.md's layout, but there is no such file" -- mk/doc_layout.sh "$T/tree"
