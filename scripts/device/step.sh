# Sourced by the device scripts (attention_gpu.sh, dsv4_gpu.sh, kv_gpu.sh), which set $out and
# failed=() first.
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
