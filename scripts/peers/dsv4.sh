#!/usr/bin/env bash
# FlashMLA and DeepGEMM as DeepSeek-V4 peers of hdk (bench/dsv4_vs_peers.py): FlashMLA's SM90
# sparse FP8 decode (`flash_mla.flash_mla_with_kvcache`, what vLLM and SGLang call for
# DeepSeek-V4 attention on Hopper) and DeepGEMM's `fp8_paged_mqa_logits` with
# `get_paged_mqa_logits_metadata` (their indexer), built from source on a GPU machine without
# network access, from a slim payload carried in the git-ignored .peers/dsv4/.
#
#   scripts/peers/dsv4.sh pack      here: packs the pinned sources from local git mirrors (no work
#       tree needed: git archive) into .peers/dsv4/src.tar.xz. Mirrors: $HDK_FLASHMLA_GIT,
#       $HDK_DEEPGEMM_GIT, $HDK_CUTLASS_GIT, $HDK_FMT_GIT (git dirs; default
#       /work/.mirror/<owner>+<name>/repo), or as four arguments in that order.
#   scripts/peers/dsv4.sh objects   here (nvcc 13.0, no GPU, no torch): compiles FlashMLA's four
#       kernel sources for sm_90a into .peers/dsv4/flashmla-sm90a-objects.tar.xz, so the GPU
#       machine compiles only the two small host files and links (HDK_JOBS parallel compiles).
#   scripts/peers/dsv4.sh build     on the GPU machine, from the repository root, with
#       .peers/dsv4 carried: unpacks to $HDK_DSV4_PEERS_DIR (default /tmp/hdk_dsv4_peers), builds
#       flash_mla (the kernel objects from the payload when their nvcc release, flags and pins
#       match, compiled there otherwise; then only two host files compile, and the link) and
#       deep_gemm (one translation unit) into $HDK_DSV4_PEERS_DIR/site, in parallel (-j from the
#       core count), prints each build's time, then imports both and, on a GPU, warms
#       DeepGEMM's JIT cache ($HDK_DSV4_PEERS_DIR/jit-cache) for the benchmark's shapes. A
#       finished build is reused (marker $HDK_DSV4_PEERS_DIR/BUILT: the payload's checksum, the
#       Python and torch versions). With .peers/dsv4/built.tar.xz present (a `save` of an earlier
#       machine) and the same payload and versions, it is unpacked instead of compiling.
#   scripts/peers/dsv4.sh save      after build: $OUT/built.tar.xz (site/ and jit-cache/, under
#       16 MiB) for .peers/dsv4/built.tar.xz on the next machine.
#   scripts/peers/dsv4.sh diagnose  after build (GPU machine): ldd / NEEDED / RUNPATH of deep_gemm's
#       _C, which libcudart / libnvrtc / libcuda / libcublasLt a process loads (after importing
#       torch, deep_gemm, after a CUDA op), nvcc and c++ versions, the package's include tree,
#       HOME / CUDA_HOME, and one metadata call under faulthandler with DG_JIT_DEBUG=1 (and under
#       gdb when it fails and gdb exists). Always exits 0: it is a report.
#   scripts/peers/dsv4.sh env       prints the environment the peers need (PYTHONPATH, CUDA_HOME,
#       DG_JIT_CACHE_DIR); `source <(scripts/peers/dsv4.sh env)`. bench/dsv4_vs_peers.py finds
#       $HDK_DSV4_PEERS_DIR/site by itself too.
#
# Pinned (the newest snapshots on 2026-11-28, and the submodule commits each pins):
#   deepseek-ai/FlashMLA  9241ae3ef9bac614dd25e45e507e089f888280e0 (2026-04-29)
#     csrc/cutlass = NVIDIA/cutlass 147f5673d0c1c3dcf66f78d677fd647e4a020219 (2026-01-13)
#   deepseek-ai/DeepGEMM  54e22612409371d6364144b69086735beb54e98b (2026-06-23)
#     third-party/cutlass = NVIDIA/cutlass f3fde58372d33e9a5650ba7b80fc48b3b49d40c8 (2025-09-24)
#     third-party/fmt     = fmtlib/fmt 553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28 (header-only use)
#   All five commits are in the mirrors' histories (checked by pack).
# Left out: FlashMLA's dense decode, sparse and dense prefill and every SM100 kernel (their
#   sources; sparse_decode.h's dispatch to the SM100 and DeepSeek-V3.2 kernels links against
#   stubs that raise, scripts/peers/dsv4_build.py), FlashMLA's setup.py (it builds all 26
#   sources for sm_100f and sm_90a: scripts/peers/dsv4_build.py compiles the four the MODEL1
#   sparse decode needs for sm_90a and its own one-entry binding), tests, benchmarks and docs;
#   DeepGEMM's tests, scripts, setup.py (its build is one translation unit, csrc/python_api.cpp,
#   compiled directly) and third-party/tilelang_ops; of CUTLASS only include/ (and
#   tools/util/include/ for FlashMLA, which its setup.py puts on the include path) and the
#   licence; of fmt only include/ and the licence.
# Sizes: src.tar.xz 1.2 MiB (57 MiB unpacked: CUTLASS's two include trees share most files, and
#   xz's 64 MiB window packs the second almost free); the kernel objects 57 KiB (117 s to compile
#   on a 2-core machine without a GPU, nvcc 13.0); built.tar.xz a few MiB. Carry .peers/dsv4 as a whole
#   (src.tar.xz, the objects, and built.tar.xz when there is one): well under 10 MiB.
# FlashMLA's and DeepGEMM's code stays in the git-ignored .peers/ and $HDK_DSV4_PEERS_DIR: none of
#   it ever enters a commit.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
peers=${HDK_DSV4_PEERS:-$root/.peers/dsv4}
target=${HDK_DSV4_PEERS_DIR:-/tmp/hdk_dsv4_peers}
python=${PYTHON:-python3}
jobs=${HDK_JOBS:-$(nproc)}
builder=$root/scripts/peers/dsv4_build.py

FLASHMLA_COMMIT=9241ae3ef9bac614dd25e45e507e089f888280e0
FLASHMLA_CUTLASS=147f5673d0c1c3dcf66f78d677fd647e4a020219
DEEPGEMM_COMMIT=54e22612409371d6364144b69086735beb54e98b
DEEPGEMM_CUTLASS=f3fde58372d33e9a5650ba7b80fc48b3b49d40c8
DEEPGEMM_FMT=553ec11ec06fbe0beebfbb45f9dc3c9eabd83d28
OBJECTS=flashmla-sm90a-objects.tar.xz

say() { echo "dsv4.sh: $*"; }
mib() { echo "$(($(stat -c %s "$1") / 1024)) KiB"; }
die() {
  say "$*" >&2
  exit 1
}

xz_pack() {  # xz_pack <output> <dir> <entries...>: a reproducible tar.xz
  local output=$1 dir=$2
  shift 2
  tar -C "$dir" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - "$@" |
    xz -T"${HDK_XZ_THREADS:-0}" --lzma2=preset=9e,dict=64MiB >"$output.tmp"
  mv "$output.tmp" "$output"
}

submodule_commit() {  # submodule_commit <git dir> <commit> <path>
  git --git-dir="$1" ls-tree "$2" "$3" | awk '$2 == "commit" {print $3}'
}

archive() {  # archive <git dir> <commit> <destination> <paths...>
  local git_dir=$1 commit=$2 destination=$3
  shift 3
  git --git-dir="$git_dir" cat-file -e "$commit^{commit}" 2>/dev/null ||
    die "commit $commit is not in $git_dir (fetch a newer snapshot of the mirror)"
  mkdir -p "$destination"
  git --git-dir="$git_dir" archive --format=tar "$commit" -- "$@" 2>/dev/null |
    tar -C "$destination" -xf -
  local path
  for path in "$@"; do
    [[ -e $destination/$path ]] || die "$path missing from $git_dir at $commit"
  done
}

pack() {
  local mirrors=${HDK_MIRRORS:-/work/.mirror}
  local flashmla=${1:-${HDK_FLASHMLA_GIT:-$mirrors/deepseek-ai+FlashMLA/repo}}
  local deepgemm=${2:-${HDK_DEEPGEMM_GIT:-$mirrors/deepseek-ai+DeepGEMM/repo}}
  local cutlass=${3:-${HDK_CUTLASS_GIT:-$mirrors/NVIDIA+cutlass/repo}}
  local fmt=${4:-${HDK_FMT_GIT:-$mirrors/fmtlib+fmt/repo}}
  local pinned
  pinned=$(submodule_commit "$flashmla" "$FLASHMLA_COMMIT" csrc/cutlass)
  [[ $pinned == "$FLASHMLA_CUTLASS" ]] || die "FlashMLA pins CUTLASS $pinned, this script $FLASHMLA_CUTLASS"
  pinned=$(submodule_commit "$deepgemm" "$DEEPGEMM_COMMIT" third-party/cutlass)
  [[ $pinned == "$DEEPGEMM_CUTLASS" ]] || die "DeepGEMM pins CUTLASS $pinned, this script $DEEPGEMM_CUTLASS"
  pinned=$(submodule_commit "$deepgemm" "$DEEPGEMM_COMMIT" third-party/fmt)
  [[ $pinned == "$DEEPGEMM_FMT" ]] || die "DeepGEMM pins fmt $pinned, this script $DEEPGEMM_FMT"
  local stage=$peers/stage
  rm -rf "$stage" && mkdir -p "$stage"
  say "staging the pinned sources in $stage"
  archive "$flashmla" "$FLASHMLA_COMMIT" "$stage/flashmla" LICENSE flash_mla csrc/api/common.h \
    csrc/api/sparse_decode.h csrc/defines.h csrc/params.h csrc/utils.h csrc/kerutils \
    csrc/sm90/decode/sparse_fp8 csrc/smxx/decode csrc/sm100/decode/head64/kernel.h \
    csrc/sm100/prefill/sparse/fwd_for_small_topk/head128/phase1.h
  archive "$deepgemm" "$DEEPGEMM_COMMIT" "$stage/deepgemm" LICENSE csrc deep_gemm
  archive "$cutlass" "$FLASHMLA_CUTLASS" "$stage/cutlass-flashmla" LICENSE.txt include \
    tools/util/include
  archive "$cutlass" "$DEEPGEMM_CUTLASS" "$stage/cutlass-deepgemm" LICENSE.txt include
  archive "$fmt" "$DEEPGEMM_FMT" "$stage/fmt" LICENSE include
  cat >"$stage/PINS" <<EOF
flashmla deepseek-ai/FlashMLA $FLASHMLA_COMMIT
cutlass-flashmla NVIDIA/cutlass $FLASHMLA_CUTLASS
deepgemm deepseek-ai/DeepGEMM $DEEPGEMM_COMMIT
cutlass-deepgemm NVIDIA/cutlass $DEEPGEMM_CUTLASS
fmt fmtlib/fmt $DEEPGEMM_FMT
EOF
  say "packing (xz -9e)"
  xz_pack "$peers/src.tar.xz" "$stage" PINS flashmla deepgemm cutlass-flashmla cutlass-deepgemm fmt
  say "$peers/src.tar.xz: $(mib "$peers/src.tar.xz") ($(du -sm "$stage" | cut -f1) MiB unpacked)"
  rm -rf "$stage"  # .peers/dsv4 is carried as a whole: only the payloads stay in it
}

unpack_sources() {  # unpack_sources <dir>: src.tar.xz into <dir>
  [[ -f $peers/src.tar.xz ]] || die "no $peers/src.tar.xz: run '$0 pack' where the mirrors are, and carry .peers/dsv4"
  rm -rf "$1" && mkdir -p "$1"
  xz -dc "$peers/src.tar.xz" | tar -C "$1" -xf -
}

objects() {
  local work=$peers/objects-work
  unpack_sources "$work/src"
  local start=$SECONDS
  "$python" "$builder" objects --src "$work/src" --out "$work/objects" --jobs "$jobs"
  say "kernel objects: $((SECONDS - start)) s on $jobs jobs ($(nproc) cores here)"
  cp "$work/src/PINS" "$work/objects/PINS"
  xz_pack "$peers/$OBJECTS" "$work/objects" .
  rm -rf "$work"
  say "$peers/$OBJECTS: $(mib "$peers/$OBJECTS")"
}

stamp() {  # what a build depends on: the payload and this machine's Python and torch
  {
    sha256sum <"$peers/src.tar.xz" | cut -d' ' -f1
    "$python" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda)'
    sha256sum <"$builder" | cut -d' ' -f1
  } 2>&1
}

# The C++ runtime DeepGEMM's _C was linked against, loaded first. Without it, the first JIT call
# died in std::regex's constructor (DeepGEMM's IncludeParser) with a null facet, in
# std::codecvt's neighbourhood (a backtrace from a SIGSEGV handler on the H200 machine): another
# library of the process (torch's, Triton's) answered the locale's facet lookups. Preloading the
# system libstdc++ makes every library use its facets; the warm-up and the benchmark then ran.
libstdcxx() {
  local path
  path=$(${CXX:-c++} -print-file-name=libstdc++.so.6 2>/dev/null)
  [[ -f $path ]] && readlink -f "$path"
}

peer_python() {  # peer_python <args...>: python with the peers' environment
  PYTHONPATH="$target/site${PYTHONPATH:+:$PYTHONPATH}" DG_JIT_CACHE_DIR="$target/jit-cache" \
    LD_PRELOAD="$(libstdcxx)${LD_PRELOAD:+:$LD_PRELOAD}" \
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} "$python" "$@"
}

# The warm-up script (also diagnose's): one step a line on stdout, flushed, so the last step a
# crashed process reached is in its log; faulthandler (-X faulthandler) adds the Python stack.
WARM_PY='import sys

import torch

batch, blocks, block_kv = int(sys.argv[1]), 4, 64
print(f"warm {batch}: import deep_gemm", flush=True)
import deep_gemm

print(f"warm {batch}: deep_gemm {deep_gemm.__version__} from {deep_gemm.__file__}", flush=True)
cache = torch.zeros(blocks, block_kv, 1, 132, dtype=torch.uint8, device="cuda")
lens = torch.full((batch, 1), blocks * block_kv, dtype=torch.int32, device="cuda")
print(f"warm {batch}: deep_gemm.get_num_sms() (DeepGEMM device runtime: cuBLASLt handle)", flush=True)
sms = deep_gemm.get_num_sms()
print(f"warm {batch}: {sms} SMs; get_paged_mqa_logits_metadata (JIT: nvcc)", flush=True)
meta = deep_gemm.get_paged_mqa_logits_metadata(lens, block_kv, sms)
torch.cuda.synchronize()
print(f"warm {batch}: metadata {tuple(meta.shape)}", flush=True)
if "logits" in sys.argv[2:]:
    q = torch.zeros(batch, 1, 64, 128, device="cuda").to(torch.float8_e4m3fn)
    weights = torch.zeros(batch, 64, device="cuda")
    table = torch.zeros(batch, blocks, dtype=torch.int32, device="cuda")
    print(f"warm {batch}: fp8_paged_mqa_logits", flush=True)
    deep_gemm.fp8_paged_mqa_logits(q, cache, weights, lens, table, meta, blocks * block_kv, False)
    torch.cuda.synchronize()
print(f"warm {batch}: done", flush=True)
'

jit_debug() {  # jit_debug <command...>: with DeepGEMM's JIT saying what it runs (nvcc commands)
  DG_JIT_DEBUG=1 DG_JIT_PRINT_COMPILER_COMMAND=1 TORCH_SHOW_CPP_STACKTRACES=1 \
    TORCH_DISABLE_ADDR2LINE=1 "$@"
}

gdb_backtrace() {  # gdb_backtrace <python args...>: one run under gdb, its native backtrace
  if ! command -v gdb >/dev/null; then
    say "no gdb on this machine: no native backtrace"
    return 0
  fi
  say "re-running under gdb: python $*"
  PYTHONPATH="$target/site${PYTHONPATH:+:$PYTHONPATH}" DG_JIT_CACHE_DIR="$target/jit-cache" \
    CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} jit_debug timeout 300 gdb -q -batch \
    -ex "set pagination off" -ex "handle SIGPIPE nostop noprint" -ex run -ex bt \
    -ex "info sharedlibrary" --args "$(command -v "$python")" -X faulthandler "$@" 2>&1 |
    grep -v -e '^\[New Thread' -e '^\[Thread .* exited' | tail -n 400 | sed 's/^/    gdb: /'
}

check() {  # check [warm]: the packages import; with `warm`, on a GPU, DeepGEMM's JIT compiles
  # the kernels the benchmark uses (nvcc, tens of seconds each; cached in jit-cache/), three
  # processes at once: the logits kernel (64 heads, next_n 1) with the scheduler for batches
  # up to 32, and the scheduler for batches aligned to 64 and to 128. Each runs under
  # faulthandler with DeepGEMM's JIT debug output into $target/warm-logs/, printed after; on a
  # failure one is re-run under gdb (where there is one) for the native backtrace.
  peer_python -c 'import deep_gemm, flash_mla
print(f"dsv4.sh: flash_mla from {flash_mla.__file__}; deep_gemm {deep_gemm.__version__} from {deep_gemm.__file__}")' ||
    return 1
  [[ ${1:-} == warm ]] || return 0
  if ! peer_python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    say "no GPU: DeepGEMM's JIT cache is not warmed"
    return 0
  fi
  local start=$SECONDS pids=() batches=(1 64 128) status=0 logs=$target/warm-logs i rc
  rm -rf "$logs" && mkdir -p "$logs" "$target/jit-cache"
  printf '%s' "$WARM_PY" >"$target/warm.py"
  for i in "${!batches[@]}"; do
    local extra=()
    [[ $i -eq 0 ]] && extra=(logits)
    jit_debug peer_python -X faulthandler "$target/warm.py" "${batches[$i]}" "${extra[@]}" \
      >"$logs/warm-${batches[$i]}.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    [[ $rc -eq 0 ]] || status=1
    say "--- warm-up batch ${batches[$i]}: exit $rc$([[ $rc -gt 128 ]] && echo " (signal $((rc - 128)))")"
    tail -n 150 "$logs/warm-${batches[$i]}.log" | sed 's/^/    /'
  done
  say "DeepGEMM's JIT cache warmed in $((SECONDS - start)) s (status $status)"
  [[ $status -eq 0 ]] || gdb_backtrace "$target/warm.py" 64
  return "$status"
}

diagnose() {  # what DeepGEMM's _C links and loads, the toolchain, and one metadata call
  set +e +o pipefail  # a report: a missing tool or a failing step says so and the rest runs
  local so home=${CUDA_HOME:-/usr/local/cuda}
  so=$(ls "$target"/site/deep_gemm/_C*.so 2>/dev/null | head -1)
  say "HOME=${HOME:-<unset>} CUDA_HOME=${CUDA_HOME:-<unset>} DG_JIT_CACHE_DIR=$target/jit-cache"
  say "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-<unset>}"
  say "python $(command -v "$python"); c++: $(${CXX:-c++} --version 2>&1 | head -1)"
  "$home/bin/nvcc" --version 2>&1 | tail -2 | sed 's/^/    /'
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -2 | sed 's/^/    /'
  say "gdb: $(command -v gdb || echo none)"
  if [[ -n $so ]]; then
    say "ldd $so"
    ldd "$so" 2>&1 | grep -E "torch|c10|cuda|cublas|nvrtc|stdc|not found" | sed "s/^/    /"
    say "NEEDED and RPATH/RUNPATH"
    readelf -d "$so" 2>&1 | grep -E 'NEEDED|RPATH|RUNPATH' | sed 's/^/    /'
    say "undefined cuBLAS / CUDA runtime / NVRTC symbols"
    nm -D --undefined-only "$so" 2>/dev/null | grep -E ' (cublas|cuda|nvrtc)' | sed 's/^/    /'
  else
    say "no deep_gemm/_C*.so under $target/site"
  fi
  say "include tree: $target/site/deep_gemm/include"
  ls "$target/site/deep_gemm/include" 2>&1 | sed 's/^/    /'
  ls "$target/site/deep_gemm/include/deep_gemm" 2>&1 | sed 's/^/    deep_gemm\//'
  ls "$target/site/deep_gemm/include/cute" 2>&1 | head -4 | sed 's/^/    cute\//'
  ls "$target/site/deep_gemm/include/cutlass" 2>&1 | head -4 | sed 's/^/    cutlass\//'
  say "package: $(ls "$target/site/deep_gemm" 2>&1 | tr '\n' ' ')"
  say "libraries a process maps (/proc/self/maps): after import torch, import deep_gemm, a CUDA op"
  peer_python -X faulthandler - <<'PYEOF' 2>&1 | sed 's/^/    /'
import re


def loaded(stage):
    pattern = r"lib(cudart|nvrtc|cuda|cublasLt|cublas|torch_cuda|c10_cuda|stdc\+\+)[.-][^/]*$"
    with open("/proc/self/maps") as maps:
        names = {line.split()[-1] for line in maps if re.search(pattern, line.strip())}
    print(f"{stage}:")
    for name in sorted(names):
        print(f"  {name}")


import torch

loaded("import torch")
import deep_gemm

loaded("import deep_gemm")
print("deep_gemm", deep_gemm.__version__, deep_gemm.__file__)
print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11 abi",
      torch._C._GLIBCXX_USE_CXX11_ABI)
if torch.cuda.is_available():
    torch.ones(1, device="cuda").add_(1)
    torch.cuda.synchronize()
    loaded("after a torch CUDA op")
    import ctypes

    version = ctypes.c_int()
    ctypes.CDLL("libcudart.so.13").cudaRuntimeGetVersion(ctypes.byref(version))
    print("cudaRuntimeGetVersion (the libcudart.so.13 loaded):", version.value)
    ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
    print("cuDriverGetVersion:", version.value)
PYEOF
  say "one metadata call (batch 64) under faulthandler with DeepGEMM's JIT debug output"
  mkdir -p "$target/jit-cache"
  printf '%s' "$WARM_PY" >"$target/warm.py"
  local rc=0
  jit_debug peer_python -X faulthandler "$target/warm.py" 64 >"$target/diagnose-warm.log" 2>&1 ||
    rc=$?
  tail -n 300 "$target/diagnose-warm.log" | sed 's/^/    /'
  say "metadata call: exit $rc"
  [[ $rc -eq 0 ]] || gdb_backtrace "$target/warm.py" 64
  return 0
}

build() {
  local want
  want=$(stamp)
  mkdir -p "$target"
  if [[ -f $target/BUILT && $(cat "$target/BUILT") == "$want" ]]; then
    say "already built in $target (delete $target/BUILT to rebuild)"
    check
    return
  fi
  if [[ -f $peers/built.tar.xz ]]; then
    say "restoring $peers/built.tar.xz"
    rm -rf "$target/site" "$target/jit-cache" "$target/restore"
    mkdir -p "$target/restore"
    xz -dc "$peers/built.tar.xz" | tar -C "$target/restore" -xf -
    if [[ -f $target/restore/BUILT && $(cat "$target/restore/BUILT") == "$want" ]]; then
      mv "$target/restore/site" "$target/restore/jit-cache" "$target/"
      rm -rf "$target/restore"
      if check warm; then
        echo "$want" >"$target/BUILT"
        say "restored; no compile needed"
        return
      fi
      say "the restored build does not import: building"
    else
      say "built.tar.xz is from another payload, Python or torch: building"
    fi
    rm -rf "$target/restore"
  fi
  local start=$SECONDS
  unpack_sources "$target/src"
  local objects_args=()
  if [[ -f $peers/$OBJECTS ]]; then
    rm -rf "$target/objects" && mkdir -p "$target/objects"
    xz -dc "$peers/$OBJECTS" | tar -C "$target/objects" -xf -
    objects_args=(--objects "$target/objects")
  fi
  rm -rf "$target/site" "$target/build"
  export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
  say "building with $jobs jobs (CUDA_HOME=$CUDA_HOME)"
  "$python" "$builder" all --src "$target/src" --prefix "$target" --jobs "$jobs" "${objects_args[@]}"
  say "build: $((SECONDS - start)) s"
  mkdir -p "$target/jit-cache"
  start=$SECONDS
  check warm || die "the peers do not import or DeepGEMM's JIT failed (above)"
  say "import and JIT warm-up: $((SECONDS - start)) s"
  echo "$want" >"$target/BUILT"
}

save() {
  [[ -f $target/BUILT ]] || die "nothing built in $target"
  local out=${OUT:?set OUT to the folder that receives built.tar.xz}
  mkdir -p "$out"
  rm -rf "$target/jit-cache/tmp"
  tar -C "$target" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    -cf - BUILT site jit-cache | xz -T0 -9 >"$out/built.tar.xz"
  say "$out/built.tar.xz: $(mib "$out/built.tar.xz") (carry it as .peers/dsv4/built.tar.xz)"
  [[ $(stat -c %s "$out/built.tar.xz") -lt $((16 * 1048576)) ]] || say "warning: over 16 MiB"
}

env_lines() {
  cat <<EOF
export PYTHONPATH="$target/site\${PYTHONPATH:+:\$PYTHONPATH}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
export DG_JIT_CACHE_DIR="$target/jit-cache"
export HDK_DSV4_PEERS_DIR="$target"
export LD_PRELOAD="$(libstdcxx)\${LD_PRELOAD:+:\$LD_PRELOAD}"
EOF
}

case ${1:-} in
  pack)
    shift
    pack "$@"
    ;;
  objects) objects ;;
  build) build ;;
  save) save ;;
  env) env_lines ;;
  diagnose) diagnose ;;
  *)
    echo "usage: $0 pack [flashmla-git deepgemm-git cutlass-git fmt-git]|objects|build|save|env|diagnose (see the header)" >&2
    exit 2
    ;;
esac
