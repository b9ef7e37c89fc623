# Sourced by the device scripts (attention_gpu.sh, dsv4_gpu.sh, kv_gpu.sh), which set $out,
# $sanitizer and failed=() first.
# step <name> <timeout seconds> <command...>: runs the command under the time limit, logs it to
# $out/<name>.log, prints its exit status and last lines, and adds it to failed[] if it failed.
# A script that defines after_step has it called after every step. Returns the command's status.
step() {
  local name=$1 limit=$2
  shift 2
  local start=$SECONDS
  echo "== $name: $*"
  timeout --kill-after=10 "$limit" "$@" >"$out/$name.log" 2>&1
  local status=$?
  echo "   exit $status after $((SECONDS - start)) s (log: $out/$name.log)"
  tail -n 4 "$out/$name.log" | sed 's/^/   | /'
  [[ $status -eq 0 ]] || failed+=("$name (exit $status)")
  if declare -F after_step >/dev/null; then after_step; fi
  return "$status"
}

# record_environment: the date, the GPU, the sanitizer and the tree into $out/environment.log,
# and on the terminal.
record_environment() {
  {
    date -u
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    "$sanitizer" --version 2>&1 | tail -1
    git rev-parse HEAD 2>/dev/null
    git status --short 2>/dev/null | head -20
  } >"$out/environment.log"
  cat "$out/environment.log"
}

# finish_steps <label>: the failed steps and exit 1, or "<label>: all steps passed".
finish_steps() {
  echo
  if [[ ${#failed[@]} -gt 0 ]]; then
    printf 'FAILED: %s\n' "${failed[@]}"
    exit 1
  fi
  echo "$1: all steps passed ($SECONDS s)"
}

# require_binaries <hint> <binary...>: exit 2, naming the binary and the hint, if one is missing.
require_binaries() {
  local hint=$1 binary
  shift
  for binary in "$@"; do
    if [[ ! -x $binary ]]; then
      echo "missing $binary: $hint" >&2
      exit 2
    fi
  done
}
