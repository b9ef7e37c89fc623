#!/usr/bin/env bash
# Session 6, call 1: tests, racecheck, A/B of the fused (cooperative) router, python chain ratio.
set -uo pipefail
o=$OUT/r; mkdir -p $o
b=build-cuda/bench/hdk-bench
t=build-cuda/tests/hdk_dsv4_tests
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $o/env.log 2>&1
timeout 240 $t --gtest_brief=1 > $o/tests.log 2>&1; echo "tests exit $?" | tee -a $o/summary.log
tail -3 $o/tests.log >> $o/summary.log
timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 3 $t --gtest_brief=1 --gtest_filter='RouterRepeated.*:RouterEdges.*' > $o/racecheck.log 2>&1; echo "racecheck exit $?" | tee -a $o/summary.log
tail -3 $o/racecheck.log >> $o/summary.log
N=1,4,5,8,16,17,32,64,256
for run in 1 2; do
  timeout 100 $b router --verify --N $N > $o/bench_fused_$run.log 2>&1; echo "fused $run exit $?" >> $o/summary.log
  HDK_ROUTER_UNFUSED=1 timeout 100 $b router --N $N > $o/bench_unfused_$run.log 2>&1; echo "unfused $run exit $?" >> $o/summary.log
  HDK_ROUTER_GATE=cluster timeout 60 $b router --N 5,8,12,16 > $o/bench_cluster_$run.log 2>&1
  HDK_ROUTER_GATE=cluster HDK_ROUTER_UNFUSED=1 timeout 60 $b router --N 5,8,12,16 > $o/bench_cluster_unfused_$run.log 2>&1
done
HDK_SKIP_DSV4= OUT=$o/py HDK_BENCH_ARGS="--batch 1 --T 1" timeout 420 bash scripts/device/python_gpu.sh > $o/python.log 2>&1; echo "python exit $?" >> $o/summary.log
cd $OUT && tar czf r.tgz r && rm -rf r
