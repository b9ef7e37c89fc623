"""hdk (Hybrid Decode Kernels) for PyTorch.

* ``hdk.gdn_decode(q, k, v, state, **options)``: the Gated DeltaNet decode step of Qwen3-Next
  and Qwen3.5 as a torch custom op (``torch.ops.hdk.gdn_decode``), on CPU and CUDA tensors.
* ``hdk.compat.flashinfer``, ``hdk.compat.sglang``, ``hdk.compat.vllm``: the functions those
  engines call today, with their names, signatures and return values, so switching is a
  one-line import change.
* ``python -m hdk.bench gdn``: hdk against the engines' Triton kernels.

docs/python.md has the API and where the compat functions deliberately differ from the peers.
"""

import importlib

from hdk._ops import HdkError, built_with_cuda, extension_has_cuda, library_version
from hdk.gdn import gdn_decode
from hdk import compat

__version__ = library_version()

__all__ = [
    "HdkError",
    "built_with_cuda",
    "compat",
    "extension_has_cuda",
    "gdn_decode",
    "library_version",
]

# Bindings of other operations ship as optional modules (hdk/dsv4.py, hdk/topk.py); whichever
# exists is imported here. A module that exists but fails to import is a bug and is raised.
for _name in ("dsv4", "topk"):
    try:
        globals()[_name] = importlib.import_module(f"hdk.{_name}")
        __all__.append(_name)
    except ModuleNotFoundError as _error:
        if _error.name != f"hdk.{_name}":
            raise
del _name
