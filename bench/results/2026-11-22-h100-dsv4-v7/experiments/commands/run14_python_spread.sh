#!/usr/bin/env bash
# Session 7, call 14: the spread of the Python comparison on the committed code (3477bc0): the
# package built and tested as in call 10, then bench/dsv4_vs_torch.py three times in a row.
set -uo pipefail
o=$OUT/spread; mkdir -p $o
HDK_BENCH_ARGS="--batch 1 --T 1" HDK_SKIP_DSV4=1 OUT=$o/python timeout 400 bash scripts/device/python_gpu.sh > $o/python_gpu.log 2>&1; echo "python exit $?"
tail -1 $o/python/python_tests.log
site=$(ls -d /tmp/tmp.*/site 2>/dev/null | tail -1); echo "site $site"
for r in 1 2 3; do
  PYTHONPATH=$site timeout 200 python3 bench/dsv4_vs_torch.py --json $o/dsv4_vs_torch_$r.json > $o/dsv4_vs_torch_$r.log 2>&1
  grep -E "graph replay|router pro   N=  64|router flash N=  64" $o/dsv4_vs_torch_$r.log
done
rm -f $o/python/python_bench.json
cd $OUT && tar czf spread.tgz spread && rm -rf spread
