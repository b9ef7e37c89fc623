"""Loads the peer kernels hdk is compared against from a git-ignored folder (``.peers/``).

* SGLang: ``<peers>/sglang/fused_sigmoid_gating_recurrent.py``, the file of
  ``python/sglang/kernels/ops/attention/fla/`` (it needs only torch and triton), imported by
  path.
* FLA: the ``fla`` package directory ``<peers>/fla`` (flash-linear-attention), imported with
  ``<peers>`` on ``sys.path``; it needs einops among others.

Their sources are never committed to hdk; a missing or broken peer is reported, not fatal.
"""

import importlib.util
import os
import sys
from pathlib import Path

SGLANG_FILE = Path("sglang") / "fused_sigmoid_gating_recurrent.py"


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
