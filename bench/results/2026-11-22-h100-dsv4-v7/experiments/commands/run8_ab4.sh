#!/usr/bin/env bash
# Session 7, call 8: the candidate (row epilogue: scores added after the merge loop; split GEMM:
# 16-byte partial-sum stores, cp.async rows of hidden with 48 experts per CTA) under the full dsv4
# GPU script, the per-CTA timeline against 4826a06, and the router sweep against 4826a06's
# hdk-bench (tmp_device/base), interleaved, twice each.
set -uo pipefail
o=$OUT/ab4; mkdir -p $o
OUT=$o/dsv4 bash scripts/device/dsv4_gpu.sh > $o/dsv4_gpu.log 2>&1; echo "dsv4_gpu exit $?"; tail -2 $o/dsv4_gpu.log
for shape in "384 7168 64" "256 4096 64" "384 7168 32" "256 4096 17"; do
  for v in baseline candidate; do echo "== $v $shape" >> $o/timeline.log; ./tmp_device/timeline_$v $shape 1 >> $o/timeline.log 2>&1; done
done
grep -E "^==|graph replay|arrived|MMAs done|all warps|stores issued|epi:" $o/timeline.log | grep -v "^E=" | head -100
for r in 1 2; do
  for v in base new; do
    b=build-cuda/bench/hdk-bench; [[ $v == base ]] && b=tmp_device/base/hdk-bench
    $b router --N 1,2,4,5,8,16,17,24,32,40,64,256 --iterations 200 --json $o/sweep_${v}_$r.json > $o/sweep_${v}_$r.log 2>&1
  done
done
for f in $o/sweep_*_[12].log; do echo "== $f"; grep -E "^ *(flash|pro) +[0-9]" $f | awk '{print $1 $4 "=" $6}' | paste -sd' '; done
cd $OUT && tar czf ab4.tgz ab4 && rm -rf ab4
