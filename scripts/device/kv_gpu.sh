#!/usr/bin/env bash
# The DeepSeek-V4 KV cache (issue 16) on a GPU machine, in one go: the kv test suite (CPU and
# CUDA cases), compute-sanitizer memcheck and racecheck over its CUDA cases, and `hdk-bench kv`
# with the bit-exact check. Run from the repository root with a CUDA build in build-cuda/
# (cmake -S . -B build-cuda -G Ninja -DHDK_WITH_CUDA=ON && cmake --build build-cuda), or point
# HDK_BUILD_DIR at a carried build. Logs and JSON go to $OUT (default: ./kv-gpu-out). Every step
# runs even when an earlier one fails; the exit status is non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-kv-gpu-out}
build=${HDK_BUILD_DIR:-build-cuda}
mkdir -p "$out"
tests="$build/tests/hdk_dsv4_kv_tests"
bench="$build/bench/hdk-bench"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
failed=()

source scripts/device/step.sh  # after the cd to the repository root

require_binaries "build first (cmake --build $build)" "$tests" "$bench"
record_environment

# 1. Every kv test (the CUDA cases must run here, not skip).
step tests 300 "$tests"
if grep -q "cuda backend skipped" "$out/tests.log"; then
  failed+=("tests (CUDA cases skipped: no usable GPU?)")
fi

# 2. memcheck over every CUDA case (store/gather/keys grid, compressor sequences, counted
#    out-of-range slots, check_indices, the CUDA-graph replay).
cuda_cases='*cuda*:KvErrorBound.*:KvSlotsOutOfRange.CudaCountsAndSkips:KvCudaGraph.*'
step memcheck 600 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 3 \
  "$tests" --gtest_brief=1 --gtest_filter="$cuda_cases"

# 3. racecheck (the compressor's shared memory between its channel threads and the writer warp).
step racecheck 600 "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 3 \
  "$tests" --gtest_brief=1 --gtest_filter='Sequences/Compressor.*cuda*:KvCudaGraph.*'

# 4. The benchmark: N = 1..512, L = 128..2048, Flash and Pro compressor steps, checked.
step bench-kv 600 "$bench" kv --verify --json "$out/kv.json"
step bench-kv-hot 300 "$bench" kv --hot --ops store,gather --json "$out/kv_hot.json"

finish_steps "kv GPU run"
