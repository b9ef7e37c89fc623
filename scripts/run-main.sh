#!/usr/bin/env bash
# Fresh machine -> the main job: build hdk and run the GDN decode benchmark on the Qwen3.5-397B
# shape, checked against the float64 oracle (GPU when one is present, CPU otherwise).
#
# The CUDA backend is built only where it can run: a GPU is present (`nvidia-smi -L` lists one,
# or /dev/nvidia0 exists), or HDK_WITH_CUDA=ON asks for it. Built without a GPU it only costs
# time (about 15 times the CPU-only build). HDK_WITH_CUDA=OFF builds CPU-only on a GPU machine.
# Each stage prints what it does and how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/stages.sh

build=${HDK_BUILD_DIR:-build}
if [[ -n ${HDK_WITH_CUDA:-} ]]; then
  cuda=$HDK_WITH_CUDA
  cuda_reason="HDK_WITH_CUDA=$HDK_WITH_CUDA"
elif scripts/gpu-present.sh; then
  cuda=AUTO
  cuda_reason="a GPU is present; the CUDA backend is built when nvcc is found"
else
  cuda=OFF
  cuda_reason="no GPU found (nvidia-smi -L, /dev/nvidia0); HDK_WITH_CUDA=ON builds CUDA anyway"
fi

echo "run-main: CUDA backend $cuda: $cuda_reason"
stage "setup: check the build tools" scripts/setup.sh
stage "configure $build (HDK_WITH_CUDA=$cuda)" \
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHDK_BUILD_TESTS=OFF \
  -DHDK_WITH_CUDA="$cuda"
stage "build hdk-bench" cmake --build "$build" --target hdk-bench
stage "run hdk-bench gdn --preset qwen3.5-397b --verify${*:+ $*}" \
  "$build"/bench/hdk-bench gdn --preset qwen3.5-397b --verify "$@"
stages_summary
