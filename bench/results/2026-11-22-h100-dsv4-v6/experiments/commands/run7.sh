#!/usr/bin/env bash
# Session 6, call 7: the split GEMM reading hidden without masking (zeros past D in shared
# memory) against the committed code (tmp_device/hdk-bench-old); tests and racecheck first.
set -uo pipefail
o=$OUT/r7; mkdir -p $o
t=build-cuda/tests/hdk_dsv4_tests
timeout 200 $t --gtest_brief=1 > $o/tests.log 2>&1; echo "tests exit $?"; tail -2 $o/tests.log
timeout 150 compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 3 $t --gtest_brief=1 --gtest_filter='RouterRepeated.*:RouterEdges.*:Grid/RouterSemantics.MatchesReference/cuda_case1[5-9]*' > $o/racecheck.log 2>&1; echo "racecheck exit $?"; tail -2 $o/racecheck.log
for run in 1 2 3; do
  for which in old new; do
    bin=build-cuda/bench/hdk-bench; [[ $which == old ]] && bin=tmp_device/hdk-bench-old
    echo "$which $run $($bin router --N 17,24,32,40,64,256 | grep -E '^ *(flash|pro) ' | awk '{print $1 $4 "=" $6}' | paste -sd' ')"
  done
done 2>/dev/null | sort
