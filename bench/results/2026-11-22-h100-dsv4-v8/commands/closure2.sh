#!/usr/bin/env bash
# Session 8, call 2 (closure): the Python package built and tested on the device
# (scripts/device/python_gpu.sh, which also runs bench/dsv4_vs_torch.py once), then
# bench/dsv4_vs_torch.py twice more for the spread of the ratio to the PyTorch chain.
set -uo pipefail
o=$OUT/closure; mkdir -p $o
HDK_BENCH_ARGS="--batch 1 --T 1" OUT=$o/python timeout 420 bash scripts/device/python_gpu.sh > $o/python_gpu.log 2>&1; echo "python exit $?"
tail -1 $o/python/python_tests.log; grep -E "graph replay|router|topk N= 64 L= 65536" $o/python/python_dsv4_vs_torch.log
site=$(ls -d /tmp/tmp.*/site 2>/dev/null | tail -1); echo "site $site"
for r in 2 3; do
  PYTHONPATH=$site timeout 120 python3 bench/dsv4_vs_torch.py --json $o/dsv4_vs_torch_$r.json > $o/dsv4_vs_torch_$r.log 2>&1
  grep -E "graph replay|router pro   N=  64|router flash N=  64" $o/dsv4_vs_torch_$r.log
done
rm -f $o/python/python_bench.json
cd $OUT && tar czf closure2.tgz closure && rm -rf closure
