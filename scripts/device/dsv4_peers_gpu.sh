#!/usr/bin/env bash
# hdk's DeepSeek-V4 read side against FlashMLA and DeepGEMM (bench/dsv4_vs_peers.py) on a GPU
# machine in one call, from the repository root with .peers/dsv4 carried
# (scripts/peers/dsv4.sh's header says what it holds):
#   1. peers   scripts/peers/dsv4.sh build (in the background, $HDK_PEERS_JOBS compiles, default 4):
#              FlashMLA's SM90 sparse decode and DeepGEMM into /tmp/hdk_dsv4_peers, or restored
#              from .peers/dsv4/built.tar.xz; a finished build is reused.
#   2. libhdk  cmake configure + build of the `hdk` target with CUDA in $HDK_BUILD_DIR (default
#              build-cuda), incremental; HDK_PREBUILT_LIB=path skips it.
#   3. python  hdk's package in prebuilt mode into $HDK_SITE (default /tmp/hdk_dsv4_site), reused
#              while libhdk and python/csrc are unchanged (the .py files are refreshed each time).
#   4. bench   bench/dsv4_vs_peers.py in two processes (a peer's crash in one loses nothing of
#              the other; $HDK_PEERS_OPS, default "sparse,index", picks them):
#              --ops sparse -> $OUT/dsv4_vs_peers_sparse.json (when flash_mla imports)
#              and --ops index -> $OUT/dsv4_vs_peers_index.json (against DeepGEMM when its
#              build and JIT warm-up passed, else --index-peer none: hdk's columns alone), each
#              with $HDK_PEERS_ARGS (e.g. "--N 1,8,64") under $HDK_PEERS_TIMEOUT seconds (default
#              420). They run even when the peers' stage failed. When it failed,
#              scripts/peers/dsv4.sh diagnose -> $OUT/dsv4_peers_diagnose.log first.
#   5. save    scripts/peers/dsv4.sh save -> $OUT/built.tar.xz (carry it as
#              .peers/dsv4/built.tar.xz next time: no peer compile then), when the peers passed.
# Logs: $OUT/dsv4_peers_*.log (OUT default /tmp/hdk-out). Exits non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/hdk-out}
mkdir -p "$out"
python=${PYTHON:-python3}
build=${HDK_BUILD_DIR:-build-cuda}
site=${HDK_SITE:-/tmp/hdk_dsv4_site}
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export LD_LIBRARY_PATH="$CUDA_HOME/lib64:${LD_LIBRARY_PATH:-}"
failed=()
stage_prefix=dsv4_peers_
source scripts/device/stage.sh

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/dsv4_peers_gpu.txt"
"$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
  "cuda", torch.version.cuda)' 2>&1 | tee -a "$out/dsv4_peers_gpu.txt"

# 1. The peers, in the background while hdk builds.
HDK_JOBS=${HDK_PEERS_JOBS:-4} bash scripts/peers/dsv4.sh build >"$out/dsv4_peers_build.log" 2>&1 &
peers_pid=$!
peers_start=$SECONDS

# 2. libhdk with CUDA.
library=${HDK_PREBUILT_LIB:-}
if [[ -z $library ]]; then
  library=$build/src/libhdk.so
  cmake_build() {
    if [[ ! -f $build/CMakeCache.txt ]]; then
      cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHDK_WITH_CUDA=ON || return 1
    fi
    cmake --build "$build" --parallel "$(nproc)" --target hdk
  }
  stage libhdk cmake_build
fi
library=$(realpath "$library" 2>/dev/null || echo "$library")

# 3. hdk's Python package (prebuilt mode: only python/csrc compiles).
python_package() {
  [[ -f $library ]] || { echo "no libhdk at $library" >&2; return 1; }
  local want
  want=$({ sha256sum <"$library"; cat python/setup.py python/csrc/* | sha256sum; } | tr -d ' -\n')
  if [[ -f $site/.hdk-stamp && $(cat "$site/.hdk-stamp") == "$want" ]]; then
    echo "reusing $site (same libhdk and python/csrc); refreshing the .py files"
  else
    rm -rf "$site"
    if ! { "$python" -m pip --version >/dev/null 2>&1 &&
      HDK_PREBUILT_LIB=$library "$python" -m pip install --no-build-isolation --no-deps --no-index \
        --disable-pip-version-check --root-user-action=ignore --target "$site" ./python; }; then
      echo "pip install unavailable or failed; building with setup.py into $site"
      (cd python && HDK_PREBUILT_LIB=$library "$python" setup.py build --build-lib "$site") || return 1
    fi
    echo "$want" >"$site/.hdk-stamp"
  fi
  (cd python && find hdk -name '*.py' -exec cp --parents {} "$site/" \;)
  PYTHONPATH=$site "$python" -c 'import hdk; print("hdk", hdk.__version__, "libhdk CUDA",
    hdk.built_with_cuda(), "extension CUDA", hdk.extension_has_cuda())'
}
[[ ${#failed[@]} -eq 0 ]] && stage python python_package

echo "=== peers: waiting for scripts/peers/dsv4.sh build"
wait "$peers_pid"
peers_status=$?
cat "$out/dsv4_peers_build.log"
echo "=== peers: exit $peers_status after $((SECONDS - peers_start)) s"
[[ $peers_status -eq 0 ]] || failed+=(peers)

# 4. The comparison: sparse and index in separate processes, whatever the peers' stage said.
if [[ $peers_status -ne 0 ]]; then
  echo "=== peers: failed; scripts/peers/dsv4.sh diagnose -> $out/dsv4_peers_diagnose.log"
  timeout 900 bash scripts/peers/dsv4.sh diagnose >"$out/dsv4_peers_diagnose.log" 2>&1
  cat "$out/dsv4_peers_diagnose.log"
fi
if [[ " ${failed[*]} " != *" libhdk "* && " ${failed[*]} " != *" python "* ]]; then
  # shellcheck source=/dev/null
  source <(bash scripts/peers/dsv4.sh env)
  bench_env=(env PYTHONPATH="$site:$PYTHONPATH" timeout "${HDK_PEERS_TIMEOUT:-420}" "$python")
  ops=",${HDK_PEERS_OPS:-sparse,index},"
  if [[ $ops != *,sparse,* ]]; then
    echo "=== bench_sparse: not asked for (HDK_PEERS_OPS)"
  elif "$python" -c 'import flash_mla' >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    stage bench_sparse "${bench_env[@]}" bench/dsv4_vs_peers.py --ops sparse \
      --json "$out/dsv4_vs_peers_sparse.json" ${HDK_PEERS_ARGS:-}
  else
    echo "=== bench_sparse: flash_mla does not import; skipped"
    failed+=(bench_sparse)
  fi
  index_peer=deepgemm
  [[ $peers_status -eq 0 ]] || index_peer=none  # DeepGEMM's build or JIT warm-up failed
  if [[ $ops == *,index,* ]]; then
    echo "=== bench_index: --index-peer $index_peer"
    # shellcheck disable=SC2086
    stage bench_index "${bench_env[@]}" bench/dsv4_vs_peers.py --ops index \
      --index-peer "$index_peer" --json "$out/dsv4_vs_peers_index.json" ${HDK_PEERS_ARGS:-}
  else
    echo "=== bench_index: not asked for (HDK_PEERS_OPS)"
  fi
fi

# 5. The peers' build for the next machine (not when it came from the carried one).
if [[ $peers_status -eq 0 ]] && ! grep -q "restored; no compile needed" "$out/dsv4_peers_build.log"; then
  stage save env OUT="$out" bash scripts/peers/dsv4.sh save
fi

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "failed stages: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
