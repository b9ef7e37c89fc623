"""SGLang's fused GDN decode kernel API on top of hdk.

Switch with ``from hdk.compat.sglang import fused_sigmoid_gating_delta_rule_update`` in place of
``sglang.kernels.ops.attention.fla.fused_sigmoid_gating_recurrent``: the name, the (unusual)
parameter order, the defaults and the return value (the output only) are SGLang's, including
its production decode call form: q/k/v ``[1, B, H|HV, D]`` views of the packed qkv buffer with
``cu_seqlens``, and a/b ``[B, HV]``. Differences, all deliberate (docs/python.md):

* Padding. A negative ``initial_state_indices`` entry makes a padding row in hdk: zero output,
  no slot read or written, no intermediate states written. SGLang computes such a row from a
  zero state (writing its output and intermediates) and skips only the store. Engines ignore
  padded rows either way.
* The pool's slot pitch is read from ``stride(0)`` (SGLang assumes ``HV * V * K``), indices
  >= the pool size never touch memory out of bounds, and offsets are 64-bit (SGLang's int32
  offsets fault once ``B * T * HV * V * K`` reaches 2^31).
* ``intermediate_state_indices`` is optional: None writes request i's states to buffer row i,
  in the kernel. Given, hdk writes a temporary per-request buffer and scatters it to the rows
  the indices name (more memory traffic; SGLang's backend passes ``arange(N)``).
* A ``[1, tokens]`` + cu_seqlens call with as many tokens as requests is taken to be a decode
  step (hdk's ``max_tokens_per_request=1``, which selects the CUDA one-token path): a request
  with more than one token in such a batch runs as padding.
* Not supported (NotImplementedError): ``is_kda``, ``retrieve_parent_token`` (EAGLE trees),
  ``cache_ring`` / ``replayssm_*``.
"""

import torch

from hdk.compat._common import (
    as_per_token,
    decode_step_bound,
    require_positive_scale,
    scatter_rows,
)
from hdk.gdn import gdn_decode

_FUNCTION = "fused_sigmoid_gating_delta_rule_update"


def fused_sigmoid_gating_delta_rule_update(
    A_log,
    a,
    dt_bias,
    softplus_beta,
    softplus_threshold,
    q,
    k,
    v,
    b,
    initial_state_source,
    initial_state_indices,
    scale=None,
    use_qk_l2norm_in_kernel=False,
    cu_seqlens=None,
    is_kda=False,
    disable_state_update=False,
    intermediate_states_buffer=None,
    intermediate_state_indices=None,
    cache_steps=None,
    retrieve_parent_token=None,
    cache_ring=False,
    replayssm_rawv=None,
    replayssm_rawk=None,
    replayssm_g=None,
    replayssm_beta=None,
):
    """Fused sigmoid-gating GDN step (decode, or multi-token verify) over a V-major pool.

    Args:
        A_log: ``[HV]`` fp32. dt_bias: ``[HV]``.
        a, b: ``[B, T, HV]``, or ``[tokens, HV]`` (a view of the projection output; flattened
            tokens, with or without cu_seqlens). Raw inputs: softplus and sigmoid are applied.
        softplus_beta, softplus_threshold: required, as in SGLang (production: 1.0 and 20.0).
        q, k: ``[B, T, H, K]``, or ``[1, tokens, H, K]`` with cu_seqlens; any token stride.
        v: ``[B, T, HV, V]`` (or ``[1, tokens, HV, V]``).
        initial_state_source: pool ``[slots, HV, V, K]``, fp32 or bf16, updated in place
            (None: every request starts from a zero state and nothing is stored).
        initial_state_indices: ``[N]`` slots (negative: padding row, see the module notes).
        scale: None selects ``K ** -0.5``; must be positive.
        use_qk_l2norm_in_kernel: default False (SGLang's default; engines pass True).
        cu_seqlens: ``[N + 1]``: request i owns tokens ``cu_seqlens[i]:cu_seqlens[i + 1]``;
            zero-length requests do nothing.
        disable_state_update: True leaves the pool unchanged (verify).
        intermediate_states_buffer: ``[cache_slots, steps, HV, V, K]`` in the pool's dtype;
            entry ``[intermediate_state_indices[i], t]`` receives the state after token t of
            request i (negative index: not cached). ``steps`` is the row pitch.
        intermediate_state_indices: ``[N]``, or None for ``arange(N)`` without a scatter.
        cache_steps: ignored, as in SGLang (the pitch is the buffer's ``shape[1]``).

    Returns:
        The output ``o`` with v's shape and q's dtype.
    """
    if is_kda:
        raise NotImplementedError(f"{_FUNCTION}: is_kda=True (KDA gating) is not supported by hdk")
    if retrieve_parent_token is not None:
        raise NotImplementedError(
            f"{_FUNCTION}: retrieve_parent_token (EAGLE tree verify) is not supported by hdk"
        )
    if cache_ring or any(
        x is not None for x in (replayssm_rawv, replayssm_rawk, replayssm_g, replayssm_beta)
    ):
        raise NotImplementedError(
            f"{_FUNCTION}: cache_ring / replayssm_* (ReplaySSM rings) are not supported by hdk"
        )
    require_positive_scale(scale, _FUNCTION)
    variable_length = cu_seqlens is not None
    num_requests = cu_seqlens.shape[0] - 1 if variable_length else q.shape[0]
    pool, indices, update = initial_state_source, initial_state_indices, not disable_state_update
    if pool is None:
        # SGLang without a pool: every request starts from zero and nothing is stored.
        pool = torch.zeros(
            (num_requests, v.shape[2], v.shape[3], k.shape[3]), dtype=torch.float32, device=q.device
        )
        indices, update = None, False
    options = dict(
        q=q,
        k=k,
        v=v,
        A_log=A_log,
        a=as_per_token(a, q, variable_length, "a", _FUNCTION),
        dt_bias=dt_bias,
        b=as_per_token(b, q, variable_length, "b", _FUNCTION),
        state=pool,
        state_indices=indices,
        cu_seqlens=cu_seqlens,
        max_tokens_per_request=decode_step_bound(q, cu_seqlens),
        update_state=update,
        out_dtype=q.dtype,
        scale=scale,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
        softplus_beta=softplus_beta,
        softplus_threshold=softplus_threshold,
    )
    buffer = intermediate_states_buffer
    if buffer is None:
        return gdn_decode(**options)
    if intermediate_state_indices is None:
        return gdn_decode(intermediate_states=buffer[:num_requests], **options)

    # Rows named by indices: hdk writes a per-request buffer, then each computed (request,
    # token) entry is scattered to [index, token] of the caller's buffer.
    if not buffer.is_contiguous():
        raise ValueError(
            f"{_FUNCTION}: intermediate_states_buffer must be contiguous when "
            "intermediate_state_indices is given"
        )
    steps = buffer.shape[1]
    per_request = torch.empty(
        (num_requests,) + tuple(buffer.shape[1:]), dtype=buffer.dtype, device=buffer.device
    )
    out = gdn_decode(intermediate_states=per_request, **options)
    device = buffer.device
    if variable_length:
        starts, ends = cu_seqlens[:-1].long(), cu_seqlens[1:].long()
        total = q.shape[1]
        lengths = torch.where(
            (starts >= 0) & (ends >= starts) & (ends <= total) & (ends - starts <= steps),
            ends - starts,
            torch.zeros_like(starts),
        )
    else:
        lengths = torch.full((num_requests,), q.shape[1], dtype=torch.long, device=device)
    computed = torch.ones(num_requests, dtype=torch.bool, device=device)
    if indices is not None:
        read = indices.long()
        computed = (read >= 0) & (read < pool.shape[0])
    rows = intermediate_state_indices.long()
    cached = computed & (rows >= 0) & (rows < buffer.shape[0])
    step = torch.arange(steps, device=device)
    valid = cached.unsqueeze(1) & (step.unsqueeze(0) < lengths.unsqueeze(1))
    targets = rows.unsqueeze(1) * steps + step.unsqueeze(0)
    scatter_rows(buffer.flatten(0, 1), targets, per_request.flatten(0, 1), valid)
    return out
