#!/usr/bin/env bash
# scripts/run-main.sh with cmake and hdk-bench replaced by stubs that record their arguments, and
# an nvcc on PATH: the CUDA backend is configured only where a GPU is present or HDK_WITH_CUDA
# asks for it (nvcc alone is no reason), and every stage reports its time.
set -uo pipefail
source "$(dirname "$0")/checks.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)

mkdir -p "$work/bin" "$work/build/bench"
printf '#!/bin/sh\necho "$*" >> "%s/cmake.log"\n' "$work" >"$work/bin/cmake"
printf '#!/bin/sh\necho "nvcc stub"\n' >"$work/bin/nvcc"
printf '#!/bin/sh\necho "$*" > "%s/bench.log"\n' "$work" >"$work/build/bench/hdk-bench"
chmod +x "$work/bin/cmake" "$work/bin/nvcc" "$work/build/bench/hdk-bench"

run_main() {  # run_main <env assignments...>: output in $work/out
  rm -f "$work/cmake.log" "$work/bench.log"
  env "$@" PATH="$work/bin:$PATH" HDK_BUILD_DIR="$work/build" \
    bash "$repo/scripts/run-main.sh" >"$work/out" 2>&1 || fail "run-main.sh failed: $(cat "$work/out")"
}

if "$repo/scripts/gpu-present.sh"; then expected=AUTO; else expected=OFF; fi
run_main -u HDK_WITH_CUDA
grep -q -- "-DHDK_WITH_CUDA=$expected" "$work/cmake.log" 2>/dev/null ||
  fail "with nvcc and GPU present = $([[ $expected == AUTO ]] && echo yes || echo no), cmake got:" \
    "$(cat "$work/cmake.log" 2>/dev/null)"
for stage in "setup" "configure" "build hdk-bench" "run hdk-bench gdn"; do
  grep -q "^==> done in [0-9.]* s: $stage" "$work/out" || fail "no time for the stage '$stage'"
done
grep -q "total$" "$work/out" || fail "no total time: $(cat "$work/out")"
grep -qx "gdn --preset qwen3.5-397b --verify" "$work/bench.log" 2>/dev/null ||
  fail "hdk-bench got: $(cat "$work/bench.log" 2>/dev/null)"

run_main HDK_WITH_CUDA=ON
grep -q -- "-DHDK_WITH_CUDA=ON" "$work/cmake.log" 2>/dev/null ||
  fail "HDK_WITH_CUDA=ON did not reach cmake: $(cat "$work/cmake.log" 2>/dev/null)"

finish "run-main.sh"
