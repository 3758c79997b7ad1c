#!/usr/bin/env bash
# The Helm chart and the Dockerfiles, checked without helm or docker (neither is available here):
# tests/k8s/check_chart.py renders the chart's templates with a small renderer of the template
# subset they use and checks the manifests; tests/k8s/check_docker.py checks the Dockerfiles
# statically. The real API server's view of the chart and the CRD is tests/cli/test_k8s.sh's.
set -u
cd "$(dirname "$0")/../.."
if ! python3 -c 'import yaml' 2>/dev/null; then
  echo "not ok 1 - python3-yaml is missing (make deps)"; exit 0
fi
python3 tests/k8s/check_chart.py 2>&1 || echo "not ok - check_chart.py failed"
python3 tests/k8s/check_docker.py 2>&1 || echo "not ok - check_docker.py failed"
