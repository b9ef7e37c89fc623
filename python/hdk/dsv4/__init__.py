"""DeepSeek-V4 on the decode path (docs/python.md, section hdk.dsv4).

* ops.py: the operations over ``torch.ops.hdk.dsv4_*`` (routing, the KV cache's write side, the
  indexer and sparse attention), with the C++ field names.
* kv_cache_manager.py: :class:`KVCacheManager`, the model-level owner of the pools, built on the
  operations (ops.py never imports it).
"""

from hdk.dsv4.kv_cache_manager import (
    BlockAllocator,
    KVCacheManager,
    LayerCache,
    StepInputs,
    layer_kinds,
)
from hdk.dsv4.ops import (
    ENTRY_BYTES,
    FP8_RELATIVE_ERROR_BOUND,
    KEY_BYTES,
    KEY_FORMATS,
    blocks_to_reserve,
    compress,
    compress_pair,
    compressor_accumulators,
    gather_entries,
    gather_indexer_keys,
    hadamard_matrix,
    index_topk,
    index_topk_workspace_bytes,
    quantize_indexer_query,
    route,
    route_workspace_slabs,
    sparse_decode,
    sparse_decode_workspace_bytes,
    store_and_compress,
    store_entries,
    store_indexer_keys,
)

__all__ = [
    "BlockAllocator",
    "ENTRY_BYTES",
    "FP8_RELATIVE_ERROR_BOUND",
    "KEY_BYTES",
    "KEY_FORMATS",
    "KVCacheManager",
    "LayerCache",
    "StepInputs",
    "blocks_to_reserve",
    "compress",
    "compress_pair",
    "compressor_accumulators",
    "gather_entries",
    "gather_indexer_keys",
    "hadamard_matrix",
    "index_topk",
    "index_topk_workspace_bytes",
    "layer_kinds",
    "quantize_indexer_query",
    "route",
    "route_workspace_slabs",
    "sparse_decode",
    "sparse_decode_workspace_bytes",
    "store_and_compress",
    "store_entries",
    "store_indexer_keys",
]
