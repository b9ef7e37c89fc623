#!/usr/bin/env bash
# scripts/ctest-brief.sh on a CTest log of 650 skipped tests, passes and one failure: the
# failure and its output and the totals stay, passed and skipped tests become counts, and the
# full log is kept.
set -uo pipefail
source "$(dirname "$0")/checks.sh"
repo=$(cd "$(dirname "$0")/../.." && pwd)
{
  echo "Test project /build"
  for i in $(seq 1 700); do
    echo "        Start $i: Suite.case$i"
    if ((i <= 650)); then
      echo "$i/701 Test #$i: Gpu.case$i ..............***Skipped   0.01 sec"
    else
      echo "$i/701 Test #$i: Cpu.case$i ..............   Passed    0.02 sec"
    fi
  done
  echo "701/701 Test #701: Cpu.broken ..............***Failed    0.10 sec"
  echo "expected 1, got 2"
  echo
  echo "99% tests passed, 1 tests failed out of 701"
  echo
  echo "The following tests did not run:"
  for i in $(seq 1 650); do printf '\t%3d - Gpu.case%d (Skipped)\n' "$i" "$i"; done
  echo
  echo "The following tests FAILED:"
  printf '\t701 - Cpu.broken (Failed)\n'
} >"$work/ctest.out"
"$repo/scripts/ctest-brief.sh" "$work/full.log" <"$work/ctest.out" >"$work/brief"
lines=$(wc -l <"$work/brief")
((lines <= 15)) || fail "the brief log has $lines lines: $(head -40 "$work/brief")"
for wanted in "Test #701: Cpu.broken" "expected 1, got 2" "1 tests failed out of 701" \
  "701 - Cpu.broken (Failed)" "50 passed, 650 skipped"; do
  grep -qF -- "$wanted" "$work/brief" || fail "the brief log lacks '$wanted': $(cat "$work/brief")"
done
cmp -s "$work/ctest.out" "$work/full.log" || fail "the full log is not CTest's output as it came"
finish "ctest-brief.sh"
