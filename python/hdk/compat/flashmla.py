"""FlashMLA's sparse decode call for DeepSeek-V4's MODEL1 FP8 cache on top of hdk.

Switch with ``from hdk.compat.flashmla import get_mla_metadata, flash_mla_with_kvcache``: the
names, parameters, defaults and the ``(out, softmax_lse)`` return are FlashMLA's for the sparse
form (``indices`` given, ``is_fp8_kvcache=True``, head_dim 512), and the call runs
:func:`hdk.dsv4.sparse_decode` over the same cache memory, without a copy of the cache:

* ``q`` ``[b, s_q, h_q, 512]`` is hdk's ``[b * s_q, h_q, 512]``; ``indices`` ``[b, s_q, topk]``
  is hdk's ``[b * s_q, topk]`` (-1 skipped).
* ``k_cache`` ``(num_blocks, page_block_size, 1, 584)`` (FP8 or uint8, each block's bytes
  contiguous, blocks at any pitch) is read as hdk's MODEL1 pages; the bytes of a block are the
  same in both (docs/dsv4-kv-cache.md).
* ``extra_k_cache`` + ``extra_indices_in_kvcache`` are hdk's ``extra_cache`` +
  ``extra_indices``: one softmax over both lists.
* ``topk_length`` / ``extra_topk_length`` ``[b]``: the entries of a list at and beyond the length
  are skipped (hdk gets a masked copy of the index list, made on the device, no sync).
* ``attn_sink`` ``[h_q]`` scales the output and is left out of ``softmax_lse``, as in FlashMLA
  (hdk's ``lse_includes_sink=False``). ``softmax_lse`` is ``[b, h_q, s_q]`` (a transposed view),
  and ``+inf`` for a query whose lists are empty (its output is 0), FlashMLA's value.

Differences, all deliberate (docs/python.md):

* ``tile_scheduler_metadata`` is accepted and ignored: hdk plans nothing ahead of a call.
  :func:`get_mla_metadata` returns a placeholder so engine code runs unchanged.
* Any ``h_q`` (FlashMLA: 64 or 128) and bf16 or fp32 ``q``.
* A query with a NaN or infinity in ``q``, or whose result is NaN (an entry stored with NaN),
  gets output 0 and ``softmax_lse`` NaN (FlashMLA lets NaN through).
* An index beyond its cache: hdk's rule (docs/dsv4-attention.md), never an out-of-bounds read.
* Not supported: dense decode (``indices=None``: NotImplementedError), DeepSeek-V3.2's 656-byte
  FP8 layout (head_dim 576: NotImplementedError), ``causal=True`` and ``is_fp8_kvcache=False``
  with ``indices`` (ValueError, as FlashMLA asserts), ``num_splits`` other than None.
"""

import dataclasses
from typing import Any, Optional

import torch

import hdk.dsv4
from hdk.compat._common import require_positive_scale

HEAD_DIM = 512
ENTRY_BYTES = 584


@dataclasses.dataclass
class FlashMLASchedMeta:
    """Stands in for FlashMLA's tile-scheduler metadata; hdk does not use it."""

    have_initialized: bool = False
    config: Optional[Any] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


def get_mla_metadata(*args, **kwargs):
    """FlashMLA's ``(metadata, None)``; any arguments are accepted, none are needed."""
    return FlashMLASchedMeta(), None


def _pages(cache, name):
    """The MODEL1 pages of a ``(num_blocks, page_block_size, 1, 584)`` cache as hdk's
    ``[num_blocks, page_block_size * 584]`` uint8 view of the same memory, and the block size.
    """
    if cache.dim() != 4 or cache.shape[2] != 1 or cache.shape[3] != ENTRY_BYTES:
        raise ValueError(
            f"flash_mla_with_kvcache: '{name}' must be (num_blocks, page_block_size, 1, "
            f"{ENTRY_BYTES}) MODEL1 bytes, got {tuple(cache.shape)}"
        )
    if cache.element_size() != 1:
        raise ValueError(
            f"flash_mla_with_kvcache: '{name}' must hold bytes (FP8 or uint8), got {cache.dtype}"
        )
    num_blocks, block_size = cache.shape[0], cache.shape[1]
    if cache.stride(3) != 1 or (block_size > 1 and cache.stride(1) != ENTRY_BYTES):
        raise ValueError(
            f"flash_mla_with_kvcache: each block of '{name}' must be contiguous (strides "
            f"(*, {ENTRY_BYTES}, *, 1)), got strides {cache.stride()}"
        )
    raw = cache if cache.dtype == torch.uint8 else cache.view(torch.uint8)
    pitch = raw.stride(0) if num_blocks > 1 else block_size * ENTRY_BYTES
    return (
        raw.as_strided((num_blocks, block_size * ENTRY_BYTES), (pitch, 1)),
        block_size,
    )


def _rows(indices, length, batch, name):
    """``[b, s_q, k]`` indices as ``[b * s_q, k]``, entries at and beyond ``length[i]`` -1."""
    if indices.dim() != 3 or indices.shape[0] != batch:
        raise ValueError(
            f"flash_mla_with_kvcache: '{name}' must be [batch_size, seq_len_q, topk] with "
            f"batch_size {batch}, got {tuple(indices.shape)}"
        )
    if length is not None:
        positions = torch.arange(indices.shape[2], device=indices.device)
        beyond = positions.view(1, 1, -1) >= length.view(-1, 1, 1).to(positions.dtype)
        indices = indices.masked_fill(beyond, -1)
    return indices.reshape(-1, indices.shape[2])


def flash_mla_with_kvcache(
    q,
    k_cache,
    block_table,
    cache_seqlens,
    head_dim_v,
    tile_scheduler_metadata,
    num_splits=None,
    softmax_scale=None,
    causal=False,
    is_fp8_kvcache=False,
    indices=None,
    attn_sink=None,
    extra_k_cache=None,
    extra_indices_in_kvcache=None,
    topk_length=None,
    extra_topk_length=None,
):
    """FlashMLA's sparse MODEL1 decode: returns ``(out [b, s_q, h_q, 512], softmax_lse [b, h_q,
    s_q])``. ``block_table`` and ``cache_seqlens`` are unused in the sparse form, as in FlashMLA.
    """
    if indices is None:
        raise NotImplementedError(
            "hdk.compat.flashmla: only the sparse decode form (indices given) maps onto "
            "hdk.dsv4.sparse_decode; dense MLA decode is not provided"
        )
    require_positive_scale(softmax_scale, "flash_mla_with_kvcache")
    if num_splits is not None:
        raise ValueError("flash_mla_with_kvcache: num_splits must be None")
    if causal:
        raise ValueError("flash_mla_with_kvcache: causal must be False with sparse indices")
    if not is_fp8_kvcache:
        raise ValueError("flash_mla_with_kvcache: is_fp8_kvcache must be True with sparse indices")
    if q.dim() != 4:
        raise ValueError(
            "flash_mla_with_kvcache: q must be [batch_size, seq_len_q, num_heads_q, head_dim], "
            f"got {tuple(q.shape)}"
        )
    if q.shape[3] != HEAD_DIM or head_dim_v != HEAD_DIM:
        raise NotImplementedError(
            f"hdk.compat.flashmla: only MODEL1 (head_dim = head_dim_v = {HEAD_DIM}) is supported, "
            f"got head_dim {q.shape[3]} and head_dim_v {head_dim_v} (DeepSeek-V3.2's 576 is not)"
        )
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        raise ValueError(
            "flash_mla_with_kvcache: extra_k_cache and extra_indices_in_kvcache go together"
        )
    batch, tokens, heads = q.shape[0], q.shape[1], q.shape[2]
    cache, block_size = _pages(k_cache, "k_cache")
    extra = {}
    if extra_k_cache is not None:
        extra_cache, extra_block_size = _pages(extra_k_cache, "extra_k_cache")
        extra = dict(
            extra_cache=extra_cache,
            extra_block_size=extra_block_size,
            extra_indices=_rows(
                extra_indices_in_kvcache,
                extra_topk_length,
                batch,
                "extra_indices_in_kvcache",
            ),
        )
    out = torch.empty((batch, tokens, heads, HEAD_DIM), dtype=q.dtype, device=q.device)
    lse = torch.empty((batch * tokens, heads), dtype=torch.float32, device=q.device)
    hdk.dsv4.sparse_decode(
        q.reshape(batch * tokens, heads, HEAD_DIM),
        cache,
        block_size,
        _rows(indices, topk_length, batch, "indices"),
        sink=attn_sink,
        scale=0.0 if softmax_scale is None else float(softmax_scale),
        out=out.view(batch * tokens, heads, HEAD_DIM),
        lse=lse,
        lse_includes_sink=False,
        **extra,
    )
    lse.masked_fill_(lse == float("-inf"), float("inf"))  # FlashMLA's value for an empty list
    return out, lse.view(batch, tokens, heads).transpose(1, 2)
