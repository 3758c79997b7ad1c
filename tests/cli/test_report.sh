#!/usr/bin/env bash
# CLI tests of `cephalo report` (docs/report.md): the page of a real 3-rank `cephalo run` on CPU
# devices has one point per logged step in every curve, the logs' values, the plan's numbers in
# its bars and tables, nothing fetched from the network, every string escaped; bad run directories
# and log lines are named; the page never lands on a run's own file; headless Chromium (Debian's
# `chromium`, make deps) renders it: the DOM has the charts and a screenshot shows the curves.
set -u
B=${BUILD:-build/rel}/bin
C=$B/cephalo
PY=/usr/bin/python3
CHK="$PY $(dirname "$0")/report_check.py"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/lib.sh"
unset CEPHALO_WORKER CEPHALO_METRICS_PORT

# pass NAME COMMAND...: ok with the command's last line, else not ok with its output
pass() {
  local name=$1 out
  shift
  n=$((n + 1))
  if out=$("$@" 2>&1); then echo "ok $n - $name ($(tail -1 <<<"$out"))"; else
    echo "not ok $n - $name"; echo "$out" | tail -5 | sed 's/^/#   /'; fi
}

cat >"$T/job.yaml" <<'EOF'
name: report-test
model: tiny-gpt
data: synthetic
batch: 12
seq: 32
steps: 16
validation: {data: synthetic, every: 5, samples: 12}
devices:
  - {type: cpu, threads: 1, memory: 256M}
  - {type: cpu, threads: 1, memory: 64M, count: 2}
EOF
R=$T/run
check "a 3-rank run" 0 "summary:" -- "$C" run "$T/job.yaml" --run-dir "$R" --quiet
check "report -o FILE" 0 "report: $T/r.html" -- "$C" report "$R" -o "$T/r.html"
pass "the page: curves, bars, tables against the logs and plan.json" $CHK page "$T/r.html" "$R"
check "default output RUN_DIR/report.html" 0 "report: $R/report.html" -- "$C" report "$R"
assert "the default page is the same page" cmp "$R/report.html" "$T/r.html"
check "-o - writes stdout" 0 '<svg id="loss"' -- "$C" report "$R" -o -
# the checker itself refuses a page whose curve lost a point
sed 's/\(class="train-loss"[^>]*points="\)[^ ]* /\1/' "$T/r.html" >"$T/cut.html"
check "the checker notices a missing point" 1 "train loss: 15 points, the log has 16 steps" -- $CHK page "$T/cut.html" "$R"

# every string is escaped: a run directory whose name is markup
E=$T/'x<b>&"y'"'"
cp -r "$R" "$E"
check "a run directory named x<b>&\"y'" 0 "report:" -- "$C" report "$E" -o "$T/e.html"
check "its name is escaped" 0 "x&lt;b&gt;&amp;&quot;y&#39;" -- cat "$T/e.html"
assert "no raw markup from it" bash -c "! grep -qF 'x<b>' '$T/e.html'"

# ---- bad input: named ----

check "no RUN_DIR" 2 "missing RUN_DIR" -- "$C" report
check "two operands" 2 "one run directory expected, got 2" -- "$C" report "$R" "$R"
check "no such directory" 2 "$T/none: " -- "$C" report "$T/none" -o "$T/x.html"
mkdir "$T/empty"
check "no plan.json" 2 "$T/empty/plan.json: cannot open" -- "$C" report "$T/empty" -o "$T/x.html"
bad() { rm -rf "$T/bad"; cp -r "$R" "$T/bad"; rm -f "$T/bad/report.html"; }
bad
$PY -c 'import json,sys; p=json.load(open(sys.argv[1])); del p["ranks"][1]["microbatch"]; json.dump(p, open(sys.argv[1], "w"))' "$T/bad/plan.json"
check "plan.json without ranks[1].microbatch" 2 "plan.json: ranks[1]: missing field 'microbatch'" -- "$C" report "$T/bad" -o "$T/x.html"
bad
echo '{"format": "cephalo-plan",' >"$T/bad/plan.json"
check "plan.json cut short" 2 "plan.json:" -- "$C" report "$T/bad" -o "$T/x.html"
bad
rm "$T/bad/rank-2.jsonl"
check "no rank-2.jsonl" 2 "bad/rank-2.jsonl: cannot open" -- "$C" report "$T/bad" -o "$T/x.html"
bad
sed -i '3s/.*/garbage here/' "$T/bad/rank-1.jsonl"
check "a line that is not JSON" 2 "rank-1.jsonl:3: not a JSON object" -- "$C" report "$T/bad" -o "$T/x.html"
bad
sed -i '3s/^{/{"loss":1,/' "$T/bad/rank-1.jsonl"
check "a line with a key twice (readers differ on which one counts)" 2 "rank-1.jsonl:3: not a JSON object (a step record of docs/worker.md \"Output\"): line: field 'loss' appears twice" -- "$C" report "$T/bad" -o "$T/x.html"
bad
sed -i '4s/"loss":[^,]*/"loss":"low"/' "$T/bad/rank-1.jsonl"
check "a loss that is not a number" 2 "rank-1.jsonl:4: loss: expected" -- "$C" report "$T/bad" -o "$T/x.html"
bad
: >"$T/bad/rank-0.jsonl"
check "no step logged yet" 2 "rank-0.jsonl: no step record yet" -- "$C" report "$T/bad" -o "$T/x.html"
bad
sed -i '5s/"loss":[^,]*/"loss":null/' "$T/bad/rank-0.jsonl"
check "a null loss (not finite) is a gap in the curve" 0 "report:" -- "$C" report "$T/bad" -o "$T/x.html"
pass "... the page has the other steps' losses" $CHK page "$T/x.html" "$T/bad"
bad
printf '{"step":16,"loss":' >>"$T/bad/rank-0.jsonl"
check "a line still being written is left out" 0 "report:" -- "$C" report "$T/bad" -o "$T/x.html"
pass "... and the page has the complete steps" $CHK page "$T/x.html" "$R"
assert "a refused report leaves no file" test ! -e "$T/bad/report.html"

# ---- a long run: 3 ranks x 1,000,000 steps ----

# The logs are streamed (docs/report.md, "Long runs"): time linear in the lines, memory a line
# buffer and the curves' points whatever the length. The figures are printed; the time is a
# ceiling only a quadratic pass breaks (about 3 s here, where the insertion sort of median_ms
# took 13 s for 20,000 lines and would take hours for a million), and the memory bound is 32 MiB
# against logs of 100 MB a rank. The sanitizer run (3-10x slower, its memory its own) reads 100,000
# lines a rank and bounds only the time.
lines=1000000 max_mib=32
case "${BUILD:-build/rel}" in *san*) lines=100000 max_mib=0 ;; esac
L=$T/long
mkdir "$L" && cp "$R/plan.json" "$L/"
pass "$lines step records a rank, written by awk" $CHK gen "$L" $lines
pass "cephalo report of 3 x $lines lines: wall time and peak memory" bash -c '
  t0=$(date +%s.%N); timeout 60 "$1" report "$2" -o "$3" >/dev/null 2>"$3.err"; rc=$?
  exec '"$CHK"' rusage $rc $t0 60 '$max_mib' "$3.err"' _ "$C" "$L" "$T/long.html"
pass "... medians against a sort in Python, peaks, step counts, curves of at most 4,000 points" $CHK big "$T/long.html" "$L" $lines
rm -rf "$L"
printf '{"step":0,"loss":1,"step_ms":1,"samples_per_s":1,"peak_bytes":1}\n' >"$T/bad/rank-0.jsonl"
head -c 1100000 /dev/zero | tr '\0' ' ' >>"$T/bad/rank-0.jsonl"
echo >>"$T/bad/rank-0.jsonl"
check "a line of more than 1 MiB is refused, named" 2 "rank-0.jsonl:2: a line longer than 1 MiB" -- "$C" report "$T/bad" -o "$T/x.html"

# ---- outputs: never one of the run's files ----

cp "$R/plan.json" "$T/plan.before"
check "-o RUN_DIR/plan.json refused" 2 "plan.json" -- "$C" report "$R" -o "$R/plan.json"
assert "plan.json unchanged" cmp "$R/plan.json" "$T/plan.before"
check "-o RUN_DIR/rank-0.jsonl refused" 2 "rank-0.jsonl" -- "$C" report "$R" -o "$R/rank-0.jsonl"
check "--help" 0 "usage: cephalo report RUN_DIR" -- "$C" report --help
check "cephalo --help lists report" 0 "report    one self-contained HTML page" -- "$C" --help

# ---- headless Chromium ----

CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then
  echo "# skip: headless Chromium tests: no chromium binary (make deps installs Debian's chromium)"
else
  # no sandbox: the test may run as root in a container; no GPU; no profile of the user's
  CH=(timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --hide-scrollbars --no-first-run
      --user-data-dir="$T/chrome" --disable-extensions)
  check "chromium --dump-dom" 0 "" -- bash -c '"$@" --dump-dom "file://'"$T"'/r.html" >"'"$T"'/dom.html" 2>/dev/null' _ "${CH[@]}"
  pass "the rendered DOM has the charts" $CHK dom "$T/dom.html"
  check "chromium --screenshot" 0 "" -- "${CH[@]}" --screenshot="$T/shot.png" --window-size=1000,900 "file://$T/r.html"
  pass "the screenshot shows the curves" $CHK png "$T/shot.png"
fi
