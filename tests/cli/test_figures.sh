#!/usr/bin/env bash
# test_figures.sh - docs/figures.md, the table of every measured figure the README and docs quote,
# cannot drift from the docs (issue 31): each row's quoted words are still in the file it names,
# its commands exist (make targets, repository paths, bench binaries, the variables they set), and
# it carries a date. tests/cli/figures_check.py does the checking; the cases below make sure it
# fails on each kind of drift, on a copy of the repository's files.
set -u
cd "$(dirname "$0")/../.." || exit 1
. tests/cli/lib.sh
san_once # runs none of $BUILD's binaries
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
PY=/usr/bin/python3
CHK=tests/cli/figures_check.py

check "every figure in docs/figures.md is quoted where it says, with its command and date" 0 "figures checked" -- \
  $PY $CHK .
rows=$($PY $CHK . | grep -Eo '^[0-9]+')
assert "the table lists the README's headline figures (at least 10 rows)" test "${rows:-0}" -ge 10
for f in "1.01x in" "9 ms in" "about a third of PyTorch eager" "2.1 s after" "6.7 to 9.1 s"; do
  assert "the table quotes the README's \"$f\"" grep -qF "$f" docs/figures.md
done

# a copy of what the checker reads, as symlinks; a case replaces one file with a changed copy
fresh() {
  rm -rf "$T/r" && mkdir -p "$T/r" && cp -rs "$PWD"/{README.md,Makefile,docs,bench,mk,docker,examples} "$T/r/"
}
changed() {   # changed FILE SED-EXPRESSION
  rm -f "$T/r/$1" && sed "$2" "$PWD/$1" >"$T/r/$1"
}
fresh
check "the copy of the repository passes as the repository does" 0 "figures checked" -- $PY $CHK "$T/r"
changed README.md 's/1\.01x in `bench/1.05x in `bench/'
check "a README figure changed without the table fails, naming the file and the words" 1 \
  'README.md no longer says "1.01x in `bench/bench_train.sh`"' -- $PY $CHK "$T/r"
fresh
changed docs/operator.md 's/\*\*2\.89 s\*\* (2\.47 to 3\.38)/**2.95 s** (2.47 to 3.38)/'
check "a figure inside a docs table changed fails" 1 "docs/operator.md no longer says" -- $PY $CHK "$T/r"
fresh
changed Makefile 's/^bench-operator:/bench-op:/'
check "a make target the table names, renamed, fails" 1 "the Makefile has no target bench-operator" -- $PY $CHK "$T/r"
fresh
changed Makefile 's/^\$(BENCH_CRC): /$(BENCH_CRC)x: /; s/BENCH_CRC := \$(BUILD)\/bench\/bench_crc/BENCH_CRC := $(BUILD)\/bench\/crc/'
check "a bench binary the Makefile no longer builds fails" 1 "build/rel/bench/bench_crc is not built by the Makefile" -- \
  $PY $CHK "$T/r"
fresh
rm "$T/r/bench/bench_train.sh"
check "a script the table names, removed, fails" 1 "bench/bench_train.sh does not exist" -- $PY $CHK "$T/r"
fresh
changed docs/figures.md 's/BENCH_OP_ROUNDS=3`; /BENCH_OP_RUNDS=3`; /'
check "a variable no script reads fails" 1 "reads BENCH_OP_RUNDS" -- $PY $CHK "$T/r"
fresh
changed docs/figures.md 's/| 2-core, 2026-11-22 (6\.42 MB again on 2026-11-28) |/| 2-core |/'
check "a row without a date fails" 1 "no date (YYYY-MM-DD)" -- $PY $CHK "$T/r"
fresh
changed docs/figures.md 's/^## The figures$/## Figures/'
check "a table the checker cannot find fails rather than passing empty" 1 'no rows under "## The figures"' -- \
  $PY $CHK "$T/r"
