#!/usr/bin/env bash
# The DeepSeek-V4 read side (issue 17: index_topk and sparse_decode) on a GPU machine, in one
# 10-minute device call: build (unless HDK_SKIP_BUILD=1 and the binaries exist), the attention
# test suite (CPU and CUDA cases), compute-sanitizer memcheck and racecheck over its CUDA cases,
# `hdk-bench attention --verify` (the issue grid, checked against the float64 reference up to the
# verify budget), then the Python package (prebuilt mode), its read-side tests and
# bench/dsv4_vs_torch.py --ops attention,indexer (hdk against the PyTorch chains and torch.topk).
# Run from the repository root: OUT=/path scripts/device/attention_gpu.sh. Logs and JSON go to
# $OUT/attention-gpu/ and are packed into $OUT/attention-gpu.tar.gz. Every step runs even when an
# earlier one fails; the exit status is non-zero when any failed.
#
# Knobs: HDK_BUILD_DIR (default build-cuda), HDK_SKIP_BUILD=1, HDK_SKIP_PYTHON=1 (the same as
# leaving python out of ATTENTION_PARTS), ATTENTION_PARTS (default checks,bench,python: the tests
# and sanitizers, the benchmark, the Python package; all three can exceed one 10-minute call, so
# a call may run some), ATTENTION_CUDA_CASES (gtest filter of the CUDA cases for memcheck), ATTENTION_RACECHECK_CASES
# (the same for racecheck; see step 3), BENCH_ARGS (extra hdk-bench attention options),
# TORCH_ITERATIONS (default 100).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
export PYTHONUNBUFFERED=1
root=${OUT:-attention-gpu-out}
out="$root/attention-gpu"
build=${HDK_BUILD_DIR:-build-cuda}
mkdir -p "$out"
tests="$build/tests/hdk_dsv4_attention_tests"
bench="$build/bench/hdk-bench"
python=${PYTHON:-python3}
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
cuda_cases=${ATTENTION_CUDA_CASES:-'*Cuda*:*cuda*:*CUDA*'}
racecheck_cases=${ATTENTION_RACECHECK_CASES:-'Backends/SparseDecode.*/cuda_tensor_core*:SparseDecodeCuda*:DecodeStepCudaGraph*'}
failed=()
parts=${ATTENTION_PARTS:-checks,bench,python}
[[ -n ${HDK_SKIP_PYTHON:-} ]] && parts=${parts//python/}
wants() { [[ ,$parts, == *,$1,* ]]; }

source scripts/device/step.sh  # after the cd to the repository root
after_step() {  # a run cut short still leaves its logs
  pack >/dev/null
}

pack() {
  tar czf "$root/attention-gpu.tar.gz" -C "$root" attention-gpu
  echo "logs: $root/attention-gpu.tar.gz"
}

record_environment

# 0. Build the two binaries (and libhdk.so for the Python package).
if [[ -z ${HDK_SKIP_BUILD:-} || ! -x $tests || ! -x $bench ]]; then
  step configure 120 cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DHDK_BUILD_TESTS=ON -DHDK_WITH_CUDA=ON
  step build 420 cmake --build "$build" --parallel "$(nproc)" --target hdk_dsv4_attention_tests \
    hdk-bench hdk
fi
for binary in "$tests" "$bench"; do
  if [[ ! -x $binary ]]; then
    echo "missing $binary: the build failed (see $out/build.log)" >&2
    failed+=("missing $binary")
    printf 'FAILED: %s\n' "${failed[@]}"
    pack
    exit 2
  fi
done

# 1. Every attention test (the CUDA cases must run here, not skip; 118 s on an H100, 2026-11-27).
if wants checks; then
  step tests 200 "$tests"
  if grep -q "cuda backend skipped\|no CUDA device" "$out/tests.log"; then
    failed+=("tests (CUDA cases skipped: no usable GPU?)")
  fi

  # 2. memcheck over the CUDA cases (bounds of the paged reads, the -1 / negative slots, the
  #    second list, the counters), 3. racecheck over them (shared-memory staging of the entries,
  #    the softmax merge, the top-k).
  step memcheck 150 "$sanitizer" --tool memcheck --leak-check no --error-exitcode 3 \
    "$tests" --gtest_brief=1 --gtest_filter="$cuda_cases"
  if grep -q "\] 0 tests from" "$out/memcheck.log"; then
    failed+=("memcheck (no CUDA case matched '$cuda_cases': set ATTENTION_CUDA_CASES)")
  fi
  #    racecheck is slow: over every CUDA case it did not finish in 280 s on an H100 (2026-11-23),
  #    so by default it covers sparse_decode's two tensor-core kernels and the graph tests (about
  #    210 s there with clusters of 16, 2026-11-27); set ATTENTION_RACECHECK_CASES for others
  #    (index_topk's warpgroup kernel: 'Backends/IndexTopk.*/cuda_tensor_core', 104 s), in a
  #    call of its own.
  step racecheck 300 "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 3 \
    "$tests" --gtest_brief=1 --gtest_filter="$racecheck_cases"
fi

# 4. The benchmark: the issue grid, CUDA-graph replays with a flushed L2, the points within the
#    verify budget checked against the float64 reference.
if wants bench; then
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of options
  step bench-attention 240 "$bench" attention --verify --json "$out/attention.json" \
    ${BENCH_ARGS:-}
  step bench-attention-hot 90 "$bench" attention --hot --ops sparse --N 32,128 --iterations 50 \
    --json "$out/attention_hot.json"
fi

# 5. The Python package against the PyTorch chains (prebuilt mode: only python/csrc compiles).
if wants python; then
  site=$(mktemp -d)/site
  library=$(realpath "$build/src/libhdk.so")
  # pip when it works, setuptools directly otherwise (as scripts/device/python_gpu.sh does).
  # shellcheck disable=SC2016  # expanded by the inner shell
  if step python-build 240 env HDK_PREBUILT_LIB="$library" MAX_JOBS="$(nproc)" PY="$python" \
    SITE="$site" bash -c '"$PY" -m pip install --no-build-isolation --no-deps --no-index \
      --disable-pip-version-check --root-user-action=ignore --target "$SITE" ./python ||
      (cd python && "$PY" setup.py build --build-lib "$SITE")'; then
    step python-tests 150 env PYTHONPATH="$site" "$python" -m pytest -q -rs -p no:cacheprovider \
      python/tests/test_dsv4_attention.py python/tests/test_bench_dsv4_attention_torch.py
    step dsv4-vs-torch 300 env PYTHONPATH="$site" "$python" bench/dsv4_vs_torch.py \
      --ops attention,indexer --iterations "${TORCH_ITERATIONS:-100}" \
      --json "$out/attention_vs_torch.json"
  fi
fi

pack
finish_steps "attention GPU run"
