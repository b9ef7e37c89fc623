#!/usr/bin/env bash
# Session 6, call 9: the commit's state under the full dsv4 GPU script (tests, memcheck,
# racecheck, benchmarks with the oracle check) and the router sweep.
set -uo pipefail
o=$OUT/check; mkdir -p $o
OUT=$o/dsv4 bash scripts/device/dsv4_gpu.sh > $o/dsv4_gpu.log 2>&1; echo "dsv4_gpu exit $?"; tail -2 $o/dsv4_gpu.log
build-cuda/bench/hdk-bench router --N 1,2,4,5,8,16,17,24,32,40,64 --json $o/dsv4/router_sweep.json > $o/dsv4/bench-router-sweep.log 2>&1
grep -E "^ *(flash|pro) " $o/dsv4/bench-router-sweep.log | awk '{print $1 $4 "=" $6 "(" $10 ")"}' | paste -sd' '
grep -E "^ *(flash|pro) " $o/dsv4/bench-router.log | awk '{print $1 $4 "=" $6}' | paste -sd' '
rm -f $o/dsv4/*.json.tmp
cd $OUT && tar czf check.tgz check && rm -rf check
