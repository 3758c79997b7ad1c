#!/usr/bin/env bash
# Tokenizer throughput (`make bench`): MB/s of each tokenizer kind on English text, one core. The
# text is the repository's docs/*.md concatenated and repeated to 4 MB; the tokenizer.json files
# are built from the npm packages of tests/cli/test_tokenizer.sh (mk/npm.sh, cached). The goal
# (docs/tokenizer.md): at least 10 MB/s per core.
set -uo pipefail
BUILD=${BUILD:-build/rel}
cd "$(dirname "$0")/.."
echo "== tokenizer throughput (bench/bench_tok.sh; goal >= 10 MB/s per core)"
if ! mods=$(mk/npm.sh 2>/tmp/bench_tok.$$.log); then
  echo "# skipped: mk/npm.sh could not fetch the tokenizers' vocabularies: $(tail -n 1 /tmp/bench_tok.$$.log)"
  rm -f /tmp/bench_tok.$$.log; exit 0
fi
rm -f /tmp/bench_tok.$$.log
dir=$BUILD/bench/tok
mkdir -p "$dir"
[ -f "$dir/llama3.json" ] || NODE_MODULES=$mods node tests/tok/tok.mjs build "$dir" || exit 1
: >"$dir/text.txt"
while [ "$(stat -c %s "$dir/text.txt")" -lt 4000000 ]; do cat docs/*.md >>"$dir/text.txt"; done
for k in gpt2 llama2 llama3; do
  printf '%-7s ' "$k:"
  "$BUILD/bench/bench_tok" "$dir/$k.json" "$dir/text.txt" 2 || exit 1
done
