#!/usr/bin/env bash
# CLI tests of a rank that stops answering (issue 15): a rank SIGSTOPped mid-training keeps its
# sockets open, so the others fail by timeout. The launcher must name the rank that stopped, not
# the peer that noticed; every other rank's log must name it as the origin of the failure
# (docs/comm.md, "Abort frames"); the stopped worker must be killed at once (it cannot act
# on SIGTERM), leaving no worker behind. Then, with a fake worker, a rank that hangs without being
# stopped: the launcher names it from the other ranks' `cephalo-comm-failure` lines (docs/run.md).
# Prints "ok N - name" / "not ok N - name" lines.
set -u
cd "$(dirname "$0")/../.."
B=${BUILD:-build/rel}/bin
C=$B/cephalo
T=$(mktemp -d)
bg=()    # launchers started in the background
stop=()  # workers this script stopped: continued and killed if a test leaves one behind
trap 'kill -9 "${bg[@]}" "${stop[@]}" 2>/dev/null; kill -CONT "${stop[@]}" 2>/dev/null; rm -rf "$T"' EXIT
. tests/cli/lib.sh
unset CEPHALO_WORKER
export OMP_NUM_THREADS=1

exited() { local s; s=$(ps -o stat= -p "$1" 2>/dev/null); [ -z "$s" ] || [[ $s == Z* ]]; }
no_orphans() { ! pgrep -f "$1/rank-" >/dev/null; }
top_line() { grep -m1 '^cephalo run: rank ' "$1"; } # the launcher's verdict

# ---- real workers: rank 1 of 3 SIGSTOPped mid-training ----

cat >"$T/stall.yaml" <<'Y'
name: stall
model: tiny-gpt
batch: 6
seq: 32
steps: 100000
comm_timeout: 2
devices: [{type: cpu, memory: 256M, count: 3}]
data: synthetic
Y
"$C" run "$T/stall.yaml" --run-dir "$T/r-stall" >"$T/stall.out" 2>&1 &
lp=$!
bg+=($lp)
wait_for 60 grep -qs '^step ' "$T/stall.out"
sleep 0.5 # a few steps in: the ranks are busy in their collectives
pid1=$(pgrep -f "$T/r-stall/rank-1.jsonl" | head -1)
assert "stall: rank 1 is running" test -n "$pid1"
kill -STOP "$pid1"
stop+=("$pid1")
start=$SECONDS
wait_for 40 exited $lp || kill -9 $lp
wait $lp
rc=$?
took=$((SECONDS - start))
assert "stall: exit 1" test "$rc" -eq 1
check "stall: the top line names the stopped rank" 0 \
  "cephalo run: rank 1 (cpu-1t-0.25g) stopped answering (SIGSTOP'd or hung); the other ranks failed waiting for it" \
  -- top_line "$T/stall.out"
# the 2 s timeout, the launcher's 300 ms settle, and no 10 s SIGTERM grace for a stopped worker
assert "stall: over within the timeout + slack, not the 10 s grace (took ${took}s)" test "$took" -le 8
assert "stall: the stopped worker is gone" exited "$pid1"
assert "stall: no worker left" no_orphans "$T/r-stall"
for r in 0 2; do
  check "stall: rank $r's log names rank 1 as the origin" 0 "cephalo-comm-failure rank=$r origin=1 cause=stalled" \
    -- cat "$T/r-stall/rank-$r.log"
done
check "stall: the rank that waited on rank 1 says so" 0 "nothing from rank 1 for " -- cat "$T/r-stall/rank-2.log"
check "stall: rank 0 learns who stopped answering" 0 "rank 1 stopped answering" -- \
  bash -c "grep -E 'rank 1 stopped answering|rank 1 took no data' '$T/r-stall/rank-0.log' | sed 's/took no data/stopped answering/'"
if [ "$rc" -ne 1 ] || ! top_line "$T/stall.out" | grep -q 'rank 1 '; then sed 's/^/#   /' "$T/stall.out" | tail -20; fi

# ---- a fake worker: a rank that hangs (not stopped), the others report it ----

# Every rank writes a step; FAKE_HANG's rank then sleeps (it never answers), the others fail the
# way the comm layer makes them: the machine-readable line, then the message, exit 1.
cat >"$T/fake-worker" <<'SH'
#!/usr/bin/env bash
[ "$1" = train ] || exit 2
log=
while [ $# -gt 0 ]; do [ "$1" = --log ] && log=$2; shift; done
printf '{"step":0,"loss":5,"lr":0.001,"grad_norm":1.0,"step_ms":50.0,"tokens_per_s":1000.0,"samples_per_s":80.0,"peak_bytes":1048576,"rss_peak_bytes":20000000,"rank":%d}\n' "$RANK" >>"$log"
if [ "$RANK" = "$FAKE_HANG" ]; then exec sleep 1000; fi
sleep 0.5
echo "cephalo-comm-failure rank=$RANK origin=${FAKE_ORIGIN:-$FAKE_HANG} cause=stalled" >&2
echo "cephalo-worker: rank $RANK: allreduce of step 1 loss: nothing from rank ${FAKE_ORIGIN:-$FAKE_HANG} for 2 s" >&2
exit 1
SH
chmod +x "$T/fake-worker"
cat >"$T/four.yaml" <<'Y'
name: four
model: tiny-gpt
batch: 8
steps: 5
devices: [{type: cpu, memory: 256M, count: 4}]
data: synthetic
Y
start=$SECONDS
check "hung rank: named from the others' logs" 1 \
  "cephalo run: rank 2 (cpu-1t-0.25g) stopped answering (SIGSTOP'd or hung); the other ranks failed waiting for it" \
  -- env CEPHALO_WORKER="$T/fake-worker" FAKE_HANG=2 "$C" run "$T/four.yaml" --run-dir "$T/r-hang"
assert "hung rank: it is stopped at once (SIGTERM acts)" test $((SECONDS - start)) -le 5
assert "hung rank: no worker left" no_orphans "$T/r-hang"
# an origin that is not running any more is no hung rank: the usual verdict
check "an origin that exited: the first failed rank is named" 1 "failed (exit 1)" \
  -- env CEPHALO_WORKER="$T/fake-worker" FAKE_HANG=none FAKE_ORIGIN=3 "$C" run "$T/four.yaml" --run-dir "$T/r-gone"
