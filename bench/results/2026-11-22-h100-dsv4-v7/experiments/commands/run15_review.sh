#!/usr/bin/env bash
# Session 7, call 15 (review): the workspace constants shared between route_workspace_slabs and
# the split GEMM (no kernel logic changed), under the full dsv4 GPU script; the Python package
# tests and bench/dsv4_vs_torch.py (its print lines reflowed).
set -uo pipefail
o=$OUT/review; mkdir -p $o
OUT=$o/dsv4 bash scripts/device/dsv4_gpu.sh > $o/dsv4_gpu.log 2>&1; echo "dsv4_gpu exit $?"; grep -E "exit|SUMMARY|tests from|passed" $o/dsv4_gpu.log | head -20
grep -E "^ *(flash|pro) " $o/dsv4/bench-router.log | awk '{print $1 $4 "=" $6 "(" $8 "%," $10 ")"}' | paste -sd' '
HDK_BENCH_ARGS="--batch 1 --T 1" OUT=$o/python timeout 400 bash scripts/device/python_gpu.sh > $o/python_gpu.log 2>&1; echo "python exit $?"
tail -1 $o/python/python_tests.log; grep -E "graph replay|router|topk N= 64 L= 65536" $o/python/python_dsv4_vs_torch.log
rm -f $o/python/python_bench.json
cd $OUT && tar czf review.tgz review && rm -rf review
