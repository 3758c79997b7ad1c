#!/usr/bin/env bash
# make bench, part 3: training across ranks on an emulated heterogeneous CPU cluster
# (bench/cluster-hetero.yaml: one 2-thread device with 1 GiB, two 1-thread devices with 0.45 GiB;
# the model is bench/gpt-fsdp.yaml). For each of the cephalo, fsdp, cb and mb plans, in the same
# run: measured samples/s (ratio to cephalo's), the planner's predicted vs measured iteration
# time, bytes sent per step vs the ring collectives' prediction, and peak memory vs prediction.
set -euo pipefail
B=${BUILD:-build/rel}/bin
BATCH=${BENCH_FSDP_BATCH:-12}
STEPS=${BENCH_FSDP_STEPS:-5}
CLUSTER=${BENCH_FSDP_CLUSTER:-bench/cluster-hetero.yaml}
MODEL=${BENCH_FSDP_MODEL:-bench/gpt-fsdp.yaml}
T=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
# more threads than cores: idle OpenMP threads must sleep, not spin, or they steal the cores
export OMP_WAIT_POLICY=PASSIVE

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

echo "== multi-rank training: $(basename "$MODEL" .yaml) on $(basename "$CLUSTER"), batch $BATCH, $STEPS steps (first one not timed) =="
for strategy in cephalo fsdp cb mb; do
  plan=$T/$strategy.json
  if ! "$B/cephalo" plan --cluster "$CLUSTER" --model "$MODEL" --batch "$BATCH" --strategy "$strategy" \
      -o "$plan" >"$T/$strategy.plan.txt" 2>&1; then
    echo "$strategy: infeasible: $(tail -n 1 "$T/$strategy.plan.txt")"
    continue
  fi
  world=$(/usr/bin/python3 -c "import json; print(len(json.load(open('$plan'))['ranks']))")
  port=$(free_port)
  pids=()
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world MASTER_PORT=$port CEPHALO_PLAN=$plan \
      "$B/cephalo-worker" train --data synthetic --steps "$STEPS" --quiet --log "$T/$strategy.$r.jsonl" 2>"$T/$strategy.$r.err" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "$strategy: rank failed"; cat "$T/$strategy".*.err; exit 1; }; done
done
/usr/bin/python3 - "$T" <<'PY'
import glob, json, os, statistics, sys
T = sys.argv[1]
rows = {}
for s in ["cephalo", "fsdp", "cb", "mb"]:
    path = f"{T}/{s}.json"
    if not os.path.exists(f"{T}/{s}.0.jsonl"):
        continue
    plan = json.load(open(path))
    world = len(plan["ranks"])
    logs = [[json.loads(l) for l in open(f"{T}/{s}.{r}.jsonl")] for r in range(world)]
    timed = logs[0][1:]
    ms = statistics.median(x["step_ms"] for x in timed)
    numel = [u["numel"] for u in plan["units"]]
    tied = plan["inputs"].get("model_spec", {}).get("tied_head", True)
    gathered = sum(numel) + (numel[0] if tied else 0) + sum(numel[:-1])
    reduced = sum(numel) + (numel[0] if tied else 0)
    if plan.get("replicated"):
        want = 2 * (world - 1) * 4 * sum(numel) + 2 * (world - 1) * 8 * 2
    else:
        want = (world - 1) * 4 * (gathered + reduced) + 2 * (world - 1) * 8 * 2
    sent = sum(logs[r][-1]["bytes_sent"] for r in range(world))
    peaks = [logs[r][-1]["peak_bytes"] for r in range(world)]
    pred_peaks = [rk["predicted"]["peak_bytes"] for rk in plan["ranks"]]
    rows[s] = dict(ms=ms, sps=plan["inputs"]["batch"] / (ms / 1e3), pred=plan["predicted"]["iter_ms"],
                   sent=sent, want=want, peaks=peaks, pred_peaks=pred_peaks,
                   split=" ".join(f"{rk['batch']}={rk['microbatch']}x{rk['microbatches']}/{100*rk['state_ratio']:.0f}%" for rk in plan["ranks"]),
                   wait=statistics.median(x["comm_wait_ms"] for x in timed))
base = rows.get("cephalo")
mib = lambda b: b / 2**20
print(f"{'plan':8} {'samples/s':>9} {'vs cephalo':>10} {'step ms':>8} {'predicted':>9} {'pred err':>8} {'comm wait':>9} {'MiB sent/step':>13} {'predicted':>9}  batch=m x l/state per rank; peak MiB measured (predicted)")
for s, r in rows.items():
    ratio = r["sps"] / base["sps"] if base else float("nan")
    err = (r["pred"] - r["ms"]) / r["ms"]
    peaks = " ".join(f"{mib(a):.0f}({mib(b):.0f})" for a, b in zip(r["peaks"], r["pred_peaks"]))
    print(f"{s:8} {r['sps']:9.2f} {ratio:9.2f}x {r['ms']:8.0f} {r['pred']:9.0f} {100*err:+7.0f}% {r['wait']:8.0f}  {mib(r['sent']):13.2f} {mib(r['want']):9.2f}  {r['split']}; {peaks}")
print("pred err: the planner's predicted iteration time against the measured median (analytic CPU estimates until `cephalo profile`)")
PY
