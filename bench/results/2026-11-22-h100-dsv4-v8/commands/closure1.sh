#!/usr/bin/env bash
# Session 8, call 1 (closure): the committed code (70b8978) under the full dsv4 GPU script, and the
# GDN test binary (CPU + CUDA cases) as a whole-library check.
set -uo pipefail
o=$OUT/closure; mkdir -p $o
OUT=$o/dsv4 bash scripts/device/dsv4_gpu.sh > $o/dsv4_gpu.log 2>&1; echo "dsv4_gpu exit $?"
grep -E "exit|passed|FAILED" $o/dsv4_gpu.log | head -20
grep -E "^ *(flash|pro) " $o/dsv4/bench-router.log | awk '{print $1 $4 "=" $6 "(" $8 "%," $10 ")"}' | paste -sd' '
timeout 200 build-cuda/tests/hdk_gdn_tests --gtest_brief=1 > $o/gdn_tests.log 2>&1; echo "gdn tests exit $?"; tail -3 $o/gdn_tests.log
cd $OUT && tar czf closure1.tgz closure && rm -rf closure
