#!/usr/bin/env bash
# Session 6, call 6: the committed code (rank-based merge in the row epilogue): the dsv4 GPU
# script (tests, memcheck, racecheck, benchmarks), the router sweep, and an A/B against the
# previous merge (tmp_device/hdk-bench-old, built from 6a253e7's router_cuda.cu).
set -uo pipefail
o=$OUT/v6; mkdir -p $o
OUT=$o/dsv4 bash scripts/device/dsv4_gpu.sh > $o/dsv4_gpu.log 2>&1; echo "dsv4_gpu exit $?" >> $o/summary.log
b=build-cuda/bench/hdk-bench
$b router --N 1,2,4,5,8,16,17,24,32,40,64 --json $o/dsv4/router_sweep.json > $o/dsv4/bench-router-sweep.log 2>&1
$b router --hot --N 1,4,16,17,64 --json $o/dsv4/router_hot.json > $o/dsv4/bench-router-hot.log 2>&1
for run in 1 2 3; do
  for which in old new; do
    bin=$b; [[ $which == old ]] && bin=tmp_device/hdk-bench-old
    echo "$which $run fused  $($bin router --N 1,4,16,17,64,256 | grep -E '^ *(flash|pro) ' | awk '{print $1 $4 "=" $6}' | paste -sd' ')" >> $o/ab_merge.log
    echo "$which $run logits $($bin router --path logits,hash --N 1,64 | grep -E '^ *(flash|pro) ' | awk '{print $1 $4 $5 "=" $6}' | paste -sd' ')" >> $o/ab_merge.log
  done
done
cat $o/summary.log; tail -3 $o/dsv4_gpu.log; sort $o/ab_merge.log
cd $OUT && tar czf v6.tgz v6
