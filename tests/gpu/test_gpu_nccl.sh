#!/usr/bin/env bash
# test_gpu_nccl.sh - the nccl backend on a lease with one GPU (run by tests/gpu/run.sh; needs a GPU).
# NCCL refuses two ranks of one communicator on one device ("Duplicate GPU detected"): it compares
# each rank's host hash and bus id. The host hash comes from NCCL_HOSTID when that is set, so with
# a distinct NCCL_HOSTID per rank (and the socket transport on loopback: NCCL_SOCKET_IFNAME=lo,
# NCCL_IB_DISABLE=1) the ranks may pass for separate hosts. This script tries it:
#   - if NCCL refuses, one "# SKIP" line carries NCCL's own words (what the lease learned);
#   - if it runs: the multi-rank invariant through the nccl backend (2 and 3 uneven ranks with
#     random shards = 1 rank, exact fp32), offload on = off and per-microbatch = layered
#     accumulation through nccl, and the device memory NCCL took per rank (nvidia-smi's per-process
#     memory against the same plan over the socket backend) beside common/nccl_budget.h's estimate.
# Prints "ok N - ..." / "not ok N - ..." lines (tests/cli/lib.sh). KEEP=1 keeps the work directory.
set -u
cd "$(dirname "$0")/../.." || exit 1
# shellcheck source=tests/cli/lib.sh
. tests/cli/lib.sh
B=${BUILD:-build/rel}
C=$B/bin/cephalo
WC=$B/bin/cephalo-worker-cuda
PY=${PYTHON:-/usr/bin/python3}
PT=("$PY" tests/fsdp/plan_tool.py)
T=$(mktemp -d)
if [ "${KEEP:-0}" = 1 ]; then echo "# work directory kept: $T"; trap 'kill -9 $(jobs -p) 2>/dev/null' EXIT
else trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT; fi
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
fail() { n=$((n + 1)); echo "not ok $n - $1"; [ $# -gt 1 ] && tail -n 8 <<<"$2" | sed 's/^/#   /'; }

# every rank its own NCCL host: a wrapper the rank launcher starts instead of the worker
cat >"$T/nccl-worker" <<EOF
#!/bin/sh
export NCCL_HOSTID="cephalo-one-gpu-rank-\$RANK" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 NCCL_DEBUG=\${NCCL_DEBUG:-WARN}
exec "$PWD/$WC" "\$@"
EOF
chmod +x "$T/nccl-worker"
. tests/cli/ranks.sh
run_on() { # BACKEND PLAN OUT [worker args...]
  local backend=$1
  shift
  local w=$WC
  [ "$backend" = nccl ] && w=$T/nccl-worker
  W=$w CEPHALO_COMM_BACKEND=$backend RANK_TIMEOUT=600 run_ranks "$1" "$2" --device cuda --gpu 0 "${@:3}"
}
# the most device memory each rank's process held, sampled every 200 ms while the ranks run
watch_memory() { # OUT: writes OUT/mem.csv until the file OUT/stop exists
  while [ ! -e "$1/stop" ]; do
    nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null >>"$1/mem.csv"
    sleep 0.2
  done
}
peak_mib() { awk -F', *' '{ if ($2 > m[$1]) m[$1] = $2 } END { for (p in m) s += m[p]; n = length(m); if (n) printf "%.0f", s / n }' "$1/mem.csv"; }

export CEPHALO_CUDA_TF32=0 # exact fp32: the invariant's 1e-4 (test_gpu_train.sh part c)
train_args=(--steps 3 --lr 2e-3 --seed 5)
model=tiny-gpt
"$WC" train --data synthetic --device cuda --quiet --model $model --batch 12 --microbatch 4 "${train_args[@]}" --ckpt-dir "$T/ref" \
  >/dev/null 2>"$T/ref.err" || { fail "$model: 1 rank on the GPU trains" "$(cat "$T/ref.err")"; echo "$n checks"; exit 0; }

# the first try says whether NCCL takes two ranks on one device at all
$C plan --cluster "$(cluster_of 2 2)" --model $model --batch 12 -o "$T/base2.json" >/dev/null
"${PT[@]}" rewrite "$T/base2.json" "$T/p2.json" --ranks "7:7,5:1" --shards random --seed 2
if ! run_on nccl "$T/p2.json" "$T/try" "${train_args[@]}" --ckpt-dir "$T/try/ckpt"; then
  why=$(grep -h -i -E 'nccl|duplicate|error' "$T"/try/rank*.err | sort -u | head -n 4 | tr '\n' ' ')
  skip "the nccl backend with two ranks on one GPU (a distinct NCCL_HOSTID per rank)" "NCCL refused: ${why:-see the rank logs}"
  echo "$n checks"
  exit 0
fi
# the nccl backend really ran: each rank's communicator logged what it took at set-up (comm_nccl.c)
check "NCCL accepts two ranks on one GPU with a distinct NCCL_HOSTID each (socket transport on lo): both communicators set up" 0 "" -- \
  test "$(cat "$T"/try/rank*.err | grep -c "NCCL's communicator took")" = 2
grep -h "NCCL's communicator took" "$T"/try/rank*.err | sed 's/^/# /'

declare -A RANKS=([2]="7:7,5:1" [3]="5:1,3:3,4:2")
for world in 2 3; do
  [ "$world" = 2 ] || $C plan --cluster "$(cluster_of $world 2)" --model $model --batch 12 -o "$T/base$world.json" >/dev/null
  [ "$world" = 2 ] || "${PT[@]}" rewrite "$T/base$world.json" "$T/p$world.json" --ranks "${RANKS[$world]}" --shards random --seed $world
  for backend in nccl socket; do
    out=$T/$backend-$world
    mkdir -p "$out"
    watch_memory "$out" &
    wpid=$!
    ok=1
    run_on $backend "$T/p$world.json" "$out" "${train_args[@]}" --ckpt-dir "$out/ckpt" || ok=0
    touch "$out/stop"
    wait $wpid 2>/dev/null
    [ $ok = 1 ] || { fail "$model on $world ranks over $backend trains" "$(tail -n 3 "$out"/rank*.err)"; continue; }
    check "$model on $world uneven ranks over $backend (${RANKS[$world]}, random shards) = 1 rank, exact fp32" 0 "" \
      -- "${PT[@]}" compare "$out/ckpt/step_00000003" "$T/ref/step_00000003.safetensors" --tol 1e-4
  done
  nccl=$(peak_mib "$T/nccl-$world") sock=$(peak_mib "$T/socket-$world")
  budget=$("$PY" -c "
cc = int('$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1)'.split('.')[0])
ch = 32 if cc >= 9 else 16
b = 64 * 2**20 + ch * 2 * (4 * 2**20 + 120 * 640 * 64 + 8 * 512 * 128) + (2**30 if cc >= 9 else 0)
print(round(b / 2**20))")
  echo "# $world ranks: per-process peak device memory nccl ${nccl:-?} MiB, socket ${sock:-?} MiB: NCCL took about $(( ${nccl:-0} - ${sock:-0} )) MiB per rank; common/nccl_budget.h budgets $budget MiB (NVLS included on sm_90)"
done

# offload on = off and per-microbatch = layered, through nccl (3 uneven ranks)
for mode in "--offload off" "--accumulate per-micro"; do
  out=$T/nccl-3-${mode// /}
  if run_on nccl "$T/p3.json" "$out" "${train_args[@]}" $mode --ckpt-dir "$out/ckpt"; then
    check "3 ranks over nccl: $mode gives what the default gives" 0 "" \
      -- "${PT[@]}" compare "$out/ckpt/step_00000003" "$T/nccl-3/ckpt/step_00000003" --tol 1e-4
  else
    fail "3 ranks over nccl with $mode trains" "$(tail -n 3 "$out"/rank*.err)"
  fi
done
echo "$n checks"
