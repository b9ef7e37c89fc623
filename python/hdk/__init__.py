"""hdk (Hybrid Decode Kernels) for PyTorch.

* ``hdk.gdn_decode(q, k, v, state, **options)``: the Gated DeltaNet decode step of Qwen3-Next
  and Qwen3.5 as a torch custom op (``torch.ops.hdk.gdn_decode``), on CPU and CUDA tensors.
* ``hdk.dsv4``: DeepSeek-V4's decode operations and ``hdk.dsv4.KVCacheManager``;
  ``hdk.route`` is ``hdk.dsv4.route``, the MoE router.
* ``hdk.topk(values, k)``: the largest k entries per row (the router's and indexer's selection).
* ``hdk.compat.flashinfer``, ``hdk.compat.sglang``, ``hdk.compat.vllm``: the functions those
  engines call today, with their names, signatures and return values, so switching is a
  one-line import change.
* ``python -m hdk.bench gdn``: hdk against the engines' Triton kernels.

docs/python.md has the API and where the compat functions deliberately differ from the peers.
"""

from hdk._ops import HdkError, built_with_cuda, extension_has_cuda, library_version
from hdk._topk import topk
from hdk.gdn import gdn_decode
from hdk import compat, dsv4
from hdk.dsv4 import route

__version__ = library_version()

__all__ = [
    "HdkError",
    "built_with_cuda",
    "compat",
    "dsv4",
    "extension_has_cuda",
    "gdn_decode",
    "library_version",
    "route",
    "topk",
]
