#!/usr/bin/env bash
# Fresh machine -> every test: builds hdk with its tests (CUDA sources too when nvcc is found;
# GPU cases run when a GPU is present and are skipped, with the reason, otherwise) and runs
# the C++ suite under CTest, then the Python package's tests. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
build=${HDK_BUILD_DIR:-build}
jobs=${HDK_JOBS:-$(nproc)}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHDK_BUILD_TESTS=ON \
  -DHDK_WARNINGS_AS_ERRORS=${HDK_WARNINGS_AS_ERRORS:-ON} -DHDK_WITH_CUDA=${HDK_WITH_CUDA:-AUTO}
cmake --build "$build" --parallel "$jobs"
ctest --test-dir "$build" --output-on-failure --parallel "$jobs"
if [[ -x scripts/run-python-tests.sh ]]; then
  scripts/run-python-tests.sh
fi
echo "all tests passed"
