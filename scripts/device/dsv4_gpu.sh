#!/usr/bin/env bash
# The DeepSeek-V4 router and hdk::topk on a GPU machine, in one go (about 6 minutes on an
# H100/H200): the test suite, compute-sanitizer memcheck and racecheck, and both benchmarks with
# the float64 / full-sort check. Run from the repository root with a CUDA build in build-cuda/
# (cmake -S . -B build-cuda -G Ninja -DHDK_WITH_CUDA=ON && cmake --build build-cuda). Logs and
# JSON go to $OUT (default: ./dsv4-gpu-out). Every step runs even when an earlier one fails;
# the exit status is non-zero when any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-dsv4-gpu-out}
build=${HDK_BUILD_DIR:-build-cuda}
mkdir -p "$out"
tests="$build/tests/hdk_dsv4_tests"
bench="$build/bench/hdk-bench"
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
failed=()

source scripts/device/step.sh  # after the cd to the repository root

require_binaries "build first (cmake --build $build)" "$tests" "$bench"
record_environment

# 1. Every test, CPU and CUDA cases (the CUDA ones must run here, not skip).
step tests 240 "$tests"
if grep -q "SKIPPED" "$out/tests.log" && grep -q "cuda backend skipped" "$out/tests.log"; then
  failed+=("tests (CUDA cases skipped: no usable GPU?)")
fi

# 2. memcheck over every CUDA case (the CPU cases add nothing under the sanitizer).
cuda_cases='*cuda*:RouterHashOutOfTable.CudaCountsRows:RouterEdges.*:RouterRepeated.*'
cuda_cases+=':TopkEdges.*:TopkRepeated.*:TopkCluster.*'
step memcheck 200 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 3 \
  "$tests" --gtest_brief=1 --gtest_filter="$cuda_cases"

# 3. racecheck (shared and distributed shared memory) on small cases of each kernel.
step racecheck 120 "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 3 \
  "$tests" --gtest_brief=1 \
  --gtest_filter='RouterRepeated.*:RouterEdges.*:TopkCluster.*:TopkRepeated.*'

# 4. The benchmarks: issue grid, CUDA-graph replay with a flushed L2, checked against the oracle.
step bench-router 150 "$bench" router --verify --json "$out/router.json"
step bench-router-paths 60 "$bench" router --verify --path logits,hash --N 1,16,64 \
  --json "$out/router_paths.json"
step bench-topk 120 "$bench" topk --verify --json "$out/topk.json"
step bench-topk-lengths 60 "$bench" topk --verify --lengths --shapes 64x65536:512,16x65536:1024 \
  --json "$out/topk_lengths.json"

finish_steps "dsv4 GPU run"
