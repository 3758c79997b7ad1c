#!/usr/bin/env bash
# test_structure.sh - mk/structure.py, the structure facts the notes quote (docs/development.md,
# "Structure"): on a small tree made here, the functions' lengths head to closing brace, the
# longest file, the files per folder and the raw cJSON reads split into the reconcile logic and
# the decoders (the views); on this tree, that it runs and finds no file circle.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
BUILD=${BUILD:-build/rel}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

mkdir -p "$T/a" "$T/operator" "$T/tests"
printf 'static int f(int x) {\n    return x;\n}\nint g(void) {\n    int y = 1;\n    y++;\n    return y;\n}\n' >"$T/a/x.c"
printf 'int h(void) {\n    return 0;\n}\n' >"$T/a/y.c"
printf 'int t(void) {\n    return 0;\n}\n' >"$T/tests/t.c" # tests are left out
printf 'int r(const cJSON *o) {\n    return get_num(get(o, "a"), "b", 0) + cJSON_GetArraySize(o);\n}\n' >"$T/operator/rec_x.c"
printf 'int v(const cJSON *o) {\n    return get_num(o, "c", 0); /* get_str(o, "d") in a comment */\n}\n' >"$T/operator/rec_view.c"
measure() { python3 mk/structure.py --root "$T"; }
check "functions counted head to closing brace, tests left out" 0 "functions: 5, median 3 lines" -- measure
check "the longest function first" 0 "longest functions: g (a/x.c) 5, v (operator/rec_view.c) 3" -- measure
check "the longest file first" 0 "longest files: a/x.c 8" -- measure
check "files per folder" 0 "  a/                       2" -- measure
check "raw reads: all, and those of the reconcile logic (comments not counted)" 0 \
  "raw cJSON reads in the operator's controller: 4, in its reconcile logic (rec_*.c, reconcile.c, less the views): 3" -- measure
check "this tree: no file circle" 0 "file circles: 0" -- python3 mk/structure.py "$BUILD"
check "a bad option is refused" 2 "unrecognized arguments" -- python3 mk/structure.py --nope
