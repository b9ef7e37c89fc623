#!/usr/bin/env bash
# Makes sure the tools hdk builds with are installed. As root with apt-get it installs what is
# missing; otherwise it prints the exact command to run and stops.
# Usage: scripts/setup.sh [--python | --clang | --libcxx]
#   --python  adds what the Python package, its tests and bench/plot_gdn.py need
#   --clang   only clang (the CI's clang pass with libstdc++)
#   --libcxx  only clang, libc++ and the GoogleTest sources (the CI's clang pass with libc++)
set -euo pipefail

mode=${1:-}

missing=()
need() {  # need <package> <test command...>
  local package=$1
  shift
  if ! "$@" >/dev/null 2>&1; then missing+=("$package"); fi
}

links_with_libcxx() {  # a program that needs libc++'s headers and libc++abi's exceptions
  printf '#include <string>\nint main() { try { throw std::string("x"); } catch (...) {} }\n' |
    clang++ -stdlib=libc++ -x c++ - -o /dev/null
}

if [[ $mode == --clang || $mode == --libcxx ]]; then
  need clang command -v clang++
  if [[ $mode == --libcxx ]]; then
    need libc++-dev links_with_libcxx
    need libc++abi-dev links_with_libcxx
    need googletest test -f /usr/src/googletest/CMakeLists.txt
  fi
else
  need cmake command -v cmake
  need ninja-build command -v ninja
  need g++ command -v g++
  need libgtest-dev test -f /usr/include/gtest/gtest.h
  need libbenchmark-dev test -f /usr/include/benchmark/benchmark.h
fi
if [[ $mode == --python ]]; then
  need python3-torch /usr/bin/python3 -c "import torch"
  # Debian's python3-torch ships no C++ headers; the extension build needs them (torch/library.h).
  need libtorch-dev /usr/bin/python3 -c "import os, sys, torch.utils.cpp_extension as c; sys.exit(not any(os.path.isfile(os.path.join(p, 'torch', 'library.h')) for p in c.include_paths() + ['/usr/include']))"
  need python3-pytest /usr/bin/python3 -c "import pytest"
  need python3-numpy /usr/bin/python3 -c "import numpy"
  need python3-matplotlib /usr/bin/python3 -c "import matplotlib"
  need python3-dev test -f "$(/usr/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null)/Python.h"
  need python3-setuptools /usr/bin/python3 -c "import setuptools"
  need python3-pip /usr/bin/python3 -m pip --version
fi

if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

command="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "setup: missing ${missing[*]}. Run as root:" >&2
  echo "  $command" >&2
  exit 1
fi
