#!/usr/bin/env bash
# Session 8, call 4 (review): the epilogue's LogitSource with a writable workspace pointer (no
# const_cast) and kWorkspaceMaxSlabs used directly; the full dsv4 GPU script, then hdk-bench router
# of the parent commit (build-base/hdk-bench, 1bdb870) and of this change, interleaved, twice each.
set -uo pipefail
o=$OUT/review; mkdir -p $o
OUT=$o/dsv4 bash scripts/device/dsv4_gpu.sh > $o/dsv4_gpu.log 2>&1; echo "dsv4_gpu exit $?"
grep -E "exit|passed|FAILED" $o/dsv4_gpu.log | head -20
for r in 1 2; do
  for side in base new; do
    bin=build-cuda/bench/hdk-bench; [[ $side == base ]] && bin=build-base/hdk-bench
    $bin router --verify --N 1,4,16,17,40,64,256 --iterations 200 > $o/ab_${side}_$r.log 2>&1
    echo "$side $r: $(grep -E '^ *(flash|pro) ' $o/ab_${side}_$r.log | awk '{print $1 $4 "=" $6 ($13=="ok"?"":"!" $13)}' | paste -sd' ')"
  done
done
cd $OUT && tar czf review.tgz review && rm -rf review
