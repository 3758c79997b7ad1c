#!/usr/bin/env bash
# make bench-gpu: cephalo-worker-cuda against PyTorch on the same GPU in the same run. For
# gpt2-124m, gpt2-350m, gpt2-774m (seq 1024) and tinyllama-1.1b (seq 2048), in fp32 (TF32), bf16
# and fp16 (dynamic loss scaling; PyTorch: autocast + GradScaler): tokens/s, MFU, peak memory and the ratio to torch.compile, for cephalo (1 rank, synthetic
# data) and PyTorch eager, torch.compile and single-rank FSDP2 (bench/torch_gpu.py). Then two
# cephalo-only comparisons: --offload on vs off, and layered vs per-microbatch accumulation.
# Writes the table to stdout and runs/bench-gpu/bench-DATE.json. docs/gpu.md explains MFU.
# Environment: BENCH_GPU_STEPS (20), BENCH_GPU_WARMUP (3), BENCH_GPU_MODELS (all four),
# BENCH_GPU_PRECISIONS ("fp32 bf16 fp16"), BENCH_GPU_TORCH_MODES ("eager compile fsdp2"),
# CEPHALO_PEAK_TFLOPS (when the GPU is not in the table), PYTHON (a python with CUDA PyTorch),
# BENCH_GPU_ATTN ("simt"; "simt mma" adds a cephalo row per bf16/fp16 case with the tensor-core
# attention, CEPHALO_CUDA_ATTN=mma, docs/cuda.md), BENCH_GPU_OPTIME (1: every cephalo run with
# CEPHALO_CUDA_OPTIME=1; its per-op table goes to stderr as the run ends and into the JSON),
# BENCH_GPU_VARIANTS (switches to compare in the same call: each word a cephalo row more per case,
# run with those variables, several joined by commas, e.g. "CEPHALO_ACTS=16
# CEPHALO_ACTS=16,CEPHALO_ADAMW=half"), BENCH_GPU_EXTRAS (1; 0 skips the offload and
# accumulation comparisons).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
B=${BUILD:-build/rel}/bin
WC=$B/cephalo-worker-cuda
PY=${PYTHON:-/usr/bin/python3}
STEPS=${BENCH_GPU_STEPS:-20}
WARM=${BENCH_GPU_WARMUP:-3}
MODELS=${BENCH_GPU_MODELS:-gpt2-124m gpt2-350m gpt2-774m tinyllama-1.1b}
PRECS=${BENCH_GPU_PRECISIONS:-fp32 bf16 fp16}
TMODES=${BENCH_GPU_TORCH_MODES:-eager compile fsdp2}
ATTNS=${BENCH_GPU_ATTN:-simt}
OPTIME=${BENCH_GPU_OPTIME:-0}
VARIANTS=${BENCH_GPU_VARIANTS:-}
EXTRAS=${BENCH_GPU_EXTRAS:-1}
variant_tag() { tr '=,' '_-' <<<"$1"; } # a variant's file-name form
[ "$OPTIME" = 1 ] && export CEPHALO_CUDA_OPTIME=1

if [ ! -x "$WC" ]; then echo "not built: $WC (make cuda)"; exit 1; fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]'; then
  echo "no GPU: bench-gpu needs an NVIDIA GPU and PyTorch with CUDA; nothing measured"
  exit 0
fi
# the help captured once: `$WC --help | grep -q` under pipefail fails when grep stops reading early
WC_HELP=$($WC train --help 2>&1)
GPU_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
TORCH_OK=1
if ! terr=$("$PY" -c 'import torch; assert torch.cuda.is_available(), "torch without CUDA"' 2>&1); then
  TORCH_OK=0
  echo "# PyTorch with CUDA not importable by $PY ($(tail -1 <<<"$terr")): cephalo rows only (set PYTHON=...)"
fi

T=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
mkdir -p runs/bench-gpu
OUT=runs/bench-gpu/bench-$(date +%Y%m%d-%H%M%S).json

# shape per model: seq batch microbatch (fits an 80 GB GPU in fp32 for every system)
shape() {
  case $1 in
    gpt2-124m) echo "1024 16 8" ;;
    gpt2-350m) echo "1024 16 4" ;;
    gpt2-774m) echo "1024 8 2" ;;
    tinyllama-1.1b) echo "2048 8 1" ;;
    tiny-*) echo "64 4 2" ;; # code-path checks only
    *) echo "1024 8 1" ;;
  esac
}

# cephalo_run TAG LOG [worker args...] -> $T/TAG.json: {"tokens_per_s", "step_ms", "peak_bytes", ...}
cephalo_run() {
  local tag=$1 log=$2
  shift 2
  local ok=1
  $WC train --device cuda --data synthetic --steps "$STEPS" --quiet --log "$log" "$@" >"$T/$tag.err" 2>&1 || ok=0
  if [ "$OPTIME" = 1 ]; then # the per-op table, as it comes and for the JSON
    sed -n '/^CEPHALO_CUDA_OPTIME/,/^[^ ]/p' "$T/$tag.err" | grep -v '^[^ C]' | tee "$T/$tag.optime" | sed "s/^/#   [$tag] /" >&2
  fi
  if [ $ok = 0 ]; then
    "$PY" -c 'import json,sys; print(json.dumps({"error": sys.argv[1]}))' "$(tail -n 2 "$T/$tag.err" | tr '\n' ' ')" >"$T/$tag.json"
    return 1
  fi
  "$PY" - "$log" "$WARM" >"$T/$tag.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = rows[int(sys.argv[2]):] or rows
ms = sum(r["step_ms"] for r in timed) / len(timed)
tokens = timed[0]["tokens_per_s"] * timed[0]["step_ms"] / 1e3
print(json.dumps({"tokens_per_s": tokens / (ms / 1e3), "step_ms": ms, "peak_bytes": rows[-1]["peak_bytes"],
                  "gathers": timed[-1].get("gathers"), "steps_timed": len(timed)}))
PY
}

echo "== bench-gpu: $GPU_NAME, $STEPS steps ($WARM warm-up), synthetic data =="
for model in $MODELS; do
  read -r seq batch micro <<<"$(shape "$model")"
  echo "$seq" >"$T/seq-$model"
  for prec in $PRECS; do
    tag=$model-$prec
    echo "# $model $prec: seq $seq, batch $batch, microbatch $micro" >&2
    cephalo_run "$tag-cephalo" "$T/$tag.jsonl" --model "$model" --seq "$seq" --batch "$batch" \
      --microbatch "$micro" --precision "$prec"
    echo "#   cephalo: $(cat "$T/$tag-cephalo.json")" >&2 # each result as it comes, in case of a timeout
    for attn in $ATTNS; do # the other attention paths, 16-bit precisions only (fp32 is simt)
      [ "$attn" = simt ] || [ "$prec" = fp32 ] && continue
      CEPHALO_CUDA_ATTN=$attn cephalo_run "$tag-cephalo-attn-$attn" "$T/$tag-attn-$attn.jsonl" --model "$model" \
        --seq "$seq" --batch "$batch" --microbatch "$micro" --precision "$prec"
      echo "#   cephalo attn=$attn: $(cat "$T/$tag-cephalo-attn-$attn.json")" >&2
    done
    for v in $VARIANTS; do # the same run under other switches (docs/gpu.md)
      vt=$(variant_tag "$v")
      (export ${v//,/ }; cephalo_run "$tag-cephalo-var-$vt" "$T/$tag-var-$vt.jsonl" --model "$model" --seq "$seq" \
        --batch "$batch" --microbatch "$micro" --precision "$prec")
      echo "#   cephalo $v: $(cat "$T/$tag-cephalo-var-$vt.json")" >&2
    done
    for mode in $TMODES; do
      if [ "$TORCH_OK" = 1 ]; then
        "$PY" bench/torch_gpu.py --model "$model" --seq "$seq" --batch "$batch" --micro "$micro" \
          --precision "$prec" --mode "$mode" --steps $((STEPS - WARM)) --warmup "$WARM" \
          2>"$T/$tag-$mode.err" | tail -n 1 >"$T/$tag-$mode.json"
        [ -s "$T/$tag-$mode.json" ] || "$PY" -c 'import json,sys; print(json.dumps({"error": sys.argv[1]}))' \
          "$(tail -n 2 "$T/$tag-$mode.err" | tr '\n' ' ')" >"$T/$tag-$mode.json"
        echo "#   torch $mode: $(cat "$T/$tag-$mode.json")" >&2
      else
        echo '{"unavailable": "no PyTorch with CUDA"}' >"$T/$tag-$mode.json"
      fi
    done
  done
done

# ---- offload on vs off (step time; goal: within 5%) ----
OFF_MODEL=${BENCH_GPU_OFFLOAD_MODEL:-gpt2-350m}
read -r seq batch micro <<<"$(shape "$OFF_MODEL")"
if [ "$EXTRAS" != 1 ]; then
  for off in on off; do echo '{"unavailable": "not run (BENCH_GPU_EXTRAS=0)"}' >"$T/offload-$off.json"; done
elif grep -q -- --offload <<<"$WC_HELP"; then
  for off in off on; do
    cephalo_run "offload-$off" "$T/offload-$off.jsonl" --model "$OFF_MODEL" --seq "$seq" --batch "$batch" \
      --microbatch "$micro" --precision bf16 --offload $off
  done
else
  echo '{"unavailable": "cephalo-worker-cuda has no --offload"}' >"$T/offload-on.json"
  cp "$T/offload-on.json" "$T/offload-off.json"
fi

# ---- layered vs per-microbatch accumulation (gathers per step, step time) ----
ACC_MODEL=${BENCH_GPU_ACC_MODEL:-gpt2-124m}
read -r seq batch micro <<<"$(shape "$ACC_MODEL")"
# four microbatches per rank: with one (the model's own shape split over 2 ranks) both modes are
# the same schedule, which an H200 run measured as 28 gathers per step in each
micro=$((batch / 8 > 0 ? batch / 8 : 1))
ACC_RANKS=0
if [ "$EXTRAS" != 1 ]; then
  for mode in layered per-micro; do echo '{"unavailable": "not run (BENCH_GPU_EXTRAS=0)"}' >"$T/acc-$mode.json"; done
elif grep -q -- --accumulate <<<"$WC_HELP"; then
  free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
  printf 'nodes:\n  - name: local\n    gpus:\n      - {type: cpu, count: 2, threads: 1, memory_gib: 30}\n' >"$T/c2.yaml"
  if "$B/cephalo" plan --cluster "$T/c2.yaml" --model "$ACC_MODEL" --seq "$seq" --batch "$batch" -o "$T/base.json" >/dev/null 2>&1 &&
     "$PY" tests/fsdp/plan_tool.py rewrite "$T/base.json" "$T/acc.json" --ranks "$((batch / 2)):$micro,$((batch / 2)):$micro" --shards even; then
    ACC_RANKS=2
  fi
  for mode in layered per-micro; do
    if [ "$ACC_RANKS" = 2 ]; then
      port=$(free_port)
      pids=()
      for r in 0 1; do
        CEPHALO_COMM_BACKEND=socket RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CEPHALO_PLAN=$T/acc.json \
          $WC train --device cuda --gpu 0 --data synthetic --steps "$STEPS" --quiet --precision bf16 --accumulate $mode \
          --log "$T/acc-$mode-r$r.jsonl" 2>"$T/acc-$mode-r$r.err" &
        pids+=($!)
      done
      rc=0
      for p in "${pids[@]}"; do wait "$p" || rc=1; done
      if [ $rc = 0 ]; then
        "$PY" - "$T/acc-$mode-r0.jsonl" "$WARM" >"$T/acc-$mode.json" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
timed = rows[int(sys.argv[2]):] or rows
print(json.dumps({"step_ms": sum(r["step_ms"] for r in timed) / len(timed), "gathers": timed[-1]["gathers"],
                  "ranks": 2, "peak_bytes": rows[-1]["peak_bytes"]}))
PY
      else
        "$PY" -c 'import json,sys; print(json.dumps({"error": "2 ranks failed: " + sys.argv[1]}))' \
          "$(tail -n 1 "$T/acc-$mode-r0.err")" >"$T/acc-$mode.json"
      fi
    else
      cephalo_run "acc-$mode" "$T/acc-$mode.jsonl" --model "$ACC_MODEL" --seq "$seq" --batch "$batch" \
        --microbatch "$micro" --precision bf16 --accumulate $mode
    fi
  done
else
  for mode in layered per-micro; do
    echo '{"unavailable": "cephalo-worker-cuda has no --accumulate layered|per-micro"}' >"$T/acc-$mode.json"
  done
fi

# ---- the table and the JSON ----
"$PY" - "$T" "$OUT" "$GPU_NAME" "$MODELS" "$PRECS" "$TMODES" "$STEPS" "$WARM" "$OFF_MODEL" "$ACC_MODEL" "$ATTNS" "$VARIANTS" <<'PY'
import json, os, re, subprocess, sys
T, OUT, GPU, MODELS, PRECS, TMODES, STEPS, WARM, OFF_MODEL, ACC_MODEL, ATTNS, VARIANTS = sys.argv[1:13]
VARIANTS = VARIANTS.split()
def vtag(v):
    return v.replace("=", "_").replace(",", "-")
MODELS, PRECS, TMODES, ATTNS = MODELS.split(), PRECS.split(), TMODES.split(), ATTNS.split()

# peak dense TFLOP/s (no sparsity): (bf16, tf32)
PEAKS = [("H100 PCIe", 756, 378), ("H100 NVL", 835, 418), ("H100", 989, 494.5), ("H200", 989, 494.5),
         ("GH200", 989, 494.5), ("A100", 312, 156)]
peak = None
for key, bf, tf in PEAKS:
    if key.lower() in GPU.lower() or key.replace(" ", "").lower() in GPU.replace(" ", "").lower():
        peak = {"bf16": bf, "fp16": bf, "fp32": tf, "source": "table: " + key}  # fp16 = bf16 rate
        break
if os.environ.get("CEPHALO_PEAK_TFLOPS"):
    v = os.environ["CEPHALO_PEAK_TFLOPS"].split(",")
    peak = {"bf16": float(v[0]), "fp16": float(v[0]), "fp32": float(v[-1]) if len(v) > 1 else float(v[0]) / 2,
            "source": "CEPHALO_PEAK_TFLOPS"}
if peak is None:
    print("# %s is not in the peak table: set CEPHALO_PEAK_TFLOPS=BF16[,TF32] (dense TFLOP/s) for MFU" % GPU)

# model shapes and parameter counts from `cephalo models`
shapes = {}
build = os.environ.get("BUILD", "build/rel")
for line in subprocess.run([build + "/bin/cephalo", "models"], capture_output=True, text=True).stdout.splitlines()[1:]:
    f = line.split()
    if len(f) >= 8:
        shapes[f[0]] = {"layers": int(f[2]), "d": int(f[3]), "params": int(f[7])}
SEQ = {m: int(open(os.path.join(T, "seq-" + m)).read()) for m in MODELS}

def load(name):
    try:
        return json.loads(open(os.path.join(T, name + ".json")).read().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return {"error": "no result"}

def flops_per_token(model, seq):
    s = shapes.get(model)
    if not s:
        return None
    return 6 * s["params"] + 12 * s["layers"] * s["d"] * seq

rows = []
for model in MODELS:
    seq = SEQ[model]
    fpt = flops_per_token(model, seq)
    for prec in PRECS:
        res = {"cephalo": load("%s-%s-cephalo" % (model, prec))}
        for a in ATTNS:
            if a != "simt" and prec != "fp32":
                res["cephalo " + a] = load("%s-%s-cephalo-attn-%s" % (model, prec, a))
        for v in VARIANTS:
            res["cephalo " + v] = load("%s-%s-cephalo-var-%s" % (model, prec, vtag(v)))
        for system, tag in ([("cephalo", "cephalo")] + [("cephalo " + a, "cephalo-attn-" + a) for a in ATTNS] +
                            [("cephalo " + v, "cephalo-var-" + vtag(v)) for v in VARIANTS]):
            try:
                if system in res:
                    res[system]["optime"] = open(os.path.join(T, "%s-%s-%s.optime" % (model, prec, tag))).read()
            except OSError:
                pass
        for m in TMODES:
            res["torch " + m] = load("%s-%s-%s" % (model, prec, m))
        comp = res.get("torch compile", {}).get("tokens_per_s")
        for system, r in res.items():
            row = {"model": model, "precision": prec, "system": system, "seq": seq}
            row.update(r)
            tps = r.get("tokens_per_s")
            if tps and fpt and peak:
                row["mfu"] = tps * fpt / (peak[prec] * 1e12)
            if tps and comp:
                row["vs_compile"] = tps / comp
            rows.append(row)

def fmt_row(r):
    if "tokens_per_s" not in r:
        why = r.get("unavailable") or r.get("error") or "?"
        return "%-15s %-5s %-*s %s" % (r["model"], r["precision"], SYSW, r["system"], ("unavailable: " if "unavailable" in r else "FAILED: ") + why[:90])
    mfu = "%5.1f%%" % (100 * r["mfu"]) if "mfu" in r else "    - "
    peakm = "%7.1f" % (r["peak_bytes"] / 2**30) if r.get("peak_bytes") else "      -"
    vs = "%5.2fx" % r["vs_compile"] if "vs_compile" in r else "    - "
    return "%-15s %-5s %-*s %10.0f %9.1f %s %s GiB %s" % (r["model"], r["precision"], SYSW, r["system"], r["tokens_per_s"], r["step_ms"], mfu, peakm, vs)

SYSW = max([14] + [len(r["system"]) for r in rows])

print("MFU: model FLOPs per token = 6 x params + 12 x layers x d x seq (attention counted in full, causal or "
      "not, as PyTorch/llm.c do), over %s dense peak %s" % (GPU, "%g bf16 / %g tf32 TFLOP/s (%s)" % (peak["bf16"], peak["fp32"], peak["source"]) if peak else "unknown"))
print("%-15s %-5s %-*s %10s %9s %6s %11s %6s" % ("model", "prec", SYSW, "system", "tokens/s", "step ms", "MFU", "peak mem", "/compile"))
for r in rows:
    print(fmt_row(r))

sub = {}
on, off = load("offload-on"), load("offload-off")
print("\n== offload on vs off: %s bf16 ==" % OFF_MODEL)
if "step_ms" in on and "step_ms" in off:
    d = 100 * (on["step_ms"] - off["step_ms"]) / off["step_ms"]
    print("offload off %.1f ms/step, on %.1f ms/step: %+.1f%% (goal: within 5%%: %s); peak %.2f vs %.2f GiB"
          % (off["step_ms"], on["step_ms"], d, "met" if abs(d) <= 5 else "NOT met", off["peak_bytes"] / 2**30, on["peak_bytes"] / 2**30))
    sub["offload"] = {"model": OFF_MODEL, "off": off, "on": on, "diff_pct": d}
else:
    print("offload: " + (on.get("unavailable") or on.get("error") or off.get("error") or "?"))
    sub["offload"] = {"on": on, "off": off}
print("\n== layered vs per-microbatch accumulation: %s bf16 ==" % ACC_MODEL)
lay, per = load("acc-layered"), load("acc-per-micro")
if "step_ms" in lay and "step_ms" in per:
    print("%-10s %8s %12s" % ("mode", "ms/step", "gathers/step"))
    for name, r in (("layered", lay), ("per-micro", per)):
        print("%-10s %8.1f %12s   (%s rank%s)" % (name, r["step_ms"], r.get("gathers"), r.get("ranks", 1), "s" if r.get("ranks", 1) > 1 else ""))
else:
    print("accumulation modes: " + (lay.get("unavailable") or lay.get("error") or per.get("error") or "?"))
sub["accumulate"] = {"model": ACC_MODEL, "layered": lay, "per_micro": per}
json.dump({"gpu": GPU, "peak_tflops": peak, "steps": int(STEPS), "warmup": int(WARM), "rows": rows, "sub": sub},
          open(OUT, "w"), indent=1)
print("\nwritten: " + OUT)
PY
