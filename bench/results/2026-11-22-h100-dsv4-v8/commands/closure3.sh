#!/usr/bin/env bash
# Session 8, call 3: the Python launch floor taken as the smallest of three medians (timing.py
# launch_floor_us), re-measured at the end of bench/dsv4_vs_torch.py; the package tests; the spread
# of single medians within a process (floor_diag.py) and of the script over three runs.
set -uo pipefail
o=$OUT/floor; mkdir -p $o
HDK_BENCH_ARGS="--batch 1 --T 1" HDK_SKIP_DSV4=1 OUT=$o/python timeout 400 bash scripts/device/python_gpu.sh > $o/python_gpu.log 2>&1; echo "python exit $?"
tail -1 $o/python/python_tests.log
site=$(ls -d /tmp/tmp.*/site 2>/dev/null | tail -1)
for r in 1 2 3; do PYTHONPATH=$site timeout 60 python3 tmp_device/floor_diag.py 2>&1 | tee -a $o/floor_diag.log; done
for r in 1 2 3; do
  PYTHONPATH=$site timeout 120 python3 bench/dsv4_vs_torch.py --json $o/dsv4_vs_torch_$r.json > $o/dsv4_vs_torch_$r.log 2>&1; echo "run $r exit $?"
  grep -E "graph replay|router pro   N=  (1|64)|router flash N=  (1|64)" $o/dsv4_vs_torch_$r.log
done
rm -f $o/python/python_bench.json
cd $OUT && tar czf floor.tgz floor && rm -rf floor
