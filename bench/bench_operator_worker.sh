#!/bin/sh
# bench/bench_operator.sh's stand-in for cephalo-worker: tests/k8s/kubelet.py runs it as every
# worker pod's container (`--worker bench/bench_operator_worker.sh`, the container args after it).
# It ignores its arguments, serves no /metrics (so the operator reads no progress and writes no
# progress status) and sleeps until SIGTERM, which ends it (exit code 143, as a stopped worker).
exec sleep infinity
