#!/usr/bin/env bash
# Session 6, call 5: the row epilogue's top-k share (HDK_EPILOGUE_EXPERIMENT 3: no merge of the
# warps' lists, 4: neither lists nor merge; 0: whole; 2: exit after the logits).
set -uo pipefail
b=build-cuda/bench/hdk-bench
for run in 1 2; do
for x in 0 2 3 4; do
  echo "x$x $(HDK_EPILOGUE_EXPERIMENT=$x timeout 60 $b router --N 1,17,64 | grep -E '^ *(flash|pro) ' | awk '{print $1 $4 "=" $6}' | paste -sd' ')"
  echo "x$x logits $(HDK_EPILOGUE_EXPERIMENT=$x timeout 60 $b router --path logits --N 1,64 | grep -E '^ *(flash|pro) ' | awk '{print $1 $4 "=" $6}' | paste -sd' ')"
  echo "x$x hot $(HDK_EPILOGUE_EXPERIMENT=$x timeout 60 $b router --hot --path logits --N 1,64 | grep -E '^ *(flash|pro) ' | awk '{print $1 $4 "=" $6}' | paste -sd' ')"
done
done
