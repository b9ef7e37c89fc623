#!/usr/bin/env bash
# The DeepSeek-V4 read side with the caller's workspace, and what changed beside it, on a GPU
# machine from prebuilt binaries (built on the CPU machine, carried as .xz files in one folder):
#   checks  every test executable (CUDA cases run here), compute-sanitizer memcheck over the
#           workspace cases of index_topk and sparse_decode and GDN's non-finite cases, racecheck
#           over the workspace cases of sparse_decode
#   bench   hdk-bench attention (sparse_decode and index_topk, N = 1..128) for the new binary and
#           the base one, interleaved, ROUNDS rounds (2); hdk-bench dsv4-step over its grid; hdk-bench gdn
#           for the new binary and the base one (the non-finite check's cost)
# Usage, from the repository root: BIN=.peers/run OUT=/path PARTS=checks,bench \
#   scripts/device/workspace_gpu.sh
# BIN holds hdk-bench, hdk-bench-base and the test executables (or their .xz). Logs and JSON go
# to $OUT. Every step runs even when an earlier one fails; the exit status is non-zero when any
# failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
bin=${BIN:-.peers/run}
out=${OUT:-/tmp/workspace-gpu}
parts=${PARTS:-checks,bench}
mkdir -p "$out"
failed=()
source scripts/device/step.sh
wants() { [[ ,$parts, == *,$1,* ]]; }
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

for packed in "$bin"/*.xz; do
  [[ -e $packed ]] || continue
  xz -d -f -T0 "$packed" && chmod +x "${packed%.xz}"
done
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$out/device.log"

if wants checks; then
  for suite in hdk_core_tests hdk_gdn_tests hdk_dsv4_tests hdk_dsv4_kv_tests hdk_dsv4_index_layout_tests \
    hdk_dsv4_attention_tests; do
    [[ -x $bin/$suite ]] && step "$suite" 300 "$bin/$suite" --gtest_brief=1
  done
  step memcheck-workspace 240 "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$bin/hdk_dsv4_attention_tests" --gtest_brief=1 \
    --gtest_filter='*workspace*:*Workspace*:*through_workspace*'
  step racecheck-workspace 240 "$sanitizer" --tool racecheck --racecheck-report hazard \
    --error-exitcode 3 "$bin/hdk_dsv4_attention_tests" --gtest_brief=1 \
    --gtest_filter='SparseDecodeCuda.Workspace*:*through_workspace*'
  step memcheck-gdn-nonfinite 200 "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$bin/hdk_gdn_tests" --gtest_brief=1 --gtest_filter='*onfinite*:*NonFinite*'
fi

if wants bench; then
  for round in $(seq 1 "${ROUNDS:-2}"); do
    step "attention-base-$round" 200 "$bin/hdk-bench-base" attention --N 1,2,4,8,16,32,64,128 \
      --index-N 1,4,16,64 --entries 16384,65536 --iterations 50 \
      --json "$out/attention_base_$round.json"
    step "attention-new-$round" 200 "$bin/hdk-bench" attention --N 1,2,4,8,16,32,64,128 \
      --index-N 1,4,16,64 --entries 16384,65536 --iterations 50 \
      --json "$out/attention_new_$round.json"
  done
  step dsv4-step 420 "$bin/hdk-bench" dsv4-step --json "$out/dsv4_step.json" ${STEP_ARGS:-}
  for round in $(seq 1 "${ROUNDS:-2}"); do
    step "gdn-base-$round" 200 "$bin/hdk-bench-base" gdn --preset qwen3.5-397b \
      --batch 1,16,64,256 --T 1,2 --json "$out/gdn_base_$round.json"
    step "gdn-new-$round" 200 "$bin/hdk-bench" gdn --preset qwen3.5-397b \
      --batch 1,16,64,256 --T 1,2 --json "$out/gdn_new_$round.json"
  done
fi

if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all steps passed"
