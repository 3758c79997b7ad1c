#!/usr/bin/env bash
# A second CUDA toolkit for `make cuda-check`: Debian bookworm's non-free nvidia-cuda-toolkit
# (CUDA 11.8, the newest nvcc that still compiles for sm_60/61/70 next to sm_80-90) with its host
# compiler, gcc-11 (CUDA 11.8 accepts gcc <= 11; bookworm's own gcc is 12). Nothing is installed:
# the packages are fetched with `apt-get download` through a private apt configuration (its own
# source list, lists, cache and an empty dpkg status, all under the cache) and unpacked with
# dpkg-deb into the cache, so the machine's apt sources, lists and dpkg database stay untouched
# and no root is needed. Compile-only: no CUDA runtime libraries, no driver.
#
#   mk/cuda118.sh           make sure the cache holds the toolkit (fetch + unpack once: 860 MB
#                           downloaded, 45-95 s on 2 cores; then ~5 ms), print the path of its nvcc
#   mk/cuda118.sh nvcc      print that path if the cache holds the toolkit, else exit 1
#   mk/cuda118.sh clean     remove the cache
#
# The cache is $CEPHALO_CUDA118_CACHE, else ~/.cache/cephalo-cuda118 (XDG_CACHE_HOME honoured),
# the way tests/k8s/apiserver.sh keeps kube-apiserver in ~/.cache/cephalo-k8s. It holds root/
# (the unpacked, pruned packages, 189 MB) and stamp (the package list and the versions
# unpacked); a changed package list in this script refetches. The archive is
# $CEPHALO_CUDA118_MIRROR, else http://deb.debian.org/debian.
#
# Packages (the closure that compiling needs, not the packages' full Depends):
#   nvidia-cuda-toolkit       nvcc, cicc, ptxas, cudafe++, fatbinary, libdevice, and Debian's
#                             gcc/g++ wrapper scripts next to nvcc that run the newest supported
#                             g++-N found on PATH (g++-11 first). Its Depends "g++-11 | clang-14 |
#                             ..." is how Debian makes 11.8 work with gcc 12 installed;
#                             nvidia-cuda-toolkit-gcc only adds cuda-gcc/cuda-g++ symlinks.
#   nvidia-cuda-dev           only usr/include (cuda_runtime.h, cublas_v2.h, cublasLt.h,
#                             cuda_bf16.h, cuda_fp16.h, ...): the .deb is 774 MB because of the
#                             static and shared libraries, none of which a compile needs; its
#                             runtime-library Depends (libcublas11 etc.) are left out
#   libcub-dev libthrust-dev  CUB 1.17 (worker/devices/cuda_embed.cu's radix sort; CUB includes Thrust)
#   gcc-11 g++-11 cpp-11 libgcc-11-dev libstdc++-11-dev
#                             the host compiler, unpacked under root/usr: the gcc driver finds
#                             cc1plus, its own include dir and libstdc++ 11 headers relative to
#                             itself. It runs on the machine's libisl23/libmpc3/libmpfr6/libgmp10/
#                             libzstd1 and binutils, which gcc 12 (build-essential) already needs.
# The script checks that every tool resolves its shared libraries and compiles a smoke test
# (cuBLAS, cuBLASLt, bf16, fp16, CUB) for sm_60 before it writes the stamp.
set -euo pipefail
CACHE=${CEPHALO_CUDA118_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/cephalo-cuda118}
MIRROR=${CEPHALO_CUDA118_MIRROR:-http://deb.debian.org/debian}
ROOT=$CACHE/root
NVCC=$ROOT/usr/lib/nvidia-cuda-toolkit/bin/nvcc
STAMP=$CACHE/stamp
PKGS=(nvidia-cuda-toolkit nvidia-cuda-dev libcub-dev libthrust-dev
      gcc-11 g++-11 cpp-11 libgcc-11-dev libstdc++-11-dev)
# the stamp's first lines: a new layout or package list here means a new unpack
HEAD="cephalo-cuda118 layout 1
packages ${PKGS[*]}"
log() { echo "cuda118.sh: $*" >&2; }

cached() { [ -x "$NVCC" ] && [ -f "$STAMP" ] && [ "$(head -n 2 "$STAMP")" = "$HEAD" ]; }

case ${1:-install} in
  install) ;;
  nvcc) cached && { echo "$NVCC"; exit 0; }; exit 1 ;;
  clean) rm -rf "$CACHE"; exit 0 ;;
  *) echo "usage: mk/cuda118.sh [install|nvcc|clean]" >&2; exit 2 ;;
esac

if cached; then echo "$NVCC"; exit 0; fi
for t in apt-get dpkg-deb tar flock ldd; do
  command -v "$t" >/dev/null || { log "needs $t (Debian's apt, dpkg, tar, util-linux, libc-bin)"; exit 1; }
done
# one fetch at a time per cache (two builds or sessions may share it)
mkdir -p "$CACHE"; exec 9>"$CACHE/lock"; flock 9
if cached; then echo "$NVCC"; exit 0; fi
start=$SECONDS
work=$(mktemp -d "$CACHE/work.XXXXXX")
trap 'rm -rf "$work"' EXIT

# -- a private apt: only deb.debian.org bookworm, nothing read from or written to the machine's
# sources, lists, archives or dpkg status. The machine's apt.conf.d still applies (proxies and
# the like); its update hooks (appstream, packagekit) are cleared so they cannot run.
apt=$work/apt
mkdir -p "$apt/sources.list.d" "$apt/preferences.d" "$apt/lists/partial" "$apt/cache/archives/partial"
: >"$apt/status"
: >"$apt/preferences"
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
opt=; [ -f "$keyring" ] && opt="[signed-by=$keyring] "
echo "deb ${opt}$MIRROR bookworm main contrib non-free non-free-firmware" >"$apt/sources.list"
cat >"$apt/apt.conf" <<'EOF'
#clear APT::Update::Post-Invoke-Success;
#clear APT::Update::Post-Invoke;
#clear DPkg::Post-Invoke;
#clear DPkg::Pre-Invoke;
Acquire::Languages "none";
EOF
APT=(apt-get -q -c "$apt/apt.conf"
  -o Dir::Etc::SourceList="$apt/sources.list" -o Dir::Etc::SourceParts="$apt/sources.list.d"
  -o Dir::Etc::Preferences="$apt/preferences" -o Dir::Etc::PreferencesParts="$apt/preferences.d"
  -o Dir::State::Lists="$apt/lists" -o Dir::Cache="$apt/cache" -o Dir::State::status="$apt/status")
# as root apt drops to _apt for downloads, which may not write into this cache
[ "$(id -u)" = 0 ] && APT+=(-o APT::Sandbox::User=root)
log "fetching Debian bookworm's CUDA 11.8 toolkit and gcc-11 into $CACHE (once; about a minute)"
"${APT[@]}" update >"$work/update.log" 2>&1 || { cat "$work/update.log" >&2; log "apt-get update failed"; exit 1; }
mkdir -p "$work/debs"
(cd "$work/debs" && "${APT[@]}" download "${PKGS[@]}") >"$work/download.log" 2>&1 ||
  { cat "$work/download.log" >&2; log "apt-get download failed"; exit 1; }

# -- unpack into root.new, then swap it in
new=$work/root
mkdir -p "$new"
log "downloaded $(du -sm "$work/debs" | cut -f1) MB; unpacking"
versions=
for p in "${PKGS[@]}"; do
  deb=$(ls "$work/debs/${p}_"*.deb)
  versions+="$p $(dpkg-deb -f "$deb" Version)"$'\n'
  if [ "$p" = nvidia-cuda-dev ]; then
    # the headers only: dpkg-deb's data tar, filtered (extracting all 2.8 GB would take longer)
    dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$new" --wildcards './usr/include/*'
  else
    dpkg-deb -x "$deb" "$new"
  fi
  rm -f "$deb"
done
# prune what a compile never runs: docs, the sanitizer and disassembler, LTO, static libraries
rm -rf "$new/usr/share" "$new/usr/lib/nvidia-cuda-toolkit/compute-sanitizer"
rm -f "$new"/usr/bin/{compute-sanitizer,cuda-memcheck,nvdisasm,TreeLauncher*,*lto-dump-11} \
      "$new"/usr/lib/gcc/x86_64-linux-gnu/11/{lto1,*.a}
# nvcc reads nvcc.profile next to itself; Debian's is a link to /etc/nvcc.profile with /usr
# paths. This one is relative to nvcc: the cache's usr/bin first on nvcc's PATH (ptxas, and
# gcc-11/g++-11 for Debian's gcc/g++ wrappers), its usr/include, its libdevice.
bin=$new/usr/lib/nvidia-cuda-toolkit/bin
rm -f "$bin/nvcc.profile"
cat >"$bin/nvcc.profile" <<'EOF'
# written by Cephalo's mk/cuda118.sh: Debian's CUDA 11.8 unpacked into a cache, not installed
TOP                = $(_HERE_)/../../..
NVVMIR_LIBRARY_DIR = $(_HERE_)/../libdevice
PATH              += $(_HERE_):$(TOP)/bin:
INCLUDES          += "-I$(TOP)/include" $(_SPACE_)
EOF

# -- every tool finds its libraries on this machine, and a compile works
missing=$(for f in "$bin"/{nvcc,cicc} "$new"/usr/bin/{cudafe++,ptxas,fatbinary,x86_64-linux-gnu-gcc-11,x86_64-linux-gnu-g++-11} \
               "$new"/usr/lib/gcc/x86_64-linux-gnu/11/{cc1,cc1plus}; do
            [ -x "$f" ] || { echo "$f: missing"; continue; }
            ldd "$f" 2>/dev/null | sed -n "s|^\s*\(\S*\) => not found|${f#"$new"/}: \1|p"
          done)
[ -z "$missing" ] || { log "these tools lack a library (install it with the machine's apt):"; echo "$missing" >&2; exit 1; }
cat >"$work/smoke.cu" <<'EOF'
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>
__global__ void twice(__nv_bfloat16 *x, __half *y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { x[i] = __float2bfloat16(2.0f * __bfloat162float(x[i])); y[i] = __hadd(y[i], y[i]); }
}
int launch(__nv_bfloat16 *x, __half *y, int n) {
  size_t bytes = 0;
  cub::DeviceRadixSort::SortKeys(nullptr, bytes, (const unsigned *)nullptr, (unsigned *)nullptr, n);
  twice<<<(n + 255) / 256, 256>>>(x, y, n);
  return cudaGetLastError() == cudaSuccess && bytes > 0;
}
EOF
if ! (cd "$work" && "$bin/nvcc" -std=c++17 -O3 -gencode arch=compute_60,code=sm_60 --Werror all-warnings \
        -Wno-deprecated-gpu-targets -Xcompiler -Wall,-Wextra,-Werror -c smoke.cu -o smoke.o) 2>"$work/smoke.log"; then
  cat "$work/smoke.log" >&2; log "the CUDA 11.8 smoke compile failed"; exit 1
fi

rm -rf "$ROOT"
mv "$new" "$ROOT"
printf '%s\n%s' "$HEAD" "$versions" >"$STAMP.tmp" && mv "$STAMP.tmp" "$STAMP"
log "CUDA 11.8 ready in $((SECONDS - start)) s: $(du -sm "$ROOT" | cut -f1) MB in $ROOT ($("$NVCC" --version | tail -n 1))"
echo "$NVCC"
