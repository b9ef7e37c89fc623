#!/usr/bin/env bash
# Session 7, call 13: the threshold selection in the row epilogue under the full dsv4 GPU
# script (tests, memcheck, racecheck, benchmarks with the oracle check), then the router sweep
# against 5bc3d78's hdk-bench (tmp_device/base_v7), interleaved, twice each.
set -uo pipefail
o=$OUT/ab5; mkdir -p $o
OUT=$o/dsv4 bash scripts/device/dsv4_gpu.sh > $o/dsv4_gpu.log 2>&1; echo "dsv4_gpu exit $?"; grep -E "exit|SUMMARY|tests from|passed" $o/dsv4_gpu.log | head -20
for r in 1 2; do
  for v in base new; do
    b=build-cuda/bench/hdk-bench; [[ $v == base ]] && b=tmp_device/base_v7/hdk-bench
    $b router --N 1,2,4,5,8,16,17,24,32,40,64,256 --iterations 200 --json $o/sweep_${v}_$r.json > $o/sweep_${v}_$r.log 2>&1
  done
done
for f in $o/sweep_*_[12].log; do echo "== $f"; grep -E "^ *(flash|pro) +[0-9]" $f | awk '{print $1 $4 "=" $6}' | paste -sd' '; done
grep -E "^ *(flash|pro) " $o/dsv4/bench-router.log | awk '{print $1 $4 "=" $6 "(" $10 ")"}' | paste -sd' '
cd $OUT && tar czf ab5.tgz ab5 && rm -rf ab5
