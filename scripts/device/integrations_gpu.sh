#!/usr/bin/env bash
# hdk inside Hugging Face transformers on a GPU machine (docs/integrations.md). Run from the repo
# root with a CUDA build of libhdk (HDK_PREBUILT_LIB, default build-cuda/src/libhdk.so) and
# transformers installed on the machine. Stages:
#   build     the Python package, as scripts/device/python_gpu.sh builds it
#   tests     python/tests/test_integrations_transformers.py (decode on hdk against transformers')
#   deepseek  examples/hf_generate.py --model deepseek_v4 (HDK_EXAMPLE_ARGS, default batch 8,
#             4096-token prompts, 64 decode tokens)
#   qwen      examples/hf_generate.py --model qwen3_next, same sizes
# HDK_SKIP_TESTS=1 / HDK_SKIP_EXAMPLES=1 skip stages. Logs land in $OUT (default /tmp/hdk-out).
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/hdk-out}
mkdir -p "$out"
python=${PYTHON:-python3}
failed=()

OUT=$out HDK_SKIP_TESTS=1 HDK_SKIP_BENCH=1 HDK_SKIP_DSV4=1 bash scripts/device/python_gpu.sh 2>&1 |
  tee "$out/integrations_build.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "the package did not build" >&2; exit 1; }
site=$(grep "package installed into" "$out/integrations_build.log" | tail -1 | awk '{print $4}')
echo "site: $site"

stage_prefix=integrations_
source "$(dirname "$0")/stage.sh"

if [[ -z ${HDK_SKIP_TESTS:-} ]]; then
  stage tests env PYTHONPATH="$site" timeout 400 "$python" -m pytest -q -s -rs -p no:cacheprovider \
    python/tests/test_integrations_transformers.py
fi
if [[ -z ${HDK_SKIP_EXAMPLES:-} ]]; then
  args=${HDK_EXAMPLE_ARGS:---batch 8 --prompt 4096 --new 64}
  stage deepseek env PYTHONPATH="$site" timeout 300 "$python" examples/hf_generate.py \
    --model deepseek_v4 $args --json "$out/hf_generate_deepseek_v4.json"
  stage qwen env PYTHONPATH="$site" timeout 200 "$python" examples/hf_generate.py \
    --model qwen3_next $args --json "$out/hf_generate_qwen3_next.json"
fi
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "failed stages: ${failed[*]}"
  exit 1
fi
echo "all stages passed"
