"""A float64 GDN decode reference for the Python tests, written from docs/gdn-decode.md.

It shares no code with hdk (neither the C++ backends nor hdk's C++ reference). Inputs are the
tensors hdk.gdn_decode takes, on any device and in any dtype; results are float64 CPU tensors
in which NaN marks an element the call must leave untouched.
"""

from dataclasses import dataclass, field

import torch


@dataclass
class Expected:
    out: torch.Tensor  # [dim0, dim1, HV, V]; 0 for padding rows, NaN where nothing is written
    state: torch.Tensor  # the pool after the call, in the pool's layout
    intermediates: torch.Tensor = None  # [B, C, ...] when requested; NaN where not written
    invalid_count: int = 0
    written_slots: set = field(default_factory=set)


def _f64(x):
    return None if x is None else x.detach().to("cpu", torch.float64)


def _ints(x):
    return None if x is None else x.detach().to("cpu", torch.int64)


def _stored(x, dtype):
    """The value a store into a `dtype` tensor keeps (fp32 or bf16 rounding)."""
    return x.to(dtype).to(torch.float64)


def gdn_decode_reference(
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
    cache_columns=None,
    layout="vk",
    scale=None,
    use_qk_l2norm=True,
    l2norm_eps=1e-6,
    softplus_beta=1.0,
    softplus_threshold=20.0,
    update_state=True,
    max_tokens_per_request=0,
):
    """What hdk.gdn_decode must produce; `cache_columns` C requests intermediate states."""
    state_dtype = state.dtype
    pool = _f64(state).clone()
    q, k, v = _f64(q), _f64(k), _f64(v)
    A_log, a, dt_bias, b, g, beta = map(_f64, (A_log, a, dt_bias, b, g, beta))
    indices, write_indices = _ints(state_indices), _ints(output_state_indices)
    accepted, cu = _ints(num_accepted_tokens), _ints(cu_seqlens)

    dim0, dim1, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    slots = pool.shape[0]
    variable = cu is not None
    requests = cu.shape[0] - 1 if variable else dim0
    total = dim1 if variable else dim0 * dim1
    capacity = total if variable else dim1
    if indices is not None and indices.dim() == 2:
        capacity = min(capacity, indices.shape[1])
    if cache_columns is not None:
        capacity = min(capacity, cache_columns)
    if variable and max_tokens_per_request > 0:
        capacity = min(capacity, max_tokens_per_request)
    if not scale:
        scale = K**-0.5
    head_of = torch.arange(HV) // (HV // H)
    block = (HV, V, K) if layout == "vk" else (HV, K, V)

    out = torch.full((dim0, dim1, HV, V), float("nan"), dtype=torch.float64)
    cache = None
    if cache_columns is not None:
        cache = torch.full((requests, cache_columns) + block, float("nan"), dtype=torch.float64)
    result = Expected(out=out, state=pool, intermediates=cache)

    def load(slot):  # a slot as [HV, V, K]
        matrix = pool[slot]
        return matrix.clone() if layout == "vk" else matrix.transpose(1, 2).clone()

    def as_stored(matrix):  # [HV, V, K] -> the pool's layout, rounded to the pool's dtype
        laid_out = matrix if layout == "vk" else matrix.transpose(1, 2)
        return _stored(laid_out, state_dtype)

    def normalize(x):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) + l2norm_eps)

    for n in range(requests):
        if variable:
            begin, end = int(cu[n]), int(cu[n + 1])
            if begin < 0 or end < begin or end > total or end - begin > capacity:
                result.invalid_count += 1  # nothing of this request is touched
                continue
            positions = [(0, begin + t) for t in range(end - begin)]
        else:
            positions = [(n, t) for t in range(dim1)]
        if not positions:
            continue

        per_token = indices is not None and indices.dim() == 2
        invalid = False
        if indices is None:
            read = n
        elif not per_token:
            read = int(indices[n])
        else:
            column = 0
            if accepted is not None:
                count = int(accepted[n])
                invalid = count < 1 or count > indices.shape[1]
                column = count - 1
            read = -1 if invalid else int(indices[n, column])
        final = None
        if not invalid and read >= 0:
            invalid = read >= slots
            if update_state and per_token:
                invalid |= any(int(indices[n, t]) >= slots for t in range(len(positions)))
            elif update_state:
                final = int(write_indices[n]) if write_indices is not None else read
                invalid |= final >= slots
        result.invalid_count += int(invalid)
        if invalid or read < 0:
            for position in positions:
                out[position] = 0.0  # padding row: zero output, no slot read or written
            continue

        S = load(read)
        for t, position in enumerate(positions):
            if g is not None:
                decay, strength = g[position], beta[position]
            else:
                x = a[position] + dt_bias
                bx = softplus_beta * x
                softplus = torch.where(
                    bx > softplus_threshold, x, torch.log1p(torch.exp(bx)) / softplus_beta
                )
                decay = -torch.exp(A_log) * softplus
                strength = torch.sigmoid(b[position])
            qh, kh = q[position][head_of], k[position][head_of]
            if use_qk_l2norm:
                qh, kh = normalize(qh), normalize(kh)
            qh = qh * scale
            S = torch.exp(decay)[:, None, None] * S
            u = strength[:, None] * (v[position] - torch.einsum("hvk,hk->hv", S, kh))
            S = S + u[:, :, None] * kh[:, None, :]
            out[position] = torch.einsum("hvk,hk->hv", S, qh)
            if cache is not None:
                cache[n, t] = as_stored(S)
            if update_state and per_token and int(indices[n, t]) >= 0:
                pool[int(indices[n, t])] = as_stored(S)
                result.written_slots.add(int(indices[n, t]))
        if final is not None and final >= 0:
            pool[final] = as_stored(S)
            result.written_slots.add(final)
    return result
