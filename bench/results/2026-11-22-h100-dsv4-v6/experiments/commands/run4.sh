#!/usr/bin/env bash
# Session 6, call 4: the row epilogue's share (HDK_EPILOGUE_EXPERIMENT 1: exit after the wait,
# 2: exit after loading and adding the slabs, 0: whole) and the GEMV/split path with the logits
# path for comparison.
set -uo pipefail
b=build-cuda/bench/hdk-bench
for run in 1 2; do
for x in 0 1 2; do
  echo "x$x $(HDK_EPILOGUE_EXPERIMENT=$x timeout 60 $b router --N 1,4,17,64 | grep -E '^ *(flash|pro) ' | awk '{print $1 $4 "=" $6}' | paste -sd' ')"
  echo "x$x logits $(HDK_EPILOGUE_EXPERIMENT=$x timeout 60 $b router --path logits --N 1,64 | grep -E '^ *(flash|pro) ' | awk '{print $1 $4 "=" $6}' | paste -sd' ')"
done
done
