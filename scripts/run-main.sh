#!/usr/bin/env bash
# Fresh machine -> the main job: build hdk and run the GDN decode benchmark on the Qwen3.5-397B
# shape, checked against the float64 oracle (GPU when one is present, CPU otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
build=${HDK_BUILD_DIR:-build}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DHDK_BUILD_TESTS=OFF
cmake --build "$build" --target hdk-bench
"$build"/bench/hdk-bench gdn --preset qwen3.5-397b --verify "$@"
