#!/usr/bin/env bash
# make bench, part 2: training throughput of cephalo-worker against PyTorch on this CPU, same
# model (bench/gpt-bench.yaml: GPT-2 style, 6 layers, width 384, seq 256, vocab 50257), same
# batch, same threads, same run. Prints tokens/s, peak memory and the ratio.
set -euo pipefail
B=${BUILD:-build/rel}/bin
THREADS=${BENCH_THREADS:-$(nproc)}
BATCH=${BENCH_BATCH:-8}
STEPS=${BENCH_STEPS:-8}
WARM=${BENCH_WARMUP:-2}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

echo "== training throughput: GPT 6x384, seq 256, batch $BATCH, fp32, $THREADS threads, $STEPS steps ($WARM warm-up) =="
# What the ratio depends on, printed with it: the CPU, and the BLAS each side runs. cephalo links
# OpenBLAS's OpenMP build by path (Makefile BLAS_DIR); Debian's PyTorch calls libblas.so.3, which
# is whatever the libblas alternative points to (OpenBLAS openmp or pthread, or the reference BLAS,
# several times slower: a machine where it is the reference BLAS shows a much larger ratio).
echo "# cpu: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores available"
echo "# cephalo BLAS: $(readlink -f /usr/lib/x86_64-linux-gnu/openblas-openmp/libopenblas.so.0 2>/dev/null || echo '?')"
echo "# pytorch BLAS (libblas.so.3): $(readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 2>/dev/null || echo '?')"
"$B/cephalo-worker" train --data synthetic --model bench/gpt-bench.yaml --batch "$BATCH" --steps "$STEPS" \
  --threads "$THREADS" --quiet --log "$T/cephalo.jsonl"
/usr/bin/python3 bench/bench_torch_cpu.py --layers 6 --d 384 --heads 6 --seq 256 --batch "$BATCH" \
  --vocab 50257 --steps "$STEPS" --warmup-steps "$WARM" --threads "$THREADS" >"$T/torch.json"
/usr/bin/python3 - "$T/cephalo.jsonl" "$T/torch.json" "$WARM" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
warm = int(sys.argv[3])
timed = rows[warm:]
ms = sum(r["step_ms"] for r in timed) / len(timed)
tokens = timed[0]["tokens_per_s"] * timed[0]["step_ms"] / 1e3
ours = {"tokens_per_s": tokens / (ms / 1e3), "step_ms": ms, "peak_rss_bytes": rows[-1]["rss_peak_bytes"],
        "device_peak_bytes": rows[-1]["peak_bytes"]}
torch = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
mib = lambda b: b / 2**20
print(f"{'':12} {'tokens/s':>10} {'step ms':>9} {'peak RSS':>10}")
print(f"{'cephalo':12} {ours['tokens_per_s']:10.0f} {ours['step_ms']:9.0f} {mib(ours['peak_rss_bytes']):8.0f} MiB"
      f"   (device accounting: {mib(ours['device_peak_bytes']):.0f} MiB)")
print(f"{'pytorch ' + torch.get('torch', ''):12} {torch['tokens_per_s']:10.0f} {torch['step_ms']:9.0f} {mib(torch['peak_rss_bytes']):8.0f} MiB")
print(f"ratio cephalo/pytorch: throughput {ours['tokens_per_s'] / torch['tokens_per_s']:.2f}x, "
      f"peak memory {ours['peak_rss_bytes'] / torch['peak_rss_bytes']:.2f}x")
PY
