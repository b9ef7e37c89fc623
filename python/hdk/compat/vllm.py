"""vLLM's GDN decode kernel API (``vllm.model_executor.layers.fla.ops``) on top of hdk.

Switch with ``from hdk.compat.vllm import fused_recurrent_gated_delta_rule,
fused_sigmoid_gating_delta_rule_update``: names, parameters, defaults and the ``(o,
final_state)`` return are vLLM's, for the V-major ``[.., HV, V, K]`` pools vLLM uses since
PR #33291, including speculative decoding (2-D ``ssm_state_indices`` + ``num_accepted_tokens``)
and ``inplace_final_state`` both ways. Differences, all deliberate (docs/python.md):

* Padding sentinel. hdk treats a negative index as padding (vLLM's former ``PAD_SLOT_ID =
  -1``) and slot 0 as an ordinary slot. Newer vLLM reserves slot 0 (``NULL_BLOCK_ID = 0``) and
  skips any index <= 0. vLLM pads CUDA-graph batches with zero-length requests, which hdk also
  leaves untouched, so the reserved slot 0 is never read or written by hdk either; only a
  request *with tokens* at index 0 differs (hdk computes it and writes slot 0). Pad with -1 to
  get a zero output row that touches nothing.
* ``num_accepted_tokens`` outside ``1..C`` (vLLM reads the element before the row for 0) and
  indices >= the pool size make a padding row; nothing is read or written out of bounds.
* Without ``ssm_state_indices`` request n uses slot n (vLLM reads row ``bos`` of the state, a
  token offset, which is only right with one token per request).
* ``inplace_final_state=False`` returns one state per token, ``[total_tokens, HV, V, K]`` with
  row ``bos + t`` (what vLLM's kernel writes); for ``[B, T]`` inputs that is ``B * T`` rows
  (vLLM allocates only T rows there and writes past them).
* ``beta=None`` means ones of shape ``[.., HV]`` (vLLM's ``ones_like(q[..., 0])`` has H heads,
  wrong when HV > H). g and beta are used in fp32 (converted when given in another dtype).
* A ``[1, tokens]`` + cu_seqlens call with 1-D (or no) indices and as many tokens as requests
  is taken to be a decode step (hdk's ``max_tokens_per_request=1``, which selects the CUDA
  one-token path): a request with more than one token in such a batch runs as padding.
* Not supported (NotImplementedError): a per-V beta ``[B, T, HV, V]``, ``is_kda``, and the
  ``block_table`` / anchor arguments of the newest fused_sigmoid revision.
"""

import torch

from hdk.compat._common import (
    as_per_token,
    decode_step_bound,
    require_positive_scale,
    scatter_rows,
)
from hdk.gdn import gdn_decode


def _check_common(function, q, cu_seqlens, scale, initial_state):
    if cu_seqlens is not None and q.shape[0] != 1:
        raise ValueError(
            f"{function}: the batch size is expected to be 1 rather than {q.shape[0]} when "
            "using `cu_seqlens`; flatten variable-length inputs first"
        )
    require_positive_scale(scale, function)
    if initial_state is None:
        raise ValueError(f"{function}: initial_state (the state pool) is required")


def _read_slots(ssm_state_indices, num_accepted_tokens, num_requests, device):
    """The slot each request starts from, as hdk picks it; -1 where it cannot be honoured."""
    if ssm_state_indices is None:
        return torch.arange(num_requests, device=device)
    indices = ssm_state_indices.long()
    if indices.dim() == 1:
        return indices
    columns = indices.shape[1]
    if num_accepted_tokens is None:
        return indices[:, 0]
    column = num_accepted_tokens.long() - 1
    picked = indices.gather(1, column.clamp(0, columns - 1).unsqueeze(1)).squeeze(1)
    return torch.where((column >= 0) & (column < columns), picked, torch.full_like(picked, -1))


def _per_token_states(pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, options):
    """``inplace_final_state=False`` with cu_seqlens: every token's state, at row bos + t.

    Row bos + t is not an affine function of (request, token) once lengths vary, so hdk's
    intermediate-state view cannot express it. Instead each live request's starting state is
    copied to its first row of the result, and hdk runs in per-token mode with the result as
    the pool: it reads row bos and writes the state after token t to row bos + t.
    """
    q = options["q"]
    total = q.shape[1]
    device = q.device
    states = torch.empty((total,) + tuple(pool.shape[1:]), dtype=pool.dtype, device=device)
    num_requests = cu_seqlens.shape[0] - 1
    starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
    lengths = ends - starts
    slots = pool.shape[0]
    read = _read_slots(ssm_state_indices, num_accepted_tokens, num_requests, device)
    live = (starts >= 0) & (lengths > 0) & (ends <= total) & (read >= 0) & (read < slots)
    if total > 0 and slots > 0:
        first_rows = pool.index_select(0, read.clamp(0, slots - 1))
        scatter_rows(states, starts.clamp(0, total - 1), first_rows, live)
    step = torch.arange(max(total, 1), device=device)
    in_request = live.unsqueeze(1) & (step.unsqueeze(0) < lengths.unsqueeze(1))
    rows = torch.where(
        in_request, starts.unsqueeze(1) + step.unsqueeze(0), torch.full_like(step, -1)
    )
    out = gdn_decode(state=states, state_indices=rows, cu_seqlens=cu_seqlens, **options)
    return out, states


def _run(
    pool,
    inplace_final_state,
    cu_seqlens,
    ssm_state_indices,
    num_accepted_tokens,
    options,
    output_state_indices=None,
):
    if inplace_final_state:
        out = gdn_decode(
            state=pool,
            state_indices=ssm_state_indices,
            output_state_indices=output_state_indices,
            num_accepted_tokens=num_accepted_tokens,
            cu_seqlens=cu_seqlens,
            max_tokens_per_request=decode_step_bound(options["q"], cu_seqlens, ssm_state_indices),
            **options,
        )
        return out, pool
    if cu_seqlens is not None:
        return _per_token_states(pool, cu_seqlens, ssm_state_indices, num_accepted_tokens, options)
    q = options["q"]
    batch, tokens = q.shape[0], q.shape[1]
    states = torch.empty(
        (batch * tokens,) + tuple(pool.shape[1:]), dtype=pool.dtype, device=pool.device
    )
    out = gdn_decode(
        state=pool,
        state_indices=ssm_state_indices,
        num_accepted_tokens=num_accepted_tokens,
        intermediate_states=states.view((batch, tokens) + tuple(pool.shape[1:])),
        update_state=False,
        **options,
    )
    return out, states


def fused_recurrent_gated_delta_rule(
    q,
    k,
    v,
    g,
    beta=None,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
):
    """GDN recurrent step with precomputed gating over a V-major pool (vLLM).

    Args:
        q, k: ``[B, T, H, K]``, or ``[1, tokens, H, K]`` with cu_seqlens. v: ``[B, T, HV, V]``.
        g: ``[B, T, HV]`` log-space decay (``-exp(A_log) * softplus(a + dt_bias)``).
        beta: ``[B, T, HV]`` after the sigmoid; None: ones.
        scale: None selects ``K ** -0.5``; must be positive.
        initial_state: the pool ``[slots, HV, V, K]`` (slot pitch = stride 0).
        inplace_final_state: True (default): the state after token t is stored to slot
            ``ssm_state_indices[i, t]`` (2-D) or, with 1-D indices, the final state to
            ``ssm_state_indices[i]``. False: a new ``[total_tokens, HV, V, K]`` tensor holds
            the state after every token at row ``bos + t``; the pool is only read.
        cu_seqlens: ``[N + 1]``; q must then have batch size 1.
        ssm_state_indices: ``[N]`` or ``[N, C]`` slots (negative: padding row).
        num_accepted_tokens: ``[N]``, with 2-D indices: read slot
            ``ssm_state_indices[i, num_accepted_tokens[i] - 1]``.
        use_qk_l2norm_in_kernel: default False (vLLM's default; the Qwen layers pass True).

    Returns:
        ``(o, final_state)``: o ``[B, T, HV, V]`` in q's dtype; final_state is
        ``initial_state`` when in place, else the per-token states.
    """
    function = "fused_recurrent_gated_delta_rule"
    _check_common(function, q, cu_seqlens, scale, initial_state)
    variable_length = cu_seqlens is not None
    if beta is not None and beta.dim() == v.dim():
        raise NotImplementedError(f"{function}: a per-V beta [B, T, HV, V] is not supported by hdk")
    if beta is None:
        beta = torch.ones(v.shape[:-1], dtype=torch.float32, device=v.device)
    options = dict(
        q=q,
        k=k,
        v=v,
        g=as_per_token(g, q, variable_length, "g", function).float(),
        beta=as_per_token(beta, q, variable_length, "beta", function).float(),
        out_dtype=q.dtype,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
    )
    return _run(
        initial_state,
        inplace_final_state,
        cu_seqlens,
        ssm_state_indices,
        num_accepted_tokens,
        options,
    )


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    b,
    dt_bias,
    q=None,
    k=None,
    v=None,
    beta=1.0,
    threshold=20.0,
    scale=None,
    initial_state=None,
    inplace_final_state=True,
    cu_seqlens=None,
    ssm_state_indices=None,
    num_accepted_tokens=None,
    use_qk_l2norm_in_kernel=False,
    is_kda=False,
    *,
    ssm_state_indices_output=None,
    block_table=None,
    read_anchor=None,
    write_anchor=None,
    packed_anchors=None,
    mixed_qkv=None,
    num_qk_heads=None,
    head_qk_dim=None,
    num_v_heads=None,
    head_v_dim=None,
):
    """vLLM's fused sigmoid-gating GDN step (note: not SGLang's parameter order).

    Args:
        A_log: ``[HV]`` fp32. a, b: ``[tokens, HV]`` or ``[B, T, HV]``, raw (softplus and
            sigmoid applied in the kernel). dt_bias: ``[HV]``.
        q, k, v: as in :func:`fused_recurrent_gated_delta_rule`; or None with ``mixed_qkv``.
        beta, threshold: the **softplus** beta and threshold (defaults 1.0 and 20.0); the
            delta-rule beta is ``sigmoid(b)``.
        scale, initial_state, inplace_final_state, cu_seqlens, ssm_state_indices,
        num_accepted_tokens, use_qk_l2norm_in_kernel: as in
            :func:`fused_recurrent_gated_delta_rule`.
        ssm_state_indices_output: keyword-only, newest vLLM: ``[N]`` write slots for the final
            state with 1-D ``ssm_state_indices`` (a split pool; negative: no write).
        mixed_qkv: keyword-only, newest vLLM: the packed ``[tokens, 2*H*K + HV*V]`` buffer
            instead of q/k/v (read in place, no copy); needs ``num_qk_heads``,
            ``head_qk_dim``, ``num_v_heads``, ``head_v_dim``.

    Returns:
        ``(o, final_state)`` as in :func:`fused_recurrent_gated_delta_rule`.
    """
    function = "fused_sigmoid_gating_delta_rule_update"
    if is_kda:
        raise NotImplementedError(f"{function}: is_kda=True (KDA gating) is not supported by hdk")
    if any(x is not None for x in (block_table, read_anchor, write_anchor, packed_anchors)):
        raise NotImplementedError(
            f"{function}: block_table / read_anchor / write_anchor / packed_anchors are not "
            "supported by hdk; gather the slots into ssm_state_indices instead"
        )
    if mixed_qkv is not None:
        if q is not None or k is not None or v is not None:
            raise ValueError(f"{function}: mixed_qkv and q/k/v are mutually exclusive")
        if None in (num_qk_heads, head_qk_dim, num_v_heads, head_v_dim):
            raise ValueError(
                f"{function}: mixed_qkv needs num_qk_heads, head_qk_dim, num_v_heads and head_v_dim"
            )
        q, k, v = _split_mixed_qkv(
            mixed_qkv, num_qk_heads, head_qk_dim, num_v_heads, head_v_dim, cu_seqlens is not None
        )
    if q is None or k is None or v is None:
        raise ValueError(f"{function}: q, k and v (or mixed_qkv) are required")
    if ssm_state_indices_output is not None and (
        ssm_state_indices is None
        or ssm_state_indices.dim() != 1
        or ssm_state_indices_output.dim() != 1
    ):
        raise NotImplementedError(
            f"{function}: ssm_state_indices_output is supported with 1-D ssm_state_indices only"
        )
    _check_common(function, q, cu_seqlens, scale, initial_state)
    variable_length = cu_seqlens is not None
    options = dict(
        q=q,
        k=k,
        v=v,
        A_log=A_log,
        a=as_per_token(a, q, variable_length, "a", function),
        dt_bias=dt_bias,
        b=as_per_token(b, q, variable_length, "b", function),
        out_dtype=q.dtype,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
        softplus_beta=beta,
        softplus_threshold=threshold,
    )
    return _run(
        initial_state,
        inplace_final_state,
        cu_seqlens,
        ssm_state_indices,
        num_accepted_tokens,
        options,
        output_state_indices=ssm_state_indices_output if inplace_final_state else None,
    )


def _split_mixed_qkv(mixed_qkv, num_qk_heads, head_qk_dim, num_v_heads, head_v_dim, varlen):
    """Views of q, k, v inside the packed ``[tokens, q | k | v]`` buffer, shaped for hdk."""
    qk_width = num_qk_heads * head_qk_dim
    expected = 2 * qk_width + num_v_heads * head_v_dim
    if mixed_qkv.dim() != 2 or mixed_qkv.shape[1] != expected:
        raise ValueError(
            f"fused_sigmoid_gating_delta_rule_update: mixed_qkv must have shape [tokens, "
            f"2 * {num_qk_heads} * {head_qk_dim} + {num_v_heads} * {head_v_dim}] = "
            f"[tokens, {expected}], got {list(mixed_qkv.shape)}"
        )
    q = mixed_qkv[:, :qk_width].unflatten(-1, (num_qk_heads, head_qk_dim))
    k = mixed_qkv[:, qk_width : 2 * qk_width].unflatten(-1, (num_qk_heads, head_qk_dim))
    v = mixed_qkv[:, 2 * qk_width :].unflatten(-1, (num_v_heads, head_v_dim))
    # With cu_seqlens the rows are the tokens of all requests ([1, tokens, ...]); without,
    # one decode token per request ([B, 1, ...]).
    if varlen:
        return q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
    return q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)
