"""``hdk.topk``: the largest k entries per row, the selection primitive of DeepSeek-V4's router
and indexer, over ``torch.ops.hdk.topk`` (exported as ``hdk.topk``; this module is private)."""

import torch

from hdk._ops import HdkError, run_op


def topk(values, k, row_lengths=None, *, out_values=None, out_indices=None):
    r"""The k largest entries of each row of ``values`` ``[N, L]`` fp32, descending.

    Equal values go to the lower column; NaN ranks below every number (``-inf`` included);
    ``-0`` equals ``+0``. With ``row_lengths`` (``[N]`` int32/int64) only columns below
    ``clamp(row_lengths[n], 0, L)`` take part. Rows with fewer than k entries are padded with
    index -1 and value ``-inf``. Unlike ``torch.topk``, k may exceed L (up to 2048). One kernel
    launch on CUDA, no allocation beyond the returned tensors, no synchronization: capturable
    in a CUDA graph. The contract is docs/dsv4-router.md (section hdk::topk).

    Args:
        values: ``[N, L]`` fp32, last dim contiguous.
        k: 0..2048.
        row_lengths: optional ``[N]`` int32/int64 valid lengths.

    Keyword Args:
        out_values, out_indices: ``[N, k]`` fp32 / int32 outputs written in place; None:
            allocated.

    Returns:
        ``(out_values, out_indices)``, like ``torch.topk`` (indices are int32).

    Raises:
        HdkError: (a ValueError and a RuntimeError) for any invalid argument, with hdk's
            message naming it, e.g. ``hdk::topk: argument 'k' must be in 0..2048, got 4096``.
    """
    for name, value in (("values", values), ("row_lengths", row_lengths),
                        ("out_values", out_values), ("out_indices", out_indices)):
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"hdk.topk: argument '{name}' must be a torch.Tensor"
                f"{' or None' if name != 'values' else ''}, got {type(value).__name__}"
            )
    if values is None:
        raise TypeError("hdk.topk: argument 'values' must be a torch.Tensor, got NoneType")
    if values.dim() < 1:
        raise HdkError("hdk::topk: argument 'values' must have rank 2 ([N, L]), got rank 0")
    k = int(k)
    rows = values.shape[0]
    # An out-of-range k gets hdk's message (checked before the output shapes).
    columns = k if 0 <= k <= 2048 else 0
    if out_values is None:
        out_values = torch.empty((rows, columns), dtype=torch.float32, device=values.device)
    if out_indices is None:
        out_indices = torch.empty((rows, columns), dtype=torch.int32, device=values.device)
    run_op(torch.ops.hdk.topk, values, k, out_values, out_indices, row_lengths)
    return out_values, out_indices
