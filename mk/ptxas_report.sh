#!/usr/bin/env bash
# ptxas -v reports of `make cuda-check` (one NAME.o.ptxas beside each object, the compile's
# stderr with -Xptxas -v) as tables: per architecture, the kernels' count, the most registers
# and every kernel that spills; then the tensor-core attention kernels (cuda_attention_mma.cu)
# one row each, registers and spill bytes, for sm_75 and up (sm_75: the fp16 kernels as two
# m16n8k8 per product, bf16 a trap; below sm_75 all compile to a trap).
# Exit 1 when a tensor-core attention kernel spills on sm_80 or sm_90: they were written not to
# (docs/cuda.md), and a spill there would cost more than the tensor cores gain. On sm_75 spills
# are shown, not failed: CUDA 11.8 spills a few bytes in the fp16 backward at width 128 (nvcc 13
# none), still far ahead of Turing's fp32 kernels (docs/cuda.md).
#
#   mk/ptxas_report.sh build/cuda-check/cuda11.8/sm_80/worker/devices/*.o.ptxas ...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: $0 FILE.o.ptxas..." >&2; exit 2; }
demangle() { if command -v c++filt >/dev/null; then c++filt; else cat; fi; }
# one line per kernel: arch<TAB>file<TAB>kernel (mangled)<TAB>registers<TAB>spill stores<TAB>spill loads
# <TAB>toolkit/arch (the report's directory, e.g. cuda11.8/sm_80, nvcc/sm_75)
rows=$(for f in "$@"; do
    src=$(basename "${f%.o.ptxas}")
    tk=$(printf '%s\n' "$f" | grep -oE '[^/]+/sm_[0-9]+' | tail -1)
    awk -v src="$src" -v tk="${tk:-?}" '
        /Compiling entry function/ { match($0, /function .[^'"'"']*/); name = substr($0, RSTART + 10, RLENGTH - 10);
                                     match($0, /for .sm_[0-9]+/); arch = substr($0, RSTART + 8, RLENGTH - 8); st = sl = 0; next }
        /bytes spill stores/ && name != "" { st = $5; sl = $9 }
        /Used [0-9]+ registers/ && name != "" { match($0, /Used [0-9]+/); r = substr($0, RSTART + 5, RLENGTH - 5);
                                                printf "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", arch, src, name, r, st, sl, tk; name = "" }
    ' "$f"
done)
[ -n "$rows" ] || { echo "ptxas report: no 'Compiling entry function' lines in $* (was -Xptxas -v passed?)" >&2; exit 1; }
echo "ptxas -v: kernels, most registers, spills (bytes stored/loaded) per toolkit and architecture:"
for a in $(printf '%s\n' "$rows" | cut -f7 | sort -u); do
    sel=$(printf '%s\n' "$rows" | awk -F'\t' -v a="$a" '$7 == a')
    n=$(printf '%s\n' "$sel" | wc -l)
    maxr=$(printf '%s\n' "$sel" | cut -f4 | sort -n | tail -1)
    spills=$(printf '%s\n' "$sel" | awk -F'\t' '$5 > 0 || $6 > 0 { printf "%s\t%s/%s\n", $3, $5, $6 }' | demangle |
             sed -E 's/^void //; s/\(anonymous namespace\):://g; s/\([^()]*\)\t/\t/' | awk -F'\t' '{ printf "%s%s %s", (NR > 1 ? "; " : ""), $1, $2 }')
    printf '  %-15s %4d kernels, max %3d registers, spills: %s\n' "$a" "$n" "$maxr" "${spills:-none}"
done
echo "tensor-core attention kernels (cuda_attention_mma.cu): registers at widths 16/32/64/128, spill bytes stored/loaded"
mma=$(printf '%s\n' "$rows" | awk -F'\t' '$3 ~ /attn_mma_/ && $1 >= 75')
if [ -z "$mma" ]; then echo "  (none compiled for sm_75+)"; fi
printf '%s\n' "$mma" | awk -F'\t' 'NF {
        match($3, /attn_mma_[a-z]+_kernelILi[0-9]+ELb[01]E/); k = substr($3, RSTART + 9, RLENGTH - 9);
        split(k, p, "_kernelILi"); kind = p[1]; split(p[2], q, "ELb"); w = q[1]; f16 = substr(q[2], 1, 1);
        key = $7 "\t" kind "\t" (f16 == "1" ? "fp16" : "bf16"); reg[key, w] = $4; sp[key] += $5 + $6; spl[key] = spl[key] " " $5 "/" $6; keys[key] = 1 }
    END { for (key in keys) { split(key, f, "\t");
              printf "  %-15s %-4s %-5s %3s/%3s/%3s/%3s registers, spills %s\n", f[1], f[2], f[3], reg[key, 16], reg[key, 32], reg[key, 64], reg[key, 128],
                     sp[key] ? spl[key] : "none" } }' | sort
bad=$(printf '%s\n' "$mma" | awk -F'\t' 'NF && ($1 == 80 || $1 == 90) && ($5 > 0 || $6 > 0)' | wc -l)
if [ "$bad" -gt 0 ]; then
    echo "ptxas report: $bad tensor-core attention kernel(s) spill on sm_80/sm_90" >&2
    exit 1
fi
