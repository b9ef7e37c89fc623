"""Gated DeltaNet decode: the functional API over ``torch.ops.hdk.gdn_decode``."""

import torch

from hdk._ops import HdkError, run_op

_LAYOUTS = {"vk": 0, "kv": 1}


def _check_tensor(name, value, optional):
    if isinstance(value, torch.Tensor) or (optional and value is None):
        return
    expected = "a torch.Tensor or None" if optional else "a torch.Tensor"
    raise TypeError(
        f"hdk.gdn_decode: argument '{name}' must be {expected}, got {type(value).__name__}"
    )


def gdn_decode(
    q,
    k,
    v,
    state,
    *,
    A_log=None,
    a=None,
    dt_bias=None,
    b=None,
    g=None,
    beta=None,
    state_indices=None,
    output_state_indices=None,
    num_accepted_tokens=None,
    cu_seqlens=None,
    intermediate_states=None,
    out=None,
    invalid_index_count=None,
    nonfinite_head_count=None,
    layout="vk",
    scale=None,
    use_qk_l2norm=True,
    l2norm_eps=1e-6,
    softplus_beta=1.0,
    softplus_threshold=20.0,
    update_state=True,
    max_tokens_per_request=0,
    check_indices=False,
    out_dtype=None,
):
    r"""One Gated DeltaNet decode step (or T steps) over a pool of recurrent states.

    Per request n, value head hv (query/key head ``hv // (HV // H)``) and token t, in fp32::

        g    = -exp(A_log[hv]) * softplus(a + dt_bias[hv])    (or the given g)
        beta = sigmoid(b)                                      (or the given beta)
        q, k = l2-normalized (use_qk_l2norm), then q *= scale
        S    = exp(g) * S;   u = beta * (v - S k);   S = S + u k^T;   o = S q

    The state stays in fp32 across the T tokens and is rounded to the pool's dtype only where
    it is stored. All tensors live on one device: CPU tensors run hdk's CPU backend, CUDA
    tensors its CUDA backend on torch's current stream. The call allocates nothing but ``out``
    (when not given) and never synchronizes (unless ``check_indices``), so it can be captured
    in a CUDA graph and compiled with ``torch.compile(fullgraph=True)``. The exact contract is
    docs/gdn-decode.md; the Python specifics are docs/python.md.

    Args:
        q, k: ``[B, T, H, K]`` bf16/fp16/fp32 (or ``[1, N, H, K]`` with ``cu_seqlens``). Any
            strides except a contiguous last dim, so slices of a packed qkv buffer work.
        v: ``[B, T, HV, V]``, dtype of q; HV a multiple of H.
        state: the pool, ``[P, HV, V, K]`` (``layout="vk"``) or ``[P, HV, K, V]`` (``"kv"``),
            fp32 or bf16; each slot's block contiguous, the slot pitch (stride 0) may be larger.
            Updated in place unless ``update_state=False``.

    Keyword Args:
        A_log: ``[HV]`` fp32. Fused gating, together with a, dt_bias and b.
        a: ``[B, T, HV]`` bf16/fp16/fp32, any strides: decay input.
        dt_bias: ``[HV]`` fp32 or bf16: decay bias.
        b: ``[B, T, HV]`` bf16/fp16/fp32: update-strength input (beta = sigmoid(b)).
        g: ``[B, T, HV]`` fp32 log-decay, precomputed; give either (g, beta) or the fused set.
        beta: ``[B, T, HV]`` fp32, after the sigmoid; goes with g.
        state_indices: int32/int64. ``[B]``: request n reads and writes slot
            ``state_indices[n]``; negative marks a padding row (zero output, no slot read or
            written). ``[B, C]`` (speculative decoding, vLLM style): read slot
            ``[n, num_accepted_tokens[n] - 1]`` (``[n, 0]`` without it) and write the state
            after token t to ``[n, t]`` (negative: not written). None: request n uses slot n.
        output_state_indices: ``[B]`` int32/int64, with 1-D ``state_indices``: slot that
            receives the final state (negative: no write); a split read/write pool.
        num_accepted_tokens: ``[B]`` int32/int64, with 2-D ``state_indices``; a value outside
            ``1..C`` makes the request invalid (see invalid_index_count).
        cu_seqlens: ``[B + 1]`` int32/int64: variable-length batch over ``[1, N, ...]`` inputs;
            request n owns tokens ``cu_seqlens[n]`` up to ``cu_seqlens[n + 1]``.
        intermediate_states: ``[B, C, HV, V, K]`` (or ``K, V``), the pool's dtype, C >= T:
            receives the state after every token, indexed by the request's position n.
        out: ``[B, T, HV, V]`` bf16/fp16/fp32, written in place. None: allocated like v (or
            with ``out_dtype``); rows of requests whose cu_seqlens range is invalid are then
            left uninitialized, like any row hdk does not write.
        invalid_index_count: ``[1]`` or scalar int32/int64 counter; hdk adds the number of
            requests it ran as padding because an index (slot >= P, accepted count, cu_seqlens
            range) could not be honoured. It is never cleared by hdk.
        nonfinite_head_count: ``[1]`` or scalar int32/int64 counter of refused heads. A
            (request, value head) with a NaN or an infinity in its inputs at token t (q and k
            of its query/key head, v, a and b or g and beta) is refused from t on: its output
            rows of tokens t.. are NaN, no state from t on is stored (its final slot keeps its
            old value), and hdk adds 1 here. Its earlier tokens and the request's other heads
            run normally. Without the counter the refusal happens all the same. It is never
            cleared by hdk.
        layout: ``"vk"`` (K contiguous: SGLang, vLLM, FlashInfer pools) or ``"kv"``.
        scale: query scale; None or 0 selects ``K ** -0.5``.
        use_qk_l2norm: l2-normalize q and k (default True).
        l2norm_eps: epsilon inside the l2norm's square root (default 1e-6).
        softplus_beta, softplus_threshold: torch's softplus parameters for the fused gating
            (defaults 1 and 20).
        update_state: False: the pool is only read (speculative verify; combine with
            intermediate_states).
        max_tokens_per_request: with cu_seqlens, an upper bound on any request's token count
            (0: none); a longer request is invalid (see invalid_index_count). Decode steps in
            the ``[1, B]`` form should pass 1: the CUDA backend cannot see the lengths on the
            host and takes its one-token path only then. With ``[B, T]`` inputs: 0 or >= T.
        check_indices: read the index tensors on the host first (a copy and a synchronization
            on CUDA; never inside graph capture) and raise for any invalid request, for a slot
            written twice, and for a slot written by one request and read by another.
        out_dtype: dtype of the allocated ``out`` (default: v's dtype); must match ``out`` when
            both are given.

    Returns:
        ``out``, the ``[B, T, HV, V]`` output.

    Raises:
        HdkError: (a ValueError and a RuntimeError) for any invalid argument, with hdk's message
            naming the argument, e.g. ``hdk::gdn::decode: argument 'k' must have shape ...``.
        TypeError: when a tensor argument is not a torch.Tensor.
    """
    for name, value in (("q", q), ("k", k), ("v", v), ("state", state)):
        _check_tensor(name, value, optional=False)
    optional_tensors = (
        ("A_log", A_log),
        ("a", a),
        ("dt_bias", dt_bias),
        ("b", b),
        ("g", g),
        ("beta", beta),
        ("state_indices", state_indices),
        ("output_state_indices", output_state_indices),
        ("num_accepted_tokens", num_accepted_tokens),
        ("cu_seqlens", cu_seqlens),
        ("intermediate_states", intermediate_states),
        ("out", out),
        ("invalid_index_count", invalid_index_count),
        ("nonfinite_head_count", nonfinite_head_count),
    )
    for name, value in optional_tensors:
        _check_tensor(name, value, optional=True)
    if layout not in _LAYOUTS:
        raise HdkError(f'hdk::gdn::decode: option \'layout\' must be "vk" or "kv", got {layout!r}')
    if out is None:
        out = torch.empty(v.shape, dtype=out_dtype or v.dtype, device=v.device)
    elif out_dtype is not None and out.dtype != out_dtype:
        raise HdkError(
            f"hdk::gdn::decode: argument 'out' has dtype {out.dtype} but out_dtype is {out_dtype}"
        )
    run_op(
        torch.ops.hdk.gdn_decode,
        q,
        k,
        v,
        state,
        A_log,
        a,
        dt_bias,
        b,
        g,
        beta,
        state_indices,
        output_state_indices,
        num_accepted_tokens,
        cu_seqlens,
        intermediate_states,
        out,
        invalid_index_count,
        nonfinite_head_count,
        _LAYOUTS[layout],
        float(scale) if scale is not None else 0.0,
        bool(use_qk_l2norm),
        float(l2norm_eps),
        float(softplus_beta),
        float(softplus_threshold),
        bool(update_state),
        int(max_tokens_per_request),
        bool(check_indices),
    )
    return out
