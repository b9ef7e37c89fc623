#!/usr/bin/env bash
# A new build against a base binary on a GPU machine, from prebuilt binaries (built on the CPU
# machine, carried as .xz files in one folder), in one process per step and interleaved rounds:
#   checks     every test executable (CUDA cases run here); compute-sanitizer memcheck over GDN's
#              non-finite cases, the KV cache's CUDA cases and the DeepSeek-V4 workspace cases;
#              racecheck over sparse_decode's workspace cases
#   gdn        hdk-bench gdn, both Qwen presets, fp32 and bf16 state, B = 1, 16, 256, T = 1, 2, 8, base then
#              new, ROUNDS rounds (3); then the kKV layout on qwen3-next
#   kv         hdk-bench kv (store_entries, compressor step), base then new, ROUNDS rounds
#   attention  hdk-bench attention (sparse_decode, index_topk), base then new, ROUNDS rounds
#   topk       hdk-bench topk, base then new, ROUNDS rounds
#   step       hdk-bench dsv4-step over its grid, new binary only ($STEP_ARGS added)
#   step-ab    hdk-bench dsv4-step ($STEP_ARGS added): base, new, and new with --pdl off (plain
#              launches), ROUNDS rounds
#   step-bisect  the new binary's step with programmatic launches, with each of PLAIN_SETS
#              launched plainly (--plain), and with --pdl off, ROUNDS rounds
# Usage, from the repository root: BIN=.peers/run OUT=/path PARTS=checks,gdn \
#   scripts/device/ab_gpu.sh
# SUITES (checks): the test executables to run, all by default.
# BIN holds hdk-bench, hdk-bench-base and the test executables (or their .xz). Logs and JSON go
# to $OUT. Every step runs even when an earlier one fails; the exit status is non-zero when any
# failed.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
bin=${BIN:-.peers/run}
out=${OUT:-/tmp/ab-gpu}
parts=${PARTS:-checks,gdn}
rounds=${ROUNDS:-3}
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
  for suite in ${SUITES:-hdk_core_tests hdk_gdn_tests hdk_dsv4_tests hdk_dsv4_kv_tests \
    hdk_dsv4_index_layout_tests hdk_dsv4_attention_tests}; do
    [[ -x $bin/$suite ]] && step "$suite" 300 "$bin/$suite" --gtest_brief=1
  done
  step memcheck-gdn-nonfinite 240 "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$bin/hdk_gdn_tests" --gtest_brief=1 --gtest_filter='*onfinite*'
  step memcheck-kv 240 "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$bin/hdk_dsv4_kv_tests" --gtest_brief=1 --gtest_filter='*Cuda*:*CUDA*'
  step memcheck-workspace 240 "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$bin/hdk_dsv4_attention_tests" --gtest_brief=1 \
    --gtest_filter='*workspace*:*Workspace*:*through_workspace*'
  step racecheck-workspace 240 "$sanitizer" --tool racecheck --racecheck-report hazard \
    --error-exitcode 3 "$bin/hdk_dsv4_attention_tests" --gtest_brief=1 \
    --gtest_filter='SparseDecodeCuda.Workspace*:*through_workspace*'
  step memcheck-step 240 "$sanitizer" --tool memcheck --error-exitcode 3 \
    "$bin/hdk_dsv4_attention_tests" --gtest_brief=1 --gtest_filter='*DecodeStep*'
  step racecheck-step 240 "$sanitizer" --tool racecheck --racecheck-report hazard \
    --error-exitcode 3 "$bin/hdk_dsv4_attention_tests" --gtest_brief=1 --gtest_filter='*DecodeStep*'
  step racecheck-topk 240 "$sanitizer" --tool racecheck --racecheck-report hazard \
    --error-exitcode 3 "$bin/hdk_dsv4_tests" --gtest_brief=1 --gtest_filter='Topk*'
  step synccheck-topk 240 "$sanitizer" --tool synccheck --error-exitcode 3 \
    "$bin/hdk_dsv4_tests" --gtest_brief=1 --gtest_filter='Topk*'
fi

# ab <part> <timeout> <hdk-bench arguments...>: base then new, $rounds rounds.
ab() {
  local part=$1 limit=$2
  shift 2
  for round in $(seq 1 "$rounds"); do
    step "$part-base-$round" "$limit" "$bin/hdk-bench-base" "$@" --json "$out/${part}_base_$round.json"
    step "$part-new-$round" "$limit" "$bin/hdk-bench" "$@" --json "$out/${part}_new_$round.json"
  done
}
wants gdn && ab gdn 240 gdn --preset qwen3.5-397b,qwen3-next --state fp32,bf16 \
  --batch 1,16,256 --T 1,2,8 --iterations ${GDN_ITERATIONS:-50}
wants gdn && ab gdn-kv-layout 200 gdn --preset qwen3-next --state fp32,bf16 --layout kv \
  --batch 1,16,256 --T 1,4 --iterations ${GDN_ITERATIONS:-50}
wants kv && ab kv 120 kv --ops store,compress --iterations 100
wants attention && ab attention 200 attention --N 1,2,4,8,16,32,64,128 --index-N 1,4,16,64 \
  --entries 16384,65536 --iterations 50
wants topk && ab topk 120 topk --iterations 100
if wants step-ab; then
  for round in $(seq 1 "$rounds"); do
    step "step-base-$round" 300 "$bin/hdk-bench-base" dsv4-step --json "$out/step_base_$round.json" \
      ${STEP_ARGS:-}
    step "step-new-$round" 300 "$bin/hdk-bench" dsv4-step --json "$out/step_new_$round.json" \
      ${STEP_ARGS:-}
    step "step-plain-$round" 300 "$bin/hdk-bench" dsv4-step --pdl off \
      --json "$out/step_plain_$round.json" ${STEP_ARGS:-}
  done
fi
# step-bisect: the new binary's step ($STEP_ARGS added) with programmatic launches, then with
# each of PLAIN_SETS ('|'-separated lists for --plain) launched plainly, then --pdl off, ROUNDS
# rounds: which kernel boundary a dependent launch helps or hurts.
if wants step-bisect; then
  IFS='|' read -r -a plain_sets <<<"${PLAIN_SETS:-index_topk|sparse_decode|compress csa,compress index}"
  for round in $(seq 1 "$rounds"); do
    step "bisect-pdl-$round" 300 "$bin/hdk-bench" dsv4-step \
      --json "$out/bisect_pdl_$round.json" ${STEP_ARGS:-}
    for index in "${!plain_sets[@]}"; do
      step "bisect-plain$index-$round" 300 "$bin/hdk-bench" dsv4-step --plain "${plain_sets[$index]}" \
        --json "$out/bisect_plain${index}_$round.json" ${STEP_ARGS:-}
    done
    step "bisect-off-$round" 300 "$bin/hdk-bench" dsv4-step --pdl off \
      --json "$out/bisect_off_$round.json" ${STEP_ARGS:-}
  done
fi
wants step && step dsv4-step 420 "$bin/hdk-bench" dsv4-step --json "$out/dsv4_step.json" \
  ${STEP_ARGS:-}

if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all steps passed"
