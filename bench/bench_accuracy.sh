#!/usr/bin/env bash
# bench_accuracy.sh - how well the planner predicts the iteration time (docs/profile.md).
#
# For the built-in tiny models, `make demo`'s model (also on its three devices, more threads than
# a 2-core host has cores) and imported Hugging Face GPT-2 and Llama directories (vocabularies of
# 50,257 and 32,000: the head dominates; tests/ref/hf_models.py writes them) on this machine's
# emulated CPU devices: `cephalo profile`, then `cephalo run` planned with that profile and, for
# comparison, with the analytic estimates alone; the measured step time (median after warm-up,
# from RUNDIR/summary.json; the median of RUNS runs of each plan) against each plan's
# predicted iteration time. Prints a table, the mean absolute relative error and the worst case
# of each. Goals: profiled mean <= 10%; analytic alone within 25% per case (docs/profile.md).
# CASES=name,name limits the cases; QUICK=1 profiles with --quick (as `cephalo run` does).
set -u
BUILD=${BUILD:-build/rel}
B=$BUILD/bin
STEPS=${STEPS:-30}
RUNS=${RUNS:-3}
# plans from the given profile or the estimates only: no store, no `cephalo run` profiling
export OMP_WAIT_POLICY=PASSIVE CEPHALO_PROFILE_STORE=none CEPHALO_PROFILE_CACHE=none
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
PY=${PYTHON:-/usr/bin/python3}
if ! "$PY" tests/ref/hf_models.py make "$work/hf-gpt2" --arch gpt2 --vocab 50257 --d 128 --layers 2 --positions 128 --tied \
    >/dev/null 2>&1 ||
  ! "$PY" tests/ref/hf_models.py make "$work/hf-llama" --arch llama --vocab 32000 --d 128 --layers 2 --heads 4 --kv 2 \
    --ff 344 --positions 128 >/dev/null 2>&1; then
  echo "bench_accuracy: cannot write the Hugging Face directories ($PY tests/ref/hf_models.py: needs numpy and torch); those cases are left out" >&2
fi

# name | model | seq | batch | devices
all_cases=(
  "tiny-gpt-2dev|tiny-gpt|64|16|cpu:1t:512Mx2"
  "tiny-llama-2dev|tiny-llama|64|16|cpu:1t:512Mx2"
  "tiny-bert-1dev|tiny-bert|64|16|cpu:1t:512M"
  "tiny-vit-2dev|tiny-vit|0|16|cpu:1t:512Mx2"
  "demo-gpt-2dev|$PWD/examples/models/demo-gpt.yaml|128|16|cpu:1t:1Gx2"
  "demo-gpt-demo|$PWD/examples/models/demo-gpt.yaml|128|24|cpu:1t:64M,cpu:1t:20Mx2"
  "hf-gpt2-2dev|$work/hf-gpt2|128|8|cpu:1t:1Gx2"
  "hf-llama-2dev|$work/hf-llama|128|8|cpu:1t:1Gx2"
)
cases=()
for c in "${all_cases[@]}"; do
  name=${c%%|*} model=$(cut -d'|' -f2 <<<"$c")
  [ -n "${CASES:-}" ] && [[ ",$CASES," != *",$name,"* ]] && continue
  [[ $model == "$work"/* ]] && [ ! -e "$model/config.json" ] && continue
  cases+=("$c")
done

# run_case NAME MODEL SEQ BATCH DEVICES PROFILE|none TAG -> "predicted_ms measured_ms"
run_case() {
  local name=$1 model=$2 seq=$3 batch=$4 devices=$5 prof=$6 dir="$work/run-$1-$7"
  local pline=""
  [ "$prof" != none ] && pline="profile: $prof"
  cat >"$work/$name.yaml" <<YAML
model: $model
data: synthetic
batch: $batch
$([ "$seq" != 0 ] && echo "seq: $seq")
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

printf '%-16s %-24s %10s %10s %8s %10s %8s\n' case devices measured profiled err analytic err
errs_p=() errs_a=()
for c in "${cases[@]}"; do
  IFS='|' read -r name model seq batch devices <<<"$c"
  prof="$work/$name.profile.json"
  sq=() qk=()
  [ "$seq" != 0 ] && sq=(--seq "$seq")
  [ "${QUICK:-0}" = 1 ] && qk=(--quick)
  # the step check at the case's batch, as `cephalo run` profiles (at most 16 per device)
  ndev=$(tr ',' '\n' <<<"$devices" | awk -F'x' '{n += (NF > 1 ? $NF : 1)} END {print n}')
  cb=$((batch < 16 * ndev ? batch : 16 * ndev))
  [ "$cb" -gt "$ndev" ] && qk+=(--check-batch "$cb")
  if ! "$B/cephalo" profile --devices "$devices" --model "$model" "${sq[@]}" "${qk[@]}" -o "$prof" --store none \
      >"$work/$name.profile.log" 2>&1; then
    echo "bench_accuracy: profiling $name failed:" >&2; tail -5 "$work/$name.profile.log" >&2; continue
  fi
  # each measurement is the median of RUNS runs (each the median step after warm-up): one run of
  # a few ms per step on a shared 2-core host can be off by tens of percent (docs/profile.md)
  ms=() as=()
  for ((k = 0; k < RUNS; k++)); do
    read -r pp m1 < <(run_case "$name" "$model" "$seq" "$batch" "$devices" "$prof" "profiled$k") || continue 2
    read -r ap a1 < <(run_case "$name" "$model" "$seq" "$batch" "$devices" none "analytic$k") || continue 2
    ms+=("$m1") as+=("$a1")
  done
  median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
  pm=$(printf '%s\n' "${ms[@]}" | median) am=$(printf '%s\n' "${as[@]}" | median)
  ep=$(python3 -c "print(f'{100*($pp-$pm)/$pm:+.1f}')")
  ea=$(python3 -c "print(f'{100*($ap-$am)/$am:+.1f}')")
  errs_p+=("$ep") errs_a+=("$ea")
  printf '%-16s %-24s %8.1fms %8.1fms %7s%% %8.1fms %7s%%   (analytic plan measured %.1f ms)\n' \
    "$name" "$devices" "$pm" "$pp" "$ep" "$ap" "$ea" "$am"
done
python3 - "${errs_p[*]:-}" "${errs_a[*]:-}" <<'PY'
import sys
for label, arg in (("profiled", sys.argv[1]), ("analytic", sys.argv[2])):
    v = [abs(float(x)) for x in arg.split()]
    if v:
        print(f"{label:9s} predictions: mean absolute relative error {sum(v)/len(v):.1f}%, worst {max(v):.1f}% over {len(v)} cases")
PY
