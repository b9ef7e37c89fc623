#!/usr/bin/env bash
# The transformers integration's tests (python/tests/test_integrations_transformers.py) on this
# machine: a virtual environment with the pinned torch and transformers from PyPI, hdk's Python
# package built into it (CPU sources compiled in, or HDK_PREBUILT_LIB), then the tests (on the
# CPU without a GPU, with hdk's CPU backend). Debian's torch is too old for transformers 5, hence
# the environment. If the packages cannot be installed (no network), says so and exits 0 with
# SKIPPED, as the clang passes do; any test failure exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-/usr/bin/python3}
env_dir=${HDK_INTEGRATION_ENV:-build-integrations/venv}
[[ $env_dir == /* ]] || env_dir="$PWD/$env_dir"
torch_pin=torch==2.11.0
transformers_pin=transformers==5.17.0

if [[ ! -x $env_dir/bin/python ]]; then
  echo "integration tests: creating $env_dir"
  if ! "$python" -m venv "$env_dir"; then
    echo "integration tests: SKIPPED: '$python -m venv' failed (install python3-venv)"
    exit 0
  fi
fi
start=$SECONDS
if ! "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check "$torch_pin" \
  "$transformers_pin" pytest==8.3.4 numpy setuptools wheel; then
  echo "integration tests: SKIPPED: $torch_pin and $transformers_pin could not be installed"
  exit 0
fi
echo "integration tests: $torch_pin, $transformers_pin installed in $((SECONDS - start)) s"
site="$env_dir/hdk-site"
rm -rf "$site"
"$env_dir/bin/python" -m pip install --no-build-isolation --no-deps --no-index --quiet \
  --disable-pip-version-check --target "$site" ./python
PYTHONPATH="$site" "$env_dir/bin/python" -m pytest -q -p no:cacheprovider \
  python/tests/test_integrations_transformers.py
