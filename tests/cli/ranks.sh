# ranks.sh - running the ranks of a multi-rank job by hand, for the CLI and GPU tests. Source it
# after setting $T (scratch directory), $PY (a python3 with numpy) and $W (the worker binary);
# $RANK_TIMEOUT (seconds) bounds each rank when set. Not a test script itself (no test_ prefix).

free_port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
world_of() { $PY -c "import json; print(len(json.load(open('$1'))['ranks']))"; }

# cluster_of N [GIB] -> a cluster file of N one-thread CPU devices of GIB (default 1) GiB
cluster_of() {
  printf 'nodes:\n  - name: local\n    gpus:\n      - {type: cpu, count: %d, threads: 1, memory_gib: %s}\n' \
    "$1" "${2:-1}" >"$T/c$1.yaml"
  echo "$T/c$1.yaml"
}

# start_ranks PLAN OUT [worker args...]: starts every rank in the background (pids in $PIDS), on
# synthetic tokens unless the args name other --data (the last --data given wins)
start_ranks() {
  local plan=$1 out=$2
  shift 2
  local world port r tmo=()
  world=$(world_of "$plan")
  port=$(free_port)
  [ -n "${RANK_TIMEOUT:-}" ] && tmo=(timeout "$RANK_TIMEOUT")
  mkdir -p "$out"
  PIDS=()
  for ((r = 0; r < world; r++)); do
    RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port CEPHALO_PLAN=$plan \
      "${tmo[@]}" "$W" train --quiet --data synthetic --log "$out/rank$r.jsonl" "$@" 2>"$out/rank$r.err" &
    PIDS+=($!)
  done
}

# run_ranks PLAN OUT [worker args...]: runs every rank to the end; fails if any rank fails
run_ranks() {
  start_ranks "$@"
  local rc=0 p
  for p in "${PIDS[@]}"; do wait "$p" || rc=1; done
  return $rc
}
