"""FlashInfer's GDN decode API (``flashinfer.gdn_decode``, 0.6.x) on top of hdk.

Switch with ``from hdk.compat.flashinfer import gated_delta_rule_decode_pretranspose`` (and
likewise ``gated_delta_rule_decode``, ``gated_delta_rule_mtp``): names, parameters, defaults
and return values are FlashInfer's. The differences, all deliberate (docs/python.md):

* Padding. A negative read index is a padding row: zero output, no slot read or written. On
  FlashInfer's bf16 fast path a negative index is redirected to slot 0, which is read *and
  written* (the pool must reserve slot 0); its fp32 path redirects negative *write* indices to
  slot 0. hdk never touches slot 0 for padding, so a pool whose slot 0 is live stays intact,
  and a pool that reserves slot 0 keeps working.
* Scope. FlashInfer restricts dtypes and sizes per backend (fp16/bf16 q only, K and V >= 128,
  fp32 state for the non-transposed and MTP kernels, T = 1 without a pool); hdk runs every
  combination it supports (docs/gdn-decode.md) on CPU and CUDA tensors.
* ``intermediate_states_buffer`` rows have the buffer's own pitch (``shape[1]``); FlashInfer's
  MTP kernel uses T as the pitch, which differs when ``shape[1] > T``.
* Indices >= pool size never touch memory out of bounds; such a request runs as padding.
"""

import warnings

import torch

from hdk.compat._common import pool_strides_supported, scatter_rows
from hdk.gdn import gdn_decode


def _decode_in_place(pool, layout, **options):
    """hdk.gdn_decode on `pool`; a pool hdk cannot address in place is staged and copied back,
    as FlashInfer does for a non-contiguous state."""
    staged = pool if pool_strides_supported(pool) else pool.contiguous()
    out = gdn_decode(state=staged, layout=layout, **options)
    if staged is not pool:
        pool.copy_(staged)
    return out


def _output_dtype(q, output):
    return output.dtype if output is not None else q.dtype


def gated_delta_rule_decode_pretranspose(
    q,
    k,
    v,
    state,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    use_qk_l2norm=True,
    initial_state=None,
    initial_state_indices=None,
    output_state_indices=None,
    *,
    intermediate_states_buffer=None,
    disable_state_update=False,
):
    """GDN decode with a V-major (``[.., HV, V, K]``, "pretransposed") state.

    Args:
        q, k: ``[B, T, H, K]``. v: ``[B, T, HV, V]``. a, b: ``[B, T, HV]`` (raw; hdk applies
            softplus and sigmoid). A_log: ``[HV]`` fp32. dt_bias: ``[HV]``.
        state: ``[B, HV, V, K]``, request i uses ``state[i]``; None in pool mode.
        scale: None selects ``K ** -0.5``.
        output: optional ``[B, T, HV, V]`` written in place; its dtype is the result's.
        use_qk_l2norm: default True (FlashInfer's default).
        initial_state: pool mode: ``[pool_size, HV, V, K]`` (any slot pitch), read at
            ``initial_state_indices`` ``[B]``; the final state goes to ``output_state_indices``
            ``[B]`` when given (negative: no write), else back to the read slot.
        intermediate_states_buffer: keyword-only, ``[>= B, >= T, HV, V, K]`` in the pool's
            dtype; row i receives the state after every token of request i.
        disable_state_update: keyword-only; True leaves the pool unchanged (verify).

    Returns:
        ``(output, state)``: the state argument, or ``initial_state`` in pool mode, updated in
        place. Padding rows (negative read index) get zero output and touch no slot; FlashInfer's
        bf16 path would read and write slot 0 for them instead.
    """
    use_pool = initial_state is not None
    if use_pool != (initial_state_indices is not None):
        raise ValueError(
            "gated_delta_rule_decode_pretranspose: initial_state and initial_state_indices "
            "must be provided together"
        )
    if output_state_indices is not None and not use_pool:
        raise ValueError(
            "gated_delta_rule_decode_pretranspose: output_state_indices can only be used with "
            "initial_state (pool mode)"
        )
    pool = initial_state if use_pool else state
    if pool is None:
        raise ValueError(
            "gated_delta_rule_decode_pretranspose: either state or initial_state must be provided"
        )
    intermediates = None
    if intermediate_states_buffer is not None:
        intermediates = intermediate_states_buffer[: q.shape[0]]
    out = _decode_in_place(
        pool,
        "vk",
        q=q,
        k=k,
        v=v,
        A_log=A_log,
        a=a,
        dt_bias=dt_bias,
        b=b,
        state_indices=initial_state_indices if use_pool else None,
        output_state_indices=output_state_indices,
        intermediate_states=intermediates,
        update_state=not disable_state_update,
        out=output,
        out_dtype=_output_dtype(q, output),
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )
    return out, pool


def gated_delta_rule_decode(
    q,
    k,
    v,
    state,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    use_qk_l2norm=True,
):
    """GDN decode with a K-major (``[B, HV, K, V]``) state; request i uses ``state[i]``.

    Arguments as in :func:`gated_delta_rule_decode_pretranspose` without a pool. FlashInfer
    requires T = 1 and an fp32 state here; hdk also runs T > 1 and bf16 states.

    Returns:
        ``(output, state)``, the state updated in place.
    """
    out = _decode_in_place(
        state,
        "kv",
        q=q,
        k=k,
        v=v,
        A_log=A_log,
        a=a,
        dt_bias=dt_bias,
        b=b,
        out=output,
        out_dtype=_output_dtype(q, output),
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )
    return out, state


def gated_delta_rule_mtp(
    q,
    k,
    v,
    initial_state,
    initial_state_indices,
    A_log,
    a,
    dt_bias,
    b,
    scale=None,
    output=None,
    intermediate_states_buffer=None,
    ssm_state_indices=None,
    disable_state_update=None,
    use_qk_l2norm=True,
    output_state_indices=None,
):
    """Multi-token GDN decode over a V-major pool (speculative verification).

    Args:
        initial_state: pool ``[pool_size, HV, V, K]``; read at ``initial_state_indices``
            ``[B]`` (negative: padding row: zero output, nothing read or written).
        intermediate_states_buffer: ``[>= B, >= T, HV, V, K]`` in the pool's dtype; entry
            ``[i, t]`` receives the state after token t of request i (the buffer's own row
            pitch; FlashInfer uses T as the pitch).
        ssm_state_indices: ``[B, T]``: the state after token t goes to pool slot
            ``ssm_state_indices[i, t]`` (negative: not written) instead of a final writeback.
            Needs T >= 2 and ``disable_state_update=False``; excludes the buffer. hdk runs this
            as a read-only pass into a temporary per-token buffer plus one scatter.
        disable_state_update: None warns and means True, like FlashInfer 0.6 (its default
            becomes False in 0.7); pass it explicitly.
        output_state_indices: ``[B]`` write slots for the final state (negative: no write);
            default: the read slots.

    Returns:
        ``(output, initial_state)``.
    """
    if disable_state_update is None:
        warnings.warn(
            "gated_delta_rule_mtp(): 'disable_state_update' defaults to True (FlashInfer 0.6 "
            "behaviour; FlashInfer 0.7 changes the default to False). Pass it explicitly.",
            FutureWarning,
            stacklevel=2,
        )
        disable_state_update = True
    batch, tokens = q.shape[0], q.shape[1]
    intermediates = None
    if intermediate_states_buffer is not None:
        if ssm_state_indices is not None:
            raise ValueError(
                "gated_delta_rule_mtp: ssm_state_indices and intermediate_states_buffer are "
                "mutually exclusive"
            )
        intermediates = intermediate_states_buffer[:batch]
    options = dict(
        q=q,
        k=k,
        v=v,
        A_log=A_log,
        a=a,
        dt_bias=dt_bias,
        b=b,
        out=output,
        out_dtype=_output_dtype(q, output),
        scale=scale,
        use_qk_l2norm=use_qk_l2norm,
    )
    if ssm_state_indices is None:
        out = _decode_in_place(
            initial_state,
            "vk",
            state_indices=initial_state_indices,
            output_state_indices=output_state_indices,
            intermediate_states=intermediates,
            update_state=not disable_state_update,
            **options,
        )
        return out, initial_state

    if tokens < 2 or disable_state_update:
        raise ValueError(
            "gated_delta_rule_mtp: ssm_state_indices needs T >= 2 and disable_state_update=False"
        )
    if tuple(ssm_state_indices.shape) != (batch, tokens):
        raise ValueError(
            f"gated_delta_rule_mtp: ssm_state_indices must have shape [B, T] = "
            f"[{batch}, {tokens}], got {list(ssm_state_indices.shape)}"
        )
    # One read slot and a different slot per token is not one hdk call (hdk's per-token mode
    # reads one of the write columns): run read-only into a per-token buffer, then scatter.
    pool = initial_state
    per_token = torch.empty(
        (batch, tokens) + tuple(pool.shape[1:]), dtype=pool.dtype, device=pool.device
    )
    out = _decode_in_place(
        pool,
        "vk",
        state_indices=initial_state_indices,
        intermediate_states=per_token,
        update_state=False,
        **options,
    )
    slots = pool.shape[0]
    read = initial_state_indices.long()
    computed = (read >= 0) & (read < slots)
    write = ssm_state_indices.long()
    valid = (write >= 0) & (write < slots) & computed.unsqueeze(1)
    scatter_rows(pool, write, per_token.flatten(0, 1), valid)
    return out, initial_state
