#!/usr/bin/env bash
# Filters CTest's output for a readable log: keeps failures (with their output), errors and the
# totals; replaces the line of every passed or skipped test, and the list of tests that did not
# run, by counts. On a machine without a GPU most skipped tests are GPU-only cases, hundreds of
# lines that say nothing. The whole output goes to the file given, unfiltered.
# Usage: ctest ... 2>&1 | scripts/ctest-brief.sh FULL_LOG
set -euo pipefail
full_log=$1
tee "$full_log" | awk -v full_log="$full_log" '
  /^ +Start +[0-9]+: / { next }
  / Test +#[0-9]+: .* Passed +[0-9.]+ sec$/ { passed++; next }
  / Test +#[0-9]+: .*\*\*\*Skipped +[0-9.]+ sec$/ { skipped++; next }
  /^The following tests did not run:$/ { in_not_run = 1; next }
  in_not_run && /^\t *[0-9]+ - .* \(Skipped\)$/ { next }
  { in_not_run = 0; print; fflush() }
  END {
    printf "ctest-brief: %d passed, %d skipped (without a GPU: the GPU-only cases); every test by name in %s\n",
      passed, skipped, full_log
  }'
