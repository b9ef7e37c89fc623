#!/usr/bin/env bash
# Session 6, call 2: where the split GEMM's time goes (env HDK_SPLIT_EXPERIMENT bits:
# 1 no hidden copies, 2 no gate_weight loads, 4 no partial stores, 8 trigger at start).
set -uo pipefail
o=$OUT/r2; mkdir -p $o
b=build-cuda/bench/hdk-bench
t=build-cuda/tests/hdk_dsv4_tests
timeout 200 $t --gtest_brief=1 > $o/tests.log 2>&1; echo "tests exit $?" | tee -a $o/summary.log
tail -3 $o/tests.log >> $o/summary.log
for run in 1 2; do
for x in 0 1 2 3 4 7 8; do
  HDK_SPLIT_EXPERIMENT=$x timeout 60 $b router --N 17,32,64 > $o/bench_x${x}_$run.log 2>&1
done
done
for x in 0 1 2 3 4; do
  for preset in pro flash; do
  HDK_SPLIT_EXPERIMENT=$x timeout 60 ncu --clock-control none --cache-control all --metrics gpu__time_duration.sum,sm__cycles_active.avg,gpc__cycles_elapsed.max -k regex:"gate_|epilogue" -c 4 $b router --preset $preset --N 64 --iterations 1 > $o/ncu_${preset}_x$x.log 2>&1
  done
done
cd $OUT && tar czf r2.tgz r2 && rm -rf r2
