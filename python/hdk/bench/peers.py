"""Loads the peer kernels hdk is compared against from a git-ignored folder (``.peers/``).

* SGLang: ``<peers>/sglang/fused_sigmoid_gating_recurrent.py``, the file of
  ``python/sglang/kernels/ops/attention/fla/`` (it needs only torch and triton), imported by
  path.
* FLA: the ``fla`` package directory ``<peers>/fla`` (flash-linear-attention), imported with
  ``<peers>`` on ``sys.path``; it needs einops among others.
* FlashInfer: ``flashinfer.gdn_decode`` (its GDN decode API) from an installed package, not from
  ``<peers>``: ``scripts/peers/flashinfer.sh install`` unpacks the slim payload carried in
  ``<peers>/flashinfer/carry-*`` into ``$HDK_FLASHINFER_DIR`` (default ``/tmp/hdk_flashinfer``,
  outside the tree). See :func:`load_flashinfer` for how it is found.

Their sources are never committed to hdk; a missing or broken peer is reported, not fatal.
"""

import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

SGLANG_FILE = Path("sglang") / "fused_sigmoid_gating_recurrent.py"
FLASHINFER_DIR = "/tmp/hdk_flashinfer"  # scripts/peers/flashinfer.sh's default install folder
# FlashInfer's GDN decode kernels on SM90 (Hopper) are CuTe DSL kernels (nvidia-cutlass-dsl),
# compiled on first call: the flag in flashinfer.gdn_decode and the module it imports.
FLASHINFER_KERNELS = {
    "bf16 state (T = 1 and T > 1)": (
        "_GDN_DECODE_BF16_STATE_AVAILABLE",
        "flashinfer.gdn_kernels.gdn_decode_bf16_state",
    ),
    "fp32 state, T = 1": (
        "_PRETRANSPOSE_AVAILABLE",
        "flashinfer.gdn_kernels.gdn_decode_pretranspose",
    ),
    "fp32 state, T > 1": ("_MTP_AVAILABLE", "flashinfer.gdn_kernels.gdn_decode_mtp"),
}


def default_peers_dir():
    """$HDK_PEERS_DIR, else the first ``.peers`` in the working directory or the source tree."""
    if os.environ.get("HDK_PEERS_DIR"):
        return Path(os.environ["HDK_PEERS_DIR"])
    candidates = [Path.cwd() / ".peers", Path(__file__).resolve().parents[3] / ".peers"]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    return candidates[0]


def load_sglang(peers_dir):
    """(SGLang's fused_sigmoid_gating_delta_rule_update, None) or (None, why not)."""
    path = Path(peers_dir) / SGLANG_FILE
    if not path.is_file():
        return None, f"SGLang kernel not found at {path}"
    try:
        spec = importlib.util.spec_from_file_location("hdk_peer_sglang_fused_sigmoid", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.fused_sigmoid_gating_delta_rule_update, None
    except Exception as error:  # a peer's import failure of any kind is a report, not a crash
        return None, f"SGLang kernel not importable: {type(error).__name__}: {error}"


def load_fla(peers_dir):
    """(FLA's fused_recurrent_gated_delta_rule, None) or (None, why not)."""
    peers_dir = Path(peers_dir)
    if not (peers_dir / "fla").is_dir():
        return None, f"FLA not found at {peers_dir / 'fla'}"
    if str(peers_dir) not in sys.path:
        sys.path.insert(0, str(peers_dir))
    try:
        from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule

        return fused_recurrent_gated_delta_rule, None
    except Exception as error:  # e.g. einops missing on the GPU machine
        return None, f"FLA not importable: {type(error).__name__}: {error}"


def flashinfer_dir():
    """Where scripts/peers/flashinfer.sh installs FlashInfer: $HDK_FLASHINFER_DIR or the default."""
    return Path(os.environ.get("HDK_FLASHINFER_DIR") or FLASHINFER_DIR)


def add_flashinfer_install(directory=None):
    """Puts the install of scripts/peers/flashinfer.sh on ``sys.path`` (the package folder and
    the CuTe DSL's ``dsl_packages``, which a ``.pth`` file would add in a site directory) and
    points FlashInfer's, TVM-FFI's and the DSL's caches into it, unless the environment sets
    them (``env.sh`` of the install does the same for a shell). Returns the ``site`` folder, or
    None when there is no install. Must run before the first ``import flashinfer``: FlashInfer
    reads its cache folder at import."""
    directory = Path(directory or flashinfer_dir())
    site = directory / "site"
    if not (site / "flashinfer").is_dir():
        return None
    for path in (site / "nvidia_cutlass_dsl" / "dsl_packages", site):
        if str(path) not in sys.path:
            sys.path.insert(0, str(path))
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", str(directory / "workspace"))
    os.environ.setdefault("TVM_FFI_CACHE_DIR", str(directory / "tvm-ffi-cache"))
    os.environ.setdefault("CUTE_DSL_CACHE_DIR", str(directory / "cute-dsl-cache"))
    return site


def load_flashinfer(peers_dir=None):
    """(FlashInfer's GDN decode entry points, None) or (None, why not).

    The result has ``decode_pretranspose`` (``gated_delta_rule_decode_pretranspose``: V-major
    ``[pool, HV, V, K]`` pool with slot indices, hdk's "vk" layout), ``decode``
    (``gated_delta_rule_decode``, K-major, fp32 state, T = 1), ``mtp``
    (``gated_delta_rule_mtp``: T > 1, fp32 pool), ``version``, ``module`` and ``describe`` (for
    the benchmark's peer line).

    Found, in this order: the install of ``scripts/peers/flashinfer.sh install`` in
    ``$HDK_FLASHINFER_DIR`` (default ``/tmp/hdk_flashinfer``), put at the front of ``sys.path``
    here (:func:`add_flashinfer_install`; this works also where a wrapper overwrites
    ``PYTHONPATH``, as scripts/device/python_gpu.sh does); else ``flashinfer`` as it imports
    (``sys.path``/``PYTHONPATH``, e.g. after ``source <install>/env.sh``, or a pip install). An
    already imported ``flashinfer`` is used as it is. ``peers_dir`` is not searched: the carried
    ``<peers>/flashinfer/carry-*`` hold compressed parts that only the install script unpacks.

    FlashInfer imports without the CuTe DSL (its kernels are optional imports there), so the
    kernels hdk compares with are checked too: if none imports, that error is the reason.
    """
    del peers_dir  # see the docstring
    if "flashinfer" not in sys.modules and add_flashinfer_install() is None:
        if importlib.util.find_spec("flashinfer") is None:
            return None, (
                f"FlashInfer not found: not importable and no install in {flashinfer_dir()} "
                "(run scripts/peers/flashinfer.sh install with .peers/flashinfer/carry-* carried)"
            )
    try:
        import flashinfer
        from flashinfer import gdn_decode
    except Exception as error:  # a peer's import failure of any kind is a report, not a crash
        return None, f"FlashInfer not importable: {type(error).__name__}: {error}"
    missing = []
    for what, (flag, module) in FLASHINFER_KERNELS.items():
        if getattr(gdn_decode, flag, False):
            continue
        try:  # the error FlashInfer swallowed
            importlib.import_module(module)
            reason = f"{flag} is False"
        except Exception as error:
            reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
        missing.append(f"{what}: {reason}")
    if len(missing) == len(FLASHINFER_KERNELS):
        return None, "FlashInfer's GDN kernels not importable: " + "; ".join(missing)
    version = getattr(flashinfer, "__version__", "?")
    where = str(Path(flashinfer.__file__).parent)
    describe = f"FlashInfer {version} from {where}"
    if missing:
        describe += " (kernels missing: " + "; ".join(missing) + ")"
    return (
        SimpleNamespace(
            decode_pretranspose=gdn_decode.gated_delta_rule_decode_pretranspose,
            decode=gdn_decode.gated_delta_rule_decode,
            mtp=gdn_decode.gated_delta_rule_mtp,
            version=version,
            module=gdn_decode,
            describe=describe,
        ),
        None,
    )
