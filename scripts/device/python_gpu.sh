#!/usr/bin/env bash
# hdk's Python package on a GPU machine. Run from the repo root after a CUDA build of libhdk
# exists (default build-cuda/src/libhdk.so, or HDK_PREBUILT_LIB) and with .peers/ carried over
# (SGLang's kernel file and FLA, for the benchmark). No network needed: torch, triton and nvcc
# come with the machine. Stages:
#   build   the extension in prebuilt mode (only python/csrc/*.cpp compile; libhdk is copied
#           next to it) into a temporary --target directory
#   tests   the pytest suite, CPU and CUDA cases (CUDA graphs, torch.compile)
#   bench   python -m hdk.bench gdn over the full grid -> $OUT/python_bench.json
#   dsv4    bench/dsv4_vs_torch.py -> $OUT/dsv4_vs_torch.json (HDK_SKIP_DSV4=1 skips it)
# HDK_SKIP_TESTS=1, HDK_SKIP_BENCH=1 and HDK_SKIP_DSV4=1 skip a stage; HDK_DSV4_ARGS passes
# options to dsv4_vs_torch.py (e.g. "--ops attention,indexer").
# Logs land in $OUT (default /tmp/hdk-out). Exits non-zero if any stage failed.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/hdk-out}
mkdir -p "$out"
python=${PYTHON:-python3}
library=$(realpath "${HDK_PREBUILT_LIB:-build-cuda/src/libhdk.so}")
site=$(mktemp -d)/site
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
failed=()

stage_prefix=python_
source "$(dirname "$0")/stage.sh"

build() {
  "$python" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
    "cuda", torch.version.cuda, "gpu", torch.cuda.get_device_name(0))'
  # pip when it works; setuptools directly otherwise (no pip, or no `wheel` for pip's build)
  if ! { "$python" -m pip --version >/dev/null 2>&1 &&
    HDK_PREBUILT_LIB=$library "$python" -m pip install --no-build-isolation --no-deps --no-index \
      --disable-pip-version-check --root-user-action=ignore --target "$site" ./python; }; then
    echo "pip install unavailable or failed; building with setup.py into $site"
    (cd python && HDK_PREBUILT_LIB=$library "$python" setup.py build --build-lib "$site") || return 1
  fi
  PYTHONPATH=$site "$python" -c 'import hdk; print("hdk", hdk.__version__, "libhdk CUDA",
    hdk.built_with_cuda(), "extension CUDA", hdk.extension_has_cuda())'
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/python_gpu.txt" ||
  echo "nvidia-smi failed: the CUDA cases will be skipped"
[[ -f $library ]] || { echo "no libhdk at $library: build it with CUDA first" >&2; exit 1; }
stage build build || { echo "build failed; see $out/python_build.log" >&2; exit 1; }
echo "package installed into $site (PYTHONPATH for later runs on this machine)"
if [[ -z ${HDK_SKIP_TESTS:-} ]]; then
  stage tests env PYTHONPATH="$site" timeout 180 "$python" -m pytest -q -rs -p no:cacheprovider \
    python/tests
fi
# HDK_BENCH_ARGS adds options (e.g. "--batch 1,64 --T 1" for a quick look); HDK_BENCH_TIMEOUT
# (seconds, default 300) bounds the benchmark.
if [[ -z ${HDK_SKIP_BENCH:-} ]]; then
  stage bench env PYTHONPATH="$site" timeout "${HDK_BENCH_TIMEOUT:-300}" "$python" -m hdk.bench gdn \
    --json "$out/python_bench.json" ${HDK_BENCH_ARGS:-}
fi

# The DeepSeek-V4 router and top-k against the plain PyTorch chain and torch.topk (issue 5), and
# the KV cache write side against plain PyTorch peers (issue 16; `--ops kv` runs that alone).
if [[ -z ${HDK_SKIP_DSV4:-} ]]; then
  stage dsv4_vs_torch env PYTHONPATH="$site" timeout 540 "$python" bench/dsv4_vs_torch.py \
    --json "$out/dsv4_vs_torch.json" ${HDK_DSV4_ARGS:-}
fi

if [[ ${#failed[@]} -gt 0 ]]; then
  echo "failed stages: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
