#!/usr/bin/env bash
# `cephalo report` on a long run (`make bench`): 3 ranks x 1,000,000 step records (LINES=...),
# written by tests/cli/report_check.py gen; the report's wall time and peak RSS. The logs are
# streamed (docs/report.md, "Long runs"): the time grows with the lines, the memory does not.
set -uo pipefail
BUILD=${BUILD:-build/rel}
LINES=${LINES:-1000000}
cd "$(dirname "$0")/.."
echo "== cephalo report of a long run (bench/bench_report.sh: 3 ranks x $LINES step records)"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
CEPHALO_PROFILE_STORE=none "$BUILD/bin/cephalo" plan --cluster examples/clusters/local-cpu.yaml --model tiny-gpt \
  --batch 12 --seq 32 -o "$T/plan.json" >/dev/null || exit 1
python3 tests/cli/report_check.py gen "$T" "$LINES" >/dev/null || exit 1
mb=$(du -sm "$T" | cut -f1)
# the measure is read by the Python the subshell becomes (report_check.py rusage says why)
( t0=$(date +%s.%N); timeout 600 "$BUILD/bin/cephalo" report "$T" -o "$T/r.html" >/dev/null 2>"$T/err"; rc=$?
  exec python3 tests/cli/report_check.py rusage $rc "$t0" 600 0 "$T/err" ) | sed "s/^/logs of $mb MB: /"
