#!/usr/bin/env bash
# Session 6, call 8: the commit's state (CUDA sources as in 6a253e7, new test cases): the dsv4
# tests on the GPU, and the Python package (tests incl. CUDA graphs at 4 and 40 rows, the chain
# comparison).
set -uo pipefail
o=$OUT/final; mkdir -p $o
timeout 200 build-cuda/tests/hdk_dsv4_tests --gtest_brief=1 > $o/tests.log 2>&1; echo "tests exit $?"; tail -2 $o/tests.log
HDK_BENCH_ARGS="--batch 1 --T 1" OUT=$o/python timeout 500 bash scripts/device/python_gpu.sh > $o/python_gpu.log 2>&1; echo "python exit $?"
tail -3 $o/python/python_tests.log; grep -E "router|topk N= 64 L= 65536" $o/python/python_dsv4_vs_torch.log
rm -f $o/python/python_bench.json
cd $OUT && tar czf final.tgz final && rm -rf final
