#!/usr/bin/env bash
# bench_accuracy.sh - how well the planner predicts the iteration time (docs/profile.md).
#
# For a few models and device sets on this machine (emulated CPU devices, 1 thread each so that
# threads <= cores): `cephalo profile`, then `cephalo run` planned with that profile and, for
# comparison, with the analytic estimates alone; the measured step time (median after warm-up,
# from RUNDIR/summary.json; the median of RUNS runs for the profiled plan) against each plan's
# predicted iteration time. Prints a table, the
# mean absolute relative error and the worst case. Goals (the paper: 2.9%): mean <= 3%, worst
# <= 10%.
set -u
BUILD=${BUILD:-build/rel}
B=$BUILD/bin
STEPS=${STEPS:-30}
RUNS=${RUNS:-3}
export OMP_WAIT_POLICY=PASSIVE CEPHALO_PROFILE_STORE=none
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# name | model | seq | batch | devices
cases=(
  "tiny-gpt-2dev|tiny-gpt|64|16|cpu:1t:512Mx2"
  "tiny-llama-2dev|tiny-llama|64|16|cpu:1t:512Mx2"
  "tiny-bert-1dev|tiny-bert|64|16|cpu:1t:512M"
  "demo-gpt-2dev|$PWD/examples/models/demo-gpt.yaml|128|16|cpu:1t:1Gx2"
)

# run_case NAME MODEL SEQ BATCH DEVICES PROFILE|none TAG -> "predicted_ms measured_ms"
run_case() {
  local name=$1 model=$2 seq=$3 batch=$4 devices=$5 prof=$6 dir="$work/run-$1-$7"
  local pline=""
  [ "$prof" != none ] && pline="profile: $prof"
  cat >"$work/$name.yaml" <<YAML
model: $model
data: synthetic
batch: $batch
seq: $seq
steps: $STEPS
optimizer: {lr: 1e-4}
$pline
devices: [{type: cpu, threads: 1, memory: 512M}]
YAML
  if ! "$B/cephalo" run "$work/$name.yaml" --devices "$devices" --run-dir "$dir" --quiet >"$dir.log" 2>&1; then
    echo "bench_accuracy: $name ($prof) failed:" >&2; tail -5 "$dir.log" >&2; return 1
  fi
  python3 - "$dir/summary.json" "$batch" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); b = float(sys.argv[2])
sp = s["samples_per_s"]
print(f'{1000*b/sp["predicted"]:.3f} {1000*b/sp["measured"]:.3f}')
PY
}

printf '%-18s %-22s %10s %10s %8s %10s %8s\n' case devices measured profiled err analytic err
errs_p=() errs_a=()
for c in "${cases[@]}"; do
  IFS='|' read -r name model seq batch devices <<<"$c"
  prof="$work/$name.profile.json"
  if ! "$B/cephalo" profile --devices "$devices" --model "$model" --seq "$seq" -o "$prof" --store none \
      >"$work/$name.profile.log" 2>&1; then
    echo "bench_accuracy: profiling $name failed:" >&2; tail -5 "$work/$name.profile.log" >&2; continue
  fi
  # the measurement is the median of RUNS runs (each the median step after warm-up): one run of
  # a few ms per step on a shared 2-core host can be off by tens of percent (docs/profile.md)
  ms=()
  for ((k = 0; k < RUNS; k++)); do
    read -r pp m1 < <(run_case "$name" "$model" "$seq" "$batch" "$devices" "$prof" "profiled$k") || continue 2
    ms+=("$m1")
  done
  pm=$(printf '%s\n' "${ms[@]}" | sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')
  read -r ap am < <(run_case "$name" "$model" "$seq" "$batch" "$devices" none analytic) || continue
  ep=$(python3 -c "print(f'{100*($pp-$pm)/$pm:+.1f}')")
  ea=$(python3 -c "print(f'{100*($ap-$am)/$am:+.1f}')")
  errs_p+=("$ep") errs_a+=("$ea")
  printf '%-18s %-22s %8.1fms %8.1fms %7s%% %8.1fms %7s%%   (analytic plan measured %.1f ms)\n' \
    "$name" "$devices" "$pm" "$pp" "$ep" "$ap" "$ea" "$am"
done
python3 - "${errs_p[*]:-}" "${errs_a[*]:-}" <<'PY'
import sys
for label, arg in (("profiled", sys.argv[1]), ("analytic", sys.argv[2])):
    v = [abs(float(x)) for x in arg.split()]
    if v:
        print(f"{label:9s} predictions: mean absolute relative error {sum(v)/len(v):.1f}%, worst {max(v):.1f}% over {len(v)} cases")
PY
