"""Helpers the compat modules share: argument reshaping and a sync-free masked scatter."""

import torch


def require_positive_scale(scale, function):
    """SGLang and vLLM assert scale > 0 when one is given; so do their hdk counterparts."""
    if scale is not None and not scale > 0:
        raise ValueError(f"{function}: scale must be positive, got {scale}")


def as_per_token(x, q, variable_length, name, function):
    """a, b, g or beta as hdk wants them: ``[B, T, HV]``, or ``[1, N, HV]`` with cu_seqlens.

    Engines often pass them flattened to ``[tokens, HV]`` (a view of their projection output);
    the returned tensor is a view of the same memory, never a copy.
    """
    if x is None or x.dim() != 2:
        return x
    if variable_length:
        return x.unsqueeze(0)
    batch, tokens = q.shape[0], q.shape[1]
    if x.shape[0] != batch * tokens:
        raise ValueError(
            f"{function}: argument '{name}' of shape {tuple(x.shape)} must have B * T = "
            f"{batch * tokens} rows ([B * T, HV]) or be [B, T, HV]"
        )
    return x.unflatten(0, (batch, tokens))


def decode_step_bound(q, cu_seqlens, state_indices=None):
    """``max_tokens_per_request`` for a call in the ``[1, tokens]`` + cu_seqlens form.

    The engines' decode step has as many tokens as requests (one each; CUDA-graph padding
    requests are empty), and only a host-side bound of 1 lets the CUDA backend use its one-token
    kernel: the lengths live on the device. So such a call gets 1, and a request with more than
    one token in it would be invalid (a padding row). Speculative calls (2-D indices) and
    batches with more tokens than requests get no bound.
    """
    if cu_seqlens is None or (state_indices is not None and state_indices.dim() == 2):
        return 0
    return 1 if q.shape[1] == cu_seqlens.shape[0] - 1 else 0


def pool_strides_supported(state):
    """Whether hdk can address `state` in place: each slot's block contiguous, pitch >= block."""
    if state.dim() != 4:
        return True  # hdk's validation reports the rank with the argument's name
    slots, heads, rows, columns = state.shape
    stride = state.stride()
    block = heads * rows * columns
    return (
        stride[3] == 1
        and stride[2] == columns
        and (heads == 1 or stride[1] == rows * columns)
        and (slots <= 1 or stride[0] >= block)
    )


def scatter_rows(dest, index, rows, valid):
    """``dest[index[i]] = rows[i]`` for every i with ``valid[i]``, with no host synchronization.

    ``index_copy_`` cannot skip entries and a boolean mask would need a device-to-host copy
    (illegal during CUDA-graph capture). So every skipped entry is pointed at the destination
    of the first valid entry and carries that entry's rows, and the duplicate writes the same
    bytes; with no valid entry at all, they rewrite ``dest[0]`` with its own contents. Callers
    mark out-of-range indices invalid themselves.
    """
    if index.numel() == 0:
        return
    index = index.reshape(-1).long()
    valid = valid.reshape(-1)
    first = torch.argmax(valid.to(torch.int32))
    any_valid = valid[first]
    anchor = torch.where(any_valid, index[first], torch.zeros_like(index[first]))
    anchor_rows = torch.where(any_valid, rows[first], dest[anchor])
    targets = torch.where(valid, index, anchor)
    row_shape = (-1,) + (1,) * (rows.dim() - 1)
    sources = torch.where(valid.view(row_shape), rows, anchor_rows.unsqueeze(0))
    dest.index_copy_(0, targets, sources)
