# Sourced by the run-*.sh scripts: `stage WHAT COMMAND...` prints what a stage does, runs it and
# prints how long it took (or that it failed, with its exit code, and exits with it);
# `stages_summary` prints every stage's time and the total.
# shellcheck shell=bash

stage_names=()
stage_seconds=()
stages_started=$(date +%s.%N)

stage() {  # stage <what it does> <command...>
  local what=$1
  shift
  echo "==> $what"
  local start status=0
  start=$(date +%s.%N)
  "$@" || status=$?
  local seconds
  seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  if [[ $status != 0 ]]; then
    echo "==> FAILED after $seconds s (exit code $status): $what" >&2
    exit "$status"
  fi
  echo "==> done in $seconds s: $what"
  stage_names+=("$what")
  stage_seconds+=("$seconds")
}

stages_summary() {
  local i
  echo "==> time by stage:"
  for i in "${!stage_names[@]}"; do
    printf '    %7s s  %s\n' "${stage_seconds[$i]}" "${stage_names[$i]}"
  done
  awk -v a="$stages_started" -v b="$(date +%s.%N)" 'BEGIN { printf "    %7.1f s  total\n", b - a }'
}
