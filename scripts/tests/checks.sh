# Sourced by the script tests: a scratch folder $work (removed on exit), `fail MESSAGE...` to
# record a failed check and go on, and `finish NAME`, which exits 1 when any check failed.
# shellcheck shell=bash
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

finish() {
  if [[ $failures != 0 ]]; then
    echo "$1: $failures check(s) failed" >&2
    exit 1
  fi
  echo "$1: every check passed"
}
