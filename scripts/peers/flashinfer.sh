#!/usr/bin/env bash
# FlashInfer's GDN decode kernels as a peer of hdk: a column of `python -m hdk.bench gdn
# --impls ...,flashinfer` and the reference of python/tests/test_compat_flashinfer.py, on a GPU
# machine without network access, from a slim payload carried in the git-ignored .peers/.
#
#   scripts/peers/flashinfer.sh download   here (PyPI reachable): pip-downloads the pinned wheels
#       into .peers/flashinfer/download/, unpacks them (pip --target, for CPython 3.12 x86_64),
#       slims them (below), packs them as one tar.xz and splits that into parts of at most
#       $HDK_FI_PART_MIB MiB (default 36), one per folder .peers/flashinfer/carry-<i>/, plus
#       .peers/flashinfer/carry-cuda-bindings/ (needed only where `cuda.bindings` is missing).
#       Prints the sizes and the carry lists. Idempotent: reuses the wheels, the staged tree and
#       the payload when the pins did not change (HDK_FI_REBUILD=1 packs again).
#   scripts/peers/flashinfer.sh install    on the GPU machine, from the repository root, with
#       any of the carry-<i>/ folders present: the parts accumulate in $HDK_FLASHINFER_DIR/parts
#       (default /tmp/hdk_flashinfer, outside the tree) over several device calls while the
#       machine stays warm; once all are there the payload is checked (sha256) and unpacked to
#       $HDK_FLASHINFER_DIR/site. A finished install is reused. Exit status 3: parts still
#       missing (listed). Then it writes $HDK_FLASHINFER_DIR/env.sh (PYTHONPATH, cache folders),
#       prints it, and imports flashinfer.gdn_decode to report the version and the GDN entry
#       points and kernels that import.
#   scripts/peers/flashinfer.sh smoke      after install: one small call of every FlashInfer GDN
#       path hdk compares with (bf16/fp32 state, T = 1 decode, T = 2 verify), with the time of
#       the first call (the CuTe DSL compiles on first use).
#   scripts/peers/flashinfer.sh check|env  the import check of install again; (re)write and print
#       env.sh.
#
# Pinned (CPython 3.12, manylinux x86_64 wheels):
#   flashinfer-python 0.7.2.post1; nvidia-cutlass-dsl 4.8.1 with -libs-base, -libs-core and
#   -libs-cu12 4.8.1 (the CuTe DSL: every FlashInfer GDN decode kernel on SM90 is a CuTe DSL
#   kernel, compiled on first call; the cu12 flavour runs on CUDA 12 and 13 drivers);
#   apache-tvm-ffi 0.1.15.post2 (the DSL's kernels are TVM-FFI functions). Installed only where
#   the GPU machine's Python lacks them: packaging 26.4, requests 2.34.2, urllib3 2.8.0,
#   idna 3.20, certifi 2026.10.19.post1, nvidia-ml-py 13.615.71 (imported by flashinfer.utils,
#   flashinfer.jit, flashinfer.artifacts) and, from carry-cuda-bindings, cuda-bindings 13.5.0
#   with cuda-pathfinder 1.9.1 (torch 2.11's wheels depend on them, so they are normally there).
# Left out (not on the SM90 GDN decode path): flashinfer/data/ (363 MB: CUDA/C++ sources,
#   CUTLASS, CCCL and the cake_gdn kernels, which FlashInfer builds for SM100a/SM103a only), the
#   b12x extra, FlashInfer's other dependencies (einops, click, tqdm, tabulate, numpy, cuda-tile,
#   nccl4py, nvidia-cudnn-frontend, ...: not imported by flashinfer.gdn_decode), ninja (only
#   for JIT C++ builds: cake_gdn, and tvm-ffi's DLPack addon, which torch 2.11's own DLPack
#   exchange API makes unnecessary), protobuf (listed by the DSL, not imported). flashinfer/__init__.py is replaced
#   by a stub that sets only the version: the real one imports all of FlashInfer.
# Size: 70 MiB (350 MiB unpacked) in two parts, carry-1 (36 MiB) and carry-2 (34 MiB), so each
#   fits a device call next to the ~15 MiB tree; plus 4 MiB in carry-cuda-bindings if ever
#   needed. The CuTe DSL's compiler library alone is 45 MiB compressed (183 MiB unpacked), its
#   runtime library 12 MiB: the DSL cannot fit one call, hence the parts.
# FlashInfer's code and the wheels stay in the git-ignored .peers/ and $HDK_FLASHINFER_DIR: none
#   of it ever enters a commit.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
peers=${HDK_FI_PEERS:-$root/.peers/flashinfer}
python=${PYTHON:-python3}
target=${HDK_FLASHINFER_DIR:-/tmp/hdk_flashinfer}

FLASHINFER_VERSION=0.7.2.post1
CORE=(
  "flashinfer-python==$FLASHINFER_VERSION"
  "apache-tvm-ffi==0.1.15.post2"
  "nvidia-cutlass-dsl==4.8.1"
  "nvidia-cutlass-dsl-libs-base==4.8.1"
  "nvidia-cutlass-dsl-libs-core==4.8.1"
  "nvidia-cutlass-dsl-libs-cu12==4.8.1"
)
# import name = distribution pin: installed on the GPU machine only where the import fails
FALLBACK=(
  "packaging=packaging==26.4"
  "requests=requests==2.34.2"
  "urllib3=urllib3==2.8.0"
  "idna=idna==3.20"
  "certifi=certifi==2026.10.19.post1"
  "pynvml=nvidia-ml-py==13.615.71"
)
CUDA_BINDINGS=(
  "cuda.bindings=cuda-bindings==13.5.0"
  "cuda.pathfinder=cuda-pathfinder==1.9.1"
)
PLATFORM=(--python-version 3.12 --implementation cp --only-binary=:all:
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
  --platform manylinux2014_x86_64 --platform any)
PIP=(--disable-pip-version-check --no-deps)

say() { echo "flashinfer.sh: $*"; }
mib() { echo "$(($(stat -c %s "$1") / 1048576)) MiB"; }

pins_stamp() {  # what the payload was built from (changes trigger a rebuild)
  printf '%s\n' "${CORE[@]}" "${FALLBACK[@]}" "${CUDA_BINDINGS[@]}"
}

first() {  # first <glob results>...: the first existing path, or nothing
  local path
  for path in "$@"; do
    [[ -e $path ]] && { echo "$path"; return; }
  done
  true
}

wheel_of() {  # wheel_of <name==version>: the downloaded wheel's path (pip normalises - to _)
  local name=${1%%==*} version=${1##*==}
  first "$peers/download/${name//-/_}-$version-"*.whl "$peers/download/$name-$version-"*.whl
}

fetch() {  # fetch <pin>...: pip download what is not already in download/
  local pin
  for pin in "$@"; do
    if [[ -z $(wheel_of "$pin") ]]; then
      say "downloading $pin"
      "$python" -m pip download "${PIP[@]}" "${PLATFORM[@]}" -q -d "$peers/download" "$pin"
    fi
    [[ -n $(wheel_of "$pin") ]] || { say "no wheel for $pin in $peers/download" >&2; exit 1; }
  done
}

unpack() {  # unpack <dir> <pin>...: pip install --target, for CPython 3.12, without .pyc
  local dir=$1
  shift
  local wheels=() pin
  for pin in "$@"; do wheels+=("$(wheel_of "$pin")"); done
  mkdir -p "$dir"
  "$python" -m pip install "${PIP[@]}" "${PLATFORM[@]}" -q --no-index --no-compile \
    --root-user-action=ignore --target "$dir" "${wheels[@]}" 2>&1 |
    grep -v "^WARNING: Target directory" || true
}

slim() {  # slim <site>: keep what flashinfer.gdn_decode imports (see the header)
  local site=${1:?}
  rm -rf "$site/flashinfer/data" "$site/b12x" "$site/build_backend.py" "$site/build_utils.py" \
    "${site:?}/bin"
  find "$site" -name __pycache__ -prune -exec rm -rf {} +
  cat >"$site/flashinfer/__init__.py" <<'EOF'
"""Stub written by hdk's scripts/peers/flashinfer.sh: FlashInfer's own __init__ imports every
FlashInfer module (and their dependencies); this payload carries the GDN decode chain only, so
the package root defines the version and nothing else. Import flashinfer.gdn_decode."""

from .version import __git_commit__ as __git_commit__
from .version import __git_version__ as __git_version__
from .version import __version__ as __version__
EOF
}

pack() {  # pack <output .tar.xz> <folder in stage>...
  local output=$1
  shift
  tar -C "$peers/stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -cf - "$@" |
    xz -T"${HDK_XZ_THREADS:-0}" --x86 --lzma2=preset=9e,dict=64MiB >"$output.tmp"
  mv "$output.tmp" "$output"
}

download() {
  mkdir -p "$peers/download"
  local fallback_pins=() cuda_pins=() entry
  for entry in "${FALLBACK[@]}"; do fallback_pins+=("${entry#*=}"); done
  for entry in "${CUDA_BINDINGS[@]}"; do cuda_pins+=("${entry#*=}"); done
  fetch "${CORE[@]}" "${fallback_pins[@]}" "${cuda_pins[@]}"
  local stamp
  stamp=$(pins_stamp)
  if [[ -z ${HDK_FI_REBUILD:-} && -f $peers/payload.stamp && $(cat "$peers/payload.stamp") == "$stamp" &&
    -f $peers/payload.tar.xz && -f $peers/carry-cuda-bindings/cuda-bindings.tar.xz ]]; then
    say "payload up to date ($peers/payload.tar.xz); HDK_FI_REBUILD=1 packs again"
  else
    rm -rf "$peers/stage" "$peers/payload.tar.xz" "$peers/payload.stamp" "$peers"/carry-*
    say "unpacking into $peers/stage"
    unpack "$peers/stage/site" "${CORE[@]}"
    slim "$peers/stage/site"
    for entry in "${FALLBACK[@]}"; do
      unpack "$peers/stage/fallback/${entry#*=}" "${entry#*=}"
      echo "${entry%%=*}" >"$peers/stage/fallback/${entry#*=}/.hdk-import-name"
    done
    for entry in "${CUDA_BINDINGS[@]}"; do
      unpack "$peers/stage/cuda-bindings/${entry#*=}" "${entry#*=}"
      echo "${entry%%=*}" >"$peers/stage/cuda-bindings/${entry#*=}/.hdk-import-name"
    done
    printf '%s\n' "${CORE[@]}" "${FALLBACK[@]}" "${CUDA_BINDINGS[@]}" >"$peers/stage/site/.hdk-pins"
    say "packing (xz -9e with the x86 filter: minutes)"
    pack "$peers/payload.tar.xz" site fallback
    mkdir -p "$peers/carry-cuda-bindings"
    pack "$peers/carry-cuda-bindings/cuda-bindings.tar.xz" cuda-bindings
    echo "$stamp" >"$peers/payload.stamp"
  fi
  # the parts: carry-<i>/payload.part-<i> and, in every part's folder, the manifest
  rm -rf "$peers"/carry-[0-9]*
  local split_dir="$peers/split"
  rm -rf "$split_dir" && mkdir -p "$split_dir"
  split -b "${HDK_FI_PART_MIB:-36}M" -d -a 1 "$peers/payload.tar.xz" "$split_dir/payload.part-"
  local parts=("$split_dir"/payload.part-*) count index=0 manifest="$split_dir/MANIFEST"
  count=${#parts[@]}
  {
    echo "flashinfer-python $FLASHINFER_VERSION payload for hdk (scripts/peers/flashinfer.sh)"
    echo "payload $(sha256sum <"$peers/payload.tar.xz" | cut -d' ' -f1) $(stat -c %s "$peers/payload.tar.xz")"
    for part in "${parts[@]}"; do
      echo "part $(basename "$part") $(sha256sum <"$part" | cut -d' ' -f1)"
    done
  } >"$manifest"
  for part in "${parts[@]}"; do
    index=$((index + 1))
    mkdir -p "$peers/carry-$index"
    mv "$part" "$peers/carry-$index/"
    cp "$manifest" "$peers/carry-$index/MANIFEST"
  done
  cp "$manifest" "$peers/carry-cuda-bindings/MANIFEST.payload"
  rm -rf "$split_dir"
  say "payload $(mib "$peers/payload.tar.xz") ($(du -sm "$peers/stage/site" | cut -f1) MiB unpacked) in $count parts:"
  local carry=()
  for ((index = 1; index <= count; index++)); do
    echo "  .peers/flashinfer/carry-$index: $(du -sm "$peers/carry-$index" | cut -f1) MiB"
    carry+=("\".peers/flashinfer/carry-$index\"")
  done
  echo "  .peers/flashinfer/carry-cuda-bindings: $(du -sm "$peers/carry-cuda-bindings" | cut -f1) MiB" \
    "(carry only if install reports cuda.bindings missing)"
  echo "carry one part per device call, each with: bash scripts/peers/flashinfer.sh install"
  echo "  e.g. carry=[$(
    IFS=,
    echo "${carry[0]}"
  )], then carry=[$(
    IFS=,
    echo "${carry[*]:1}"
  )]"
}

importable() {  # importable <module>: whether the GPU machine's Python imports it (our site aside)
  "$python" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)" \
    >/dev/null 2>&1
}

write_env() {
  cat >"$target/env.sh" <<EOF
# FlashInfer for hdk (scripts/peers/flashinfer.sh install); source it before python.
export PYTHONPATH="$target/site:$target/site/nvidia_cutlass_dsl/dsl_packages\${PYTHONPATH:+:\$PYTHONPATH}"
export FLASHINFER_WORKSPACE_BASE="$target/workspace"
export TVM_FFI_CACHE_DIR="$target/tvm-ffi-cache"
export CUTE_DSL_CACHE_DIR="$target/cute-dsl-cache"
EOF
}

install() {
  local manifest
  manifest=$(first "$peers"/carry-[0-9]*/MANIFEST "$peers"/carry-cuda-bindings/MANIFEST.payload)
  local payload_sha=""
  [[ -n $manifest ]] && payload_sha=$(awk '$1 == "payload" {print $2}' "$manifest")
  mkdir -p "$target"
  if [[ -f $target/site/.hdk-payload && (-z $payload_sha || $(cat "$target/site/.hdk-payload") == "$payload_sha") ]]; then
    say "already installed in $target/site"
  else
    [[ -n $manifest ]] || {
      say "nothing to install: no $peers/carry-<i>/ (carry them) and no install in $target" >&2
      exit 1
    }
    mkdir -p "$target/parts"
    local part name sha missing=()
    for part in "$peers"/carry-[0-9]*/payload.part-*; do
      [[ -f $part ]] || continue
      name=$(basename "$part")
      cp -f "$part" "$target/parts/$name"
    done
    while read -r _ name sha; do
      if [[ ! -f $target/parts/$name || $(sha256sum <"$target/parts/$name" | cut -d' ' -f1) != "$sha" ]]; then
        missing+=("$name")
      fi
    done < <(grep '^part ' "$manifest")
    if [[ ${#missing[@]} -gt 0 ]]; then
      say "parts in $target/parts: $(cd "$target/parts" && echo *); still missing: ${missing[*]}"
      say "carry the folder(s) holding them (.peers/flashinfer/carry-<i>) and run install again"
      exit 3
    fi
    say "all parts present: unpacking into $target"
    local fresh="$target/unpack.$$"
    rm -rf "$fresh" && mkdir -p "$fresh"
    local parts=()
    while read -r _ name _; do parts+=("$target/parts/$name"); done < <(grep '^part ' "$manifest")
    sha=$(cat "${parts[@]}" | sha256sum | cut -d' ' -f1)
    [[ $sha == "$payload_sha" ]] || { say "payload checksum mismatch ($sha)" >&2; exit 1; }
    if command -v xz >/dev/null; then
      cat "${parts[@]}" | xz -dc -T0 | tar -C "$fresh" -xf -
    else
      cat "${parts[@]}" | "$python" -c "import sys, tarfile
tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall(sys.argv[1], filter='tar')" "$fresh"
    fi
    rm -rf "$target/site" "$target/fallback"
    mv "$fresh/site" "$fresh/fallback" "$target/"
    rm -rf "$fresh" "$target/parts"
    echo "$payload_sha" >"$target/site/.hdk-payload"
  fi
  if [[ -f $peers/carry-cuda-bindings/cuda-bindings.tar.xz && ! -d $target/cuda-bindings ]]; then
    xz -dc "$peers/carry-cuda-bindings/cuda-bindings.tar.xz" | tar -C "$target" -xf -
  fi
  # Dependencies the machine's Python lacks, from the fallback folders into site/.
  local dist module
  for dist in "$target"/fallback/* "$target"/cuda-bindings/*; do
    [[ -f $dist/.hdk-import-name ]] || continue
    module=$(cat "$dist/.hdk-import-name")
    if [[ -f $target/site/.hdk-added-$(basename "$dist") ]]; then
      continue
    elif ! importable "$module"; then
      say "$module is missing on this machine: adding $(basename "$dist")"
      cp -a "$dist/." "$target/site/" && rm -f "$target/site/.hdk-import-name"
      touch "$target/site/.hdk-added-$(basename "$dist")"
    fi
  done
  if ! importable cuda.bindings && [[ ! -d $target/cuda-bindings ]]; then
    say "cuda.bindings is missing on this machine: carry .peers/flashinfer/carry-cuda-bindings too"
  fi
  write_env
  say "environment ($target/env.sh):"
  sed -n 's/^export/  export/p' "$target/env.sh"
  check
}

check() {
  # shellcheck source=/dev/null
  source "$target/env.sh"
  "$python" - <<'EOF'
import importlib, sys, warnings

warnings.simplefilter("ignore")
import flashinfer
import flashinfer.gdn_decode as gdn

print(f"FlashInfer {flashinfer.__version__} from {flashinfer.__path__[0]}")
for entry in ("gated_delta_rule_decode_pretranspose", "gated_delta_rule_decode",
              "gated_delta_rule_mtp"):
    print(f"  {entry}: {'imports' if callable(getattr(gdn, entry, None)) else 'MISSING'}")
kernels = {
    "bf16 state, T = 1 and T > 1 (CuTe DSL)": ("_GDN_DECODE_BF16_STATE_AVAILABLE",
                                                "flashinfer.gdn_kernels.gdn_decode_bf16_state"),
    "fp32 state, T = 1 pretranspose (CuTe DSL)": ("_PRETRANSPOSE_AVAILABLE",
                                                   "flashinfer.gdn_kernels.gdn_decode_pretranspose"),
    "fp32 state, T = 1 K-major (CuTe DSL)": ("_NONTRANSPOSE_AVAILABLE",
                                              "flashinfer.gdn_kernels.gdn_decode_nontranspose"),
    "fp32 state, T > 1 MTP (CuTe DSL)": ("_MTP_AVAILABLE", "flashinfer.gdn_kernels.gdn_decode_mtp"),
    "cake_gdn (nvcc JIT, SM100a/SM103a only)": ("_CAKE_GDN_AVAILABLE", "flashinfer.jit.cake_gdn"),
}
failed = 0
for what, (flag, module) in kernels.items():
    if getattr(gdn, flag, False):
        print(f"  kernels {what}: import")
        continue
    try:
        importlib.import_module(module)
        reason = "flag off"
    except Exception as error:
        reason = f"{type(error).__name__}: {error}"
    print(f"  kernels {what}: NOT importable: {reason}")
    failed += "cake" not in what
try:
    import cutlass, tvm_ffi, torch
    from cutlass._mlir._mlir_libs import _cutlass_ir

    print(f"  cutlass DSL from {cutlass.__path__[0]} ({_cutlass_ir.__file__.split('/')[-1]}); "
          f"tvm_ffi {tvm_ffi.__version__}; torch {torch.__version__}")
    if torch.cuda.is_available():
        print(f"  GPU {torch.cuda.get_device_name()} sm_{''.join(map(str, torch.cuda.get_device_capability()))}")
except Exception as error:
    print(f"  {type(error).__name__}: {error}")
sys.exit(1 if failed else 0)
EOF
}

smoke() {
  # shellcheck source=/dev/null
  source "$target/env.sh"
  "$python" - <<'EOF'
import time, warnings

import torch

warnings.simplefilter("ignore")
from flashinfer.gdn_decode import gated_delta_rule_decode_pretranspose, gated_delta_rule_mtp

if not torch.cuda.is_available():
    raise SystemExit("smoke: no CUDA device")
B, H, HV, K, V = 2, 2, 4, 128, 128
torch.manual_seed(0)
for state_dtype in (torch.bfloat16, torch.float32):
    for T in (1, 2):
        q, k = (torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn(B, T, HV, V, device="cuda", dtype=torch.bfloat16)
        a, b = (torch.randn(B, T, HV, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        A_log = torch.rand(HV, device="cuda") * 2.5
        dt_bias = torch.randn(HV, device="cuda") * 0.5
        pool = torch.randn(B + 1, HV, V, K, device="cuda").mul(0.1).to(state_dtype)
        slots = torch.tensor([2, 1], dtype=torch.int32, device="cuda")
        options = dict(initial_state=pool, initial_state_indices=slots)
        if T > 1:
            cache = torch.empty(B, T, HV, V, K, device="cuda", dtype=state_dtype)
            options.update(intermediate_states_buffer=cache, disable_state_update=True)
        start = time.time()
        try:
            if T > 1 and state_dtype == torch.float32:
                out, _ = gated_delta_rule_mtp(q, k, v, pool, slots, A_log, a, dt_bias, b,
                    intermediate_states_buffer=cache, disable_state_update=True)
            else:
                out, _ = gated_delta_rule_decode_pretranspose(q, k, v, None, A_log, a, dt_bias,
                                                              b, **options)
            torch.cuda.synchronize()
            result = f"ok, out finite: {bool(out.isfinite().all())}"
        except Exception as error:
            result = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        print(f"{str(state_dtype):15} T={T}: {time.time() - start:6.1f} s  {result}", flush=True)
EOF
}

case ${1:-} in
  download) download ;;
  install) install ;;
  check) check ;;
  smoke) smoke ;;
  env)
    write_env
    cat "$target/env.sh"
    ;;
  *)
    echo "usage: $0 download|install|check|smoke|env (see the header)" >&2
    exit 2
    ;;
esac
