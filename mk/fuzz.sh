#!/usr/bin/env bash
# Runs libFuzzer targets (built by `make fuzz`) for FUZZ_SECONDS each, FUZZ_JOBS at a time (default:
# the cores; libFuzzer runs one process on one core, so two targets side by side on two cores each
# get the executions they would get alone, in half the wall time).
#
#   FUZZ_SECONDS=60 FUZZ_JOBS=2 mk/fuzz.sh build/fuzz/fuzz_cluster build/fuzz/fuzz_model ...
#
# Each target fuzz_NAME starts from the committed seeds in fuzz/seeds/NAME, copied into a scratch
# corpus build/fuzz/corpus-NAME that keeps what earlier runs found. The full log goes to
# build/fuzz/NAME.log and crash/leak/timeout reproducers to build/fuzz/NAME-crash-<sha1> etc.
# Prints one summary line per target, in the order given; exits 1 if any target found a problem.
set -uo pipefail

FUZZ_SECONDS=${FUZZ_SECONDS:-60}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc)}
OUTDIR=build/fuzz
if [ $# -eq 0 ]; then
  echo "usage: FUZZ_SECONDS=N [FUZZ_JOBS=J] $0 build/fuzz/fuzz_NAME..." >&2
  exit 2
fi
mkdir -p "$OUTDIR"

# fuzz_one BIN: runs it; its summary lines into OUTDIR/NAME.summary, its exit status as the result
fuzz_one() {
  local bin=$1 base name seeds corpus log rc runs cov corp artifact kind result
  base=$(basename "$bin")
  name=${base#fuzz_}
  seeds=fuzz/seeds/$name
  corpus=$OUTDIR/corpus-$name
  log=$OUTDIR/$name.log
  mkdir -p "$corpus"
  [ -d "$seeds" ] && cp -f "$seeds"/* "$corpus"/ 2>/dev/null
  local seed_args=()
  [ -d "$seeds" ] && seed_args=("$seeds")

  "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$OUTDIR/$name-" "$corpus" "${seed_args[@]}" >"$log" 2>&1
  rc=$?

  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n1)
  corp=$(grep -oE 'corp: [0-9]+/[0-9]+[a-zA-Z]*' "$log" | tail -n1)
  artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n1)
  if [ "$rc" -eq 0 ]; then
    result=ok
  else
    kind=$(grep -oE 'ERROR: (AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer|libFuzzer): [a-zA-Z-]+' "$log" | head -n1)
    [ -z "$kind" ] && kind=$(grep -oE 'runtime error: .*' "$log" | head -n1)
    result="FAILED (exit $rc${kind:+: $kind})"
  fi
  {
    printf 'fuzz %s: %s runs, %s, %s -> %s\n' "$name" "${runs:-?}" "${cov:-cov: ?}" "${corp:-corp: ?}" "$result"
    if [ "$rc" -ne 0 ]; then
      if [ -n "$artifact" ]; then
        echo "fuzz $name: reproducer written to $artifact (replay: $bin $artifact)"
      else
        echo "fuzz $name: no reproducer written; see $log"
      fi
      grep -E '^ *#[0-9]+ 0x' "$log" | head -n 8 | sed "s/^/fuzz $name:   /"
    fi
  } >"$OUTDIR/$name.summary"
  return "$rc"
}

pids=()
for bin in "$@"; do
  while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do wait -n; done
  name=$(basename "$bin")
  echo "fuzz ${name#fuzz_}: running for ${FUZZ_SECONDS}s (log: $OUTDIR/${name#fuzz_}.log)"
  fuzz_one "$bin" &
  pids+=($!)
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed=1
  name=$(basename "${@:i+1:1}")
  cat "$OUTDIR/${name#fuzz_}.summary"
done
exit $failed
