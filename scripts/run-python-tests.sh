#!/usr/bin/env bash
# Builds hdk's Python package (the torch extension hdk._C, default mode: hdk's CPU sources
# compiled in) for /usr/bin/python3 (or $PYTHON) into build-python/site, then runs the pytest
# suite in python/tests. CUDA cases run where a GPU, a CUDA torch and a CUDA libhdk exist and
# are skipped otherwise (counted in pytest's last line, not listed). Exits non-zero on any
# failure.
#
# pip installs with --target, so Debian's "externally managed" system Python (PEP 668) is left
# alone and nothing needs --break-system-packages; torch must already be importable.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-/usr/bin/python3}
site=${HDK_PYTHON_SITE:-build-python/site}
[[ $site == /* ]] || site="$PWD/$site"  # relative paths are taken from the repo root

echo "python tests: building the extension for $python into $site"
rm -rf "$site"
"$python" -m pip install --no-build-isolation --no-deps --no-index --disable-pip-version-check --root-user-action=ignore \
  --quiet --target "$site" ./python
if ! scripts/gpu-present.sh; then
  echo "python tests: no GPU here, so the CUDA cases are skipped (pytest's last line counts them)"
fi
status=0
PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" \
  "$python" -m pytest -q -p no:cacheprovider python/tests || status=$?
if [[ $status == 5 ]]; then
  echo "python tests: pytest collected no tests (exit code 5); that is a failure here" >&2
fi
exit "$status"
