#!/usr/bin/env bash
# doc_layout.sh - docs/development.md's "Layout" names every source file, so the map cannot drift
# from the tree (a file added without a word there is what this catches; issue 39 found five).
#
#   mk/doc_layout.sh [ROOT]   checks ROOT (default: the tree this script is in); prints one line per
#                             file the layout leaves out ("FILE: not in ...'s layout (name it under
#                             SECTION's entry)") and per name it gives that is no file, and exits 1
#                             if any
#
# The files: every .c and .cu of the source folders (common planner cli operator, and the worker's
# layers), and every header that has no .c or .cu of its name beside it (a header-only module such
# as common/half.h: the .c's entry covers its header). A file counts as named when its name is a
# word of its folder's section of the layout (the line that starts with the folder, "cli/", or for
# the worker its layer's line, "  model/", and the lines indented below it) or its path appears
# anywhere in the layout ("common/worker_cmd.c"). The section matters: worker/cmd/train.c and
# worker/model/train.c are two files, each named in its own layer. make test runs it
# (tests/cli/test_doc_layout.sh).
set -u
ROOT=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$ROOT" || exit 2
DOC=docs/development.md
[ -f "$DOC" ] || { echo "doc_layout: $DOC is missing" >&2; exit 2; }

# The layout block: the first ``` fence after "## Layout" to the next fence.
layout() { awk '/^## Layout/ {s = 1; next} s && /^```/ {if (in_b) exit; in_b = 1; next} in_b' "$DOC"; }

# "SECTION<TAB>WORD" for every file-like word of the layout, SECTION the folder it is listed under
# ("cli/", "worker/model/"); a word with a folder in it is recorded as a path ("<path>" section).
words() {
  layout | awk '
    function emit(w) {
      if (w ~ /\//) print "<path>\t" w
      else print sec "\t" w
    }
    /^[a-z][A-Za-z0-9_.-]*\/[ \t]/ || /^[a-z][A-Za-z0-9_.-]*\/$/ { split($1, a, " "); top = a[1]; sec = top; $1 = "" }
    /^  [a-z][A-Za-z0-9_-]*\/[ \t]/ && (top == "worker/" || top == "operator/") { sub(/^ +/, ""); sec = top $1; $1 = "" }
    { line = $0
      while (match(line, /[A-Za-z0-9_.\/-]+\.(c|cu|h)([^A-Za-z0-9_]|$)/)) {
        w = substr(line, RSTART, RLENGTH); sub(/[^A-Za-z0-9_]$/, "", w); emit(w)
        line = substr(line, RSTART + RLENGTH) } }'
}

# The files that must be named: .c and .cu, and headers without a source of their own.
sources() {
  find common planner cli operator worker -type f \( -name '*.c' -o -name '*.cu' -o -name '*.h' \) 2>/dev/null |
    LC_ALL=C sort | while IFS= read -r f; do
      case $f in
        *.h) stem=${f%.h}; [ -e "$stem.c" ] || [ -e "$stem.cu" ] || echo "$f" ;;
        *) echo "$f" ;;
      esac
    done
}

section_of() { # worker/model/train.c -> worker/model/; cli/run.c -> cli/
  case $1 in
    worker/*/*) local r=${1#worker/}; echo "worker/${r%%/*}/" ;;
    operator/*/*) local r=${1#operator/}; echo "operator/${r%%/*}/" ;;
    *) echo "${1%%/*}/" ;;
  esac
}

named=$(words | LC_ALL=C sort -u)
bad=0
while IFS= read -r f; do
  sec=$(section_of "$f")
  if grep -qxF -- "$sec	${f##*/}" <<<"$named" || grep -qxF -- "<path>	$f" <<<"$named"; then continue; fi
  echo "$f: not in $DOC's layout (name it under ${sec%/}'s entry)"
  bad=$((bad + 1))
done < <(sources)

# ... and the other way: a name the layout gives a source folder is a file there (one renamed or
# deleted leaves a stale word).
while IFS=$'\t' read -r sec w; do
  if [ "$sec" = "<path>" ]; then f=$w; else f=$sec$w; fi
  case $f in common/* | planner/* | cli/* | operator/* | worker/*) ;; *) continue ;; esac
  [ -e "$f" ] && continue
  echo "$f: named in $DOC's layout, but there is no such file"
  bad=$((bad + 1))
done <<<"$named"

if [ "$bad" -gt 0 ]; then
  echo "doc_layout: $bad difference(s) between the source files and $DOC's layout" >&2
  exit 1
fi
echo "doc_layout: $DOC's layout names every source file ($(sources | wc -l))"
