# Sourced by the device scripts: `stage <name> <command...>` runs the command, tees its output to
# $out/${stage_prefix}<name>.log, prints how it ended and how long it took, and appends <name>
# to the array `failed` when it fails (the script exits non-zero at its end if any did).
stage() {
  local name=$1
  shift
  echo "=== $name: $*"
  local start=$SECONDS
  "$@" 2>&1 | tee "$out/${stage_prefix:-}$name.log"
  local status=${PIPESTATUS[0]}
  echo "=== $name: exit $status after $((SECONDS - start)) s"
  [[ $status -eq 0 ]] || failed+=("$name")
  return "$status"
}
