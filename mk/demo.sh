#!/usr/bin/env bash
# `make demo`: the planner on the Cephalo paper's Cluster A (2 nodes: 2xL4 + A6000 + P40,
# 2xP40 + 2xP100, 50 Gbps): a plan table, then every strategy side by side for a few models.
set -euo pipefail
BIN=${BUILD:-build/rel}/bin/cephalo
A=examples/clusters/cluster-a.yaml
rule() { printf '\n== %s ==\n' "$*"; }

rule "cluster ($A)"
grep -v '^#' "$A"

rule "cephalo plan --cluster $A --model llama-3b --batch 256"
"$BIN" plan --cluster "$A" --model llama-3b --batch 256

rule "cephalo compare --cluster $A --model gpt-2.7b --batch 256"
"$BIN" compare --cluster "$A" --model gpt-2.7b --batch 256 || true

# Training across ranks on this machine: three emulated CPU devices (a 64 MiB one and two of
# 20 MiB), a small byte-level GPT, and English text from Debian's `fortunes` package. Even FSDP
# gives every device the same batch and state and does not fit on the small ones; Cephalo's plan
# gives them less of both and trains.
D=$(mktemp -d)
trap 'rm -rf "$D"' EXIT
TEXT=/usr/share/games/fortunes
rule "cephalo data: the fortunes package's text ($TEXT) as byte-level shards"
mapfile -t files < <(find "$TEXT" -maxdepth 1 -type f ! -name '*.dat' | sort)
"$BIN" data -o "$D/shards" "${files[@]}"
cat >"$D/job.yaml" <<Y
# make demo's job: written by mk/demo.sh
model: $PWD/examples/models/demo-gpt.yaml
data: shards/train_*.bin
batch: 24
steps: ${DEMO_STEPS:-120}
seed: 1
optimizer: {lr: 3e-3, min_lr: 3e-4, warmup: 10}
checkpoint: {dir: ckpt, every: 60}
devices:
  - {type: cpu, threads: 1, memory: 64M}
  - {type: cpu, threads: 1, memory: 20M, count: 2}
Y
rule "the job ($D/job.yaml)"
grep -v '^#' "$D/job.yaml"
"$BIN" run "$D/job.yaml" --dry-run >"$D/dry.txt" 2>&1 || { cat "$D/dry.txt"; exit 1; }
sed -n '/^cephalo plan/,/planned in/p' "$D/dry.txt" >"$D/cluster.txt" || true
printf 'nodes:\n  - name: local\n    gpus:\n      - {type: cpu, count: 1, threads: 1, memory_gib: 0.0625}\n      - {type: cpu, count: 2, threads: 1, memory_gib: 0.01953125}\n' >"$D/cluster.yaml"
rule "every strategy on these devices (even FSDP runs out of memory on the 20 MiB devices)"
"$BIN" compare --cluster "$D/cluster.yaml" --model examples/models/demo-gpt.yaml --batch 24 || true
# The run profiles the devices for the model first (a few seconds, then cached by device signature
# and model in ~/.cache/cephalo/profiles: the next `make demo` plans at once), so its prediction is
# from this machine's own numbers: the summary's measured/predicted says how close (docs/run.md).
rule "cephalo run: profile the devices (once), plan, start one cephalo-worker per device, train"
"$BIN" run "$D/job.yaml" --run-dir "$D/run"

# The run as one HTML page (docs/report.md): loss curves, samples/s per rank, measured against
# predicted step time and memory, the plan. The run directory goes at exit; the page stays in the
# build directory, to open in any browser (no network needed).
REPORT=$PWD/${BUILD:-build/rel}/demo-report.html
rule "cephalo report: the run as a page"
"$BIN" report "$D/run" -o "$REPORT" >/dev/null
echo "report: $REPORT (open it in a browser: file://$REPORT)"

# What the model learned: its last checkpoint (the run's ckpt/ directory, whose `latest` names it;
# three ranks' shards) continues a prompt, byte by byte, with a KV cache (docs/sample.md). A low
# temperature and a fixed seed: the same text every time, fewer of the loops greedy decoding falls
# into on a model this small. The model sees 128 positions, so prompt + continuation fit in 128.
PROMPT="The meaning of life is"
rule "cephalo-worker sample: the trained model continues \"$PROMPT\""
"${BUILD:-build/rel}/bin/cephalo-worker" sample --checkpoint "$D/run/ckpt" --prompt "$PROMPT" \
  --max-new-tokens $((128 - ${#PROMPT})) --temperature 0.7 --top-k 40 --seed 1 --threads 2
