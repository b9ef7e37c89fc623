#!/usr/bin/env bash
# Run on a GPU machine from the repo root, with a CUDA build of hdk in $HDK_BUILD_DIR
# (default build-cuda). Stages (any order, default: tests sanitize bench):
#   tests     the C++ suites (GDN cases run on the CPU and the GPU)
#   sanitize  compute-sanitizer memcheck over the CUDA cases, racecheck over a subset
#   bench     hdk-bench gdn, full grid, cold L2 (JSON + log)
#   quick     hdk-bench gdn, T=1 only
#   hot       hdk-bench gdn, T=1, hot L2
#   sweep     hdk-bench gdn, T=1, VK rows per thread (2, 4) x warps per CTA (2, 4, 8); needs a build
#             configured with -DHDK_GDN_SWEEP_KERNELS=ON (the non-default shapes)
#   profile   Nsight Compute sections of the VK kernel (bf16 and fp32 state, B=64, T=1)
# Logs and JSON land in $OUT (default /tmp/hdk-out). Exits non-zero if any stage failed.
set -uo pipefail
build=${HDK_BUILD_DIR:-build-cuda}
out=${OUT:-/tmp/hdk-out}
mkdir -p "$out"
export LD_LIBRARY_PATH="/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(tests sanitize bench)
failed=()

run() {  # run <name> <command...>: logs to $out/<name>.log, prints the tail, records failure
  local name=$1
  shift
  echo "=== $name: $*"
  local start=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local status=$?
  tail -n "${TAIL:-25}" "$out/$name.log"
  echo "=== $name: exit $status after $((SECONDS - start)) s"
  [[ $status -eq 0 ]] || failed+=("$name")
}

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem \
  --format=csv | tee "$out/gpu.txt"

cuda_cases='Grid/*cuda*:GdnDecodeRepeated.*:GdnDecodeEmpty.*:GdnDecodeCuda.*'
for stage in "${stages[@]}"; do
  case $stage in
    tests)
      run core_tests "$build/tests/hdk_core_tests" --gtest_brief=1
      run gdn_tests "$build/tests/hdk_gdn_tests" --gtest_brief=1
      ;;
    sanitize)
      run memcheck compute-sanitizer --tool memcheck --error-exitcode 1 \
        "$build/tests/hdk_gdn_tests" --gtest_brief=1 \
        "--gtest_filter=$cuda_cases:-GdnDecodeCuda.IntermediateCacheBeyond2To31Elements"
      run racecheck compute-sanitizer --tool racecheck --error-exitcode 1 \
        "$build/tests/hdk_gdn_tests" --gtest_brief=1 \
        '--gtest_filter=Grid/*cuda_case2*:Grid/*cuda_case3*:GdnDecodeCuda.GraphCaptureAndReplay'
      ;;
    bench)
      run bench_gdn "$build/bench/hdk-bench" gdn --verify --verify-max-batch 16 \
        --json "$out/gdn_bench.json"
      ;;
    quick)
      TAIL=30 run bench_quick "$build/bench/hdk-bench" gdn --T 1 --json "$out/gdn_quick.json"
      ;;
    hot)
      TAIL=30 run bench_hot "$build/bench/hdk-bench" gdn --T 1 --hot --json "$out/gdn_hot.json"
      ;;
    sweep)
      for rows in ${SWEEP_ROWS:-2 4}; do
        for warps in ${SWEEP_WARPS:-2 4 8}; do
          TAIL=24 run "sweep_r${rows}_w$warps" "$build/bench/hdk-bench" gdn --T 1 --warps "$warps" \
            --rows-per-thread "$rows" --batch ${SWEEP_BATCH:-1,4,16,64,256} --iterations 30
        done
      done
      ;;
    profile)
      for state in bf16 fp32; do
        TAIL=120 run "ncu_$state" ncu --clock-control none -k regex:gdn_decode --launch-count 1 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy \
          --section WarpStateStats --section LaunchStats --section SchedulerStats \
          "$build/bench/hdk-bench" gdn --batch 64 --T 1 --state "$state" --verify \
          --verify-max-batch 64 --iterations 2
      done
      ;;
    *) echo "unknown stage $stage"; failed+=("$stage") ;;
  esac
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "FAILED stages: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
