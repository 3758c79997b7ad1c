#!/usr/bin/env bash
# Runs every test binary given on the command line and the CLI tests, then prints one summary
# line "N passed, N failed" counted over cmocka test cases and CLI checks.
set -u
# a developer's profile store (docs/profile.md) must not change what the tests plan
export CEPHALO_PROFILE_STORE=none
# ... nor `cephalo run`'s profiling before planning (tests/cli/test_run_profile.sh sets its own)
export CEPHALO_PROFILE_CACHE=none
passed=0
failed=0
failures=()
for t in "$@"; do
  t0=$SECONDS
  out=$(CMOCKA_MESSAGE_OUTPUT=stdout "$t" 2>&1)
  rc=$?
  p=$(grep -Eo '^\[  PASSED  \] [0-9]+ test' <<<"$out" | grep -Eo '[0-9]+' | head -1)
  f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' <<<"$out" | grep -Eo '[0-9]+' | head -1)
  p=${p:-0}
  f=${f:-0}
  if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; fi   # crashed before cmocka's summary
  passed=$((passed + p))
  failed=$((failed + f))
  if [ "$f" -ne 0 ]; then
    failures+=("$(basename "$t")")
    echo "$out" | grep -E '^\[  (FAILED|ERROR) +\]|^\[ +LINE +\]|error|Error' | head -40
  fi
  printf '%-28s %4d passed %4d failed %5ds\n' "$(basename "$t")" "$p" "$f" $((SECONDS - t0))
done
for s in tests/cli/test_*.sh; do
  [ -e "$s" ] || continue
  t0=$SECONDS
  out=$(BUILD=${BUILD:-build/rel} bash "$s" 2>&1)
  p=$(grep -c '^ok ' <<<"$out")
  f=$(grep -c '^not ok ' <<<"$out")
  rc=$?
  passed=$((passed + p))
  failed=$((failed + f))
  [ "$f" -ne 0 ] && { failures+=("$(basename "$s")"); grep -A8 '^not ok ' <<<"$out" | head -60; }
  printf '%-28s %4d passed %4d failed %5ds\n' "$(basename "$s")" "$p" "$f" $((SECONDS - t0))
done
[ ${#failures[@]} -gt 0 ] && echo "failing: ${failures[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
