#!/usr/bin/env bash
# Installs the Debian packages Cephalo needs, only those missing. Idempotent; needs root to install.
set -euo pipefail
pkgs=(build-essential clang libclang-rt-14-dev pkg-config libyaml-dev libcjson-dev libcmocka-dev
      libopenblas-openmp-dev libmicrohttpd-dev libcurl4-openssl-dev python3 python3-numpy python3-torch
      prometheus # the real scraper of tests/cli/test_metrics.sh
      python3-yaml kubectl # tests/cli/test_chart.sh, test_k8s.sh (tests/k8s/apiserver.sh builds the API server)
      fortunes) # fortunes: the English text `make demo` trains on
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "make deps: missing Debian packages: ${missing[*]}" >&2
  echo "make deps: run 'sudo make deps' (or apt-get install them) and try again" >&2
  exit 1
fi
echo "make deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
