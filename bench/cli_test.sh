#!/usr/bin/env bash
# hdk-bench's command line as a user meets it: every command answers --help; bad options fail
# before anything is measured, naming the valid choices; a small CPU gdn run prints its shapes,
# the legend of its columns and a summary line, writes the shapes in its JSON, and writes plain
# progress lines (no carriage returns) when stderr is not a terminal.
# Usage: cli_test.sh HDK_BENCH
set -uo pipefail
source "$(dirname "$0")/../scripts/tests/checks.sh"
bench=$1

commands=$("$bench" --help | awk '/^  [a-z]/ { print $1 }')
[[ -n $commands ]] || fail "hdk-bench --help lists no commands"
for command in $commands; do
  if ! "$bench" "$command" --help >"$work/help" 2>&1; then
    fail "hdk-bench $command --help exits non-zero: $(cat "$work/help")"
  elif ! grep -q "hdk-bench $command" "$work/help"; then
    fail "hdk-bench $command --help prints no usage: $(cat "$work/help")"
  fi
done

expect_early_error() {  # expect_early_error <text the error must hold> <gdn options...>
  local wanted=$1
  shift
  local status=0
  "$bench" gdn --cpu "$@" >"$work/out" 2>"$work/err" || status=$?
  if [[ $status == 0 ]]; then
    fail "hdk-bench gdn $* succeeded"
  elif [[ -s $work/out ]]; then
    fail "hdk-bench gdn $* printed (or measured) before failing: $(cat "$work/out")"
  elif ! grep -qF -- "$wanted" "$work/err"; then
    fail "hdk-bench gdn $*: the error does not say '$wanted': $(cat "$work/err")"
  fi
}
expect_early_error "presets: qwen3.5-397b, " --preset nope
expect_early_error "--state: unknown dtype 'fp64'" --state fp64
expect_early_error "--batch takes values >= 1" --batch 0
expect_early_error "unknown option --nope" --nope

if ! "$bench" gdn --cpu --hot --batch 1 --state fp32 --iterations 1 --verify \
  --json "$work/gdn.json" >"$work/out" 2>"$work/err"; then
  fail "the small CPU gdn run failed: $(cat "$work/out" "$work/err")"
fi
for wanted in "preset qwen3.5-397b (Qwen3.5-397B): H=16 HV=64 K=128 V=128" \
  "B 1; T 1; state fp32" "err_out, err_state = relative error against the float64 oracle" \
  "check = ok when both are at most the threshold" \
  "summary: 1 points, 0 stopped by an error, 1 checked (1 passed, 0 failed)"; do
  grep -qF -- "$wanted" "$work/out" || fail "the gdn run does not print '$wanted'"
done
grep -qF '"shapes": {"presets": [{"name": "qwen3.5-397b", "H": 16, "HV": 64, "K": 128, "V": 128}]' \
  "$work/gdn.json" || fail "the gdn JSON has no shapes: $(head -c 600 "$work/gdn.json")"
if grep -q $'\r' "$work/err"; then
  fail "progress written with carriage returns to a file: $(cat -A "$work/err" | head -c 300)"
fi
grep -q '^\[1/1\] qwen3.5-397b B=1 T=1 fp32' "$work/err" || fail "no progress line: $(cat "$work/err")"

finish "hdk-bench command line"
