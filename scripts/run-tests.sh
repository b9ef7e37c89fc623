#!/usr/bin/env bash
# Fresh machine -> every test: builds hdk with its tests (CUDA sources too when nvcc is found;
# GPU cases run when a GPU is present and are skipped, with the reason, otherwise) and runs
# the C++ suite under CTest, then the Python package's tests. Exits non-zero on any failure.
# The log stays short: passed and skipped tests are counted, not listed (CTest's whole output
# goes to <build>/ctest.log), failures are shown with their output.
#
# HDK_TRANSFORMERS=ON (CI sets it) then runs the transformers integration's tests in a virtual
# environment with torch and transformers from PyPI (scripts/run-integration-tests.sh).
#
# HDK_CLANG=ON (CI sets it) adds the clang passes after those: the library, the benchmark and the
# C++ tests built again with clang, CPU only, warnings as errors, against libstdc++ and against
# libc++, each run under CTest. A pass whose compiler or library cannot be installed is skipped
# with a line saying so.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --python
build=${HDK_BUILD_DIR:-build}
jobs=${HDK_JOBS:-$(nproc)}
werror=${HDK_WARNINGS_AS_ERRORS:-ON}

build_and_test() {  # build_and_test <build dir> <cmake options...>
  local dir=$1
  shift
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHDK_BUILD_TESTS=ON \
    -DHDK_WARNINGS_AS_ERRORS="$werror" "$@"
  cmake --build "$dir" --parallel "$jobs"
  GTEST_BRIEF=1 ctest --test-dir "$dir" --output-on-failure --no-tests=error --parallel "$jobs" 2>&1 |
    scripts/ctest-brief.sh "$dir/ctest.log"
}

build_and_test "$build" -DHDK_WITH_CUDA="${HDK_WITH_CUDA:-AUTO}"
scripts/run-python-tests.sh
if [[ ${HDK_TRANSFORMERS:-OFF} == ON ]]; then
  scripts/run-integration-tests.sh
fi

if [[ ${HDK_CLANG:-OFF} == ON ]]; then
  clang_options=(-DHDK_WITH_CUDA=OFF -DCMAKE_CXX_COMPILER=clang++)
  if scripts/setup.sh --clang; then
    echo "run-tests: clang pass with libstdc++ ($(clang++ --version | head -1))"
    build_and_test "$build-clang" "${clang_options[@]}"
  else
    echo "run-tests: SKIPPED the clang pass with libstdc++: clang could not be installed"
  fi
  # Debian's libgtest is built for libstdc++, so this pass builds GoogleTest from the sources
  # the googletest package ships, with libc++, and runs every test.
  if scripts/setup.sh --libcxx; then
    echo "run-tests: clang pass with libc++ (GoogleTest built from /usr/src/googletest)"
    build_and_test "$build-clang-libcxx" "${clang_options[@]}" -DCMAKE_CXX_FLAGS=-stdlib=libc++ \
      -DHDK_GTEST_SOURCE_DIR=/usr/src/googletest
  else
    echo "run-tests: SKIPPED the clang pass with libc++: clang, libc++ or the GoogleTest sources" \
      "could not be installed"
  fi
fi
echo "all tests passed"
