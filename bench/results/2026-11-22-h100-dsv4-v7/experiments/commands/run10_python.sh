#!/usr/bin/env bash
# Session 7, call 10: the Python package on the GPU (extension built here; pytest incl. CUDA
# graphs; the DeepSeek-V4 router and top-k against the PyTorch chain in one process).
set -uo pipefail
o=$OUT/final; mkdir -p $o
HDK_BENCH_ARGS="--batch 1 --T 1" OUT=$o/python timeout 560 bash scripts/device/python_gpu.sh > $o/python_gpu.log 2>&1; echo "python exit $?"
tail -3 $o/python/python_tests.log; grep -E "graph replay|router|topk N= 64 L= 65536" $o/python/python_dsv4_vs_torch.log
rm -f $o/python/python_bench.json
cd $OUT && tar czf final.tgz final && rm -rf final
