#!/usr/bin/env bash
# Session 6, call 3: the split GEMM's programmatic trigger at the end of each CTA (16: after a
# CTA barrier, 32: per thread after its stores) against none (0).
set -uo pipefail
o=$OUT/r3; mkdir -p $o
b=build-cuda/bench/hdk-bench
for run in 1 2 3; do
for x in 0 16 32; do
  HDK_SPLIT_EXPERIMENT=$x timeout 60 $b router --N 17,24,32,40,64,256 > $o/bench_x${x}_$run.log 2>&1
done
done
cd $OUT && tar czf r3.tgz r3
for f in r3/bench_x*; do echo "$f $(grep -E '^ *(flash|pro) ' $f | awk '{print $1 $4 "=" $6}' | paste -sd' ')"; done | sort
rm -rf r3
