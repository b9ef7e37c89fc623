#!/usr/bin/env bash
# A/B 2: hidden rows by cp.async (16 B per lane) instead of one bulk copy per row (split GEMM).
set -uo pipefail
o=$OUT/ab2; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $o/environment.log
timeout 300 build-cuda/tests/hdk_dsv4_tests --gtest_brief=1 > $o/tests.log 2>&1; echo "tests exit $?" | tee -a $o/tests.log; tail -3 $o/tests.log
for shape in "384 7168 64" "256 4096 64" "384 7168 32" "384 7168 17"; do
  for v in baseline candidate; do echo "== $v $shape" >> $o/timeline.log; ./tmp_device/timeline_$v $shape 1 >> $o/timeline.log 2>&1; done
done
grep -E "^==|graph replay|arrived|MMAs done|all warps|stores issued|epi: CTA start" $o/timeline.log | grep -v "^E=" | head -60
for r in 1 2; do
  for v in base cand; do
    b=build-cuda/bench/hdk-bench; [[ $v == base ]] && b=tmp_device/base/hdk-bench
    $b router --N 1,4,16,17,24,32,40,64,256 --iterations 200 --json $o/bench_${v}_$r.json > $o/bench_${v}_$r.log 2>&1
  done
done
for f in $o/bench_*_[12].log; do echo "== $f"; grep -E "^ *(flash|pro) +[0-9]" $f | awk '{print $1, $4, $6}' | paste -sd' ' ; done
cd $o && tar -czf ../ab2.tgz . && cd .. && rm -rf ab2
