"""Plain PyTorch implementations of the DeepSeek-V4 read side, the peers of
``bench/dsv4_vs_torch.py --ops attention,indexer``: what an engine without hdk would write with
torch ops, vectorized over rows, heads and entries (no Python loop over rows).

* ``sparse_decode``: gather the listed slots' MODEL1 bytes from the page tensors (the list and
  the optional extra list, e.g. the SWA rings kept apart), dequantize them (FP8 E4M3 x UE8M0
  scale per 64-value group, bf16 RoPE part), ``q @ E^T``, a softmax with the sink in the
  denominator, ``P @ E``; returns ``(out, lse)`` like ``hdk.dsv4.sparse_decode``.
* ``index_scores`` / ``index_topk``: gather the rows' MXFP4 key pages through the block table,
  dequantize (E2M1 x UE8M0 per 32 values), ``einsum`` with q, relu, weight, sum over heads, then
  ``torch.topk``; returns ``(indices, scores)`` like ``hdk.dsv4.index_topk`` (ties in any order);
  ``topk_slots`` maps them through the block table to sparse_decode's list.

``dtype`` is the arithmetic of the matmuls: bf16 (the default, what an engine would run: the
dequantized entries and keys are exact in bf16, since an FP8 or E2M1 value times a power of two
fits bf16's 8-bit mantissa; the matmuls accumulate in fp32 but round their outputs, the scores
and P, to bf16) or fp32 (for the tests: only fp32 rounding). Softmax, lse, the weighted sum over
heads and the top-k run in fp32. Codes are decoded with lookup tables through
``torch.nn.functional.embedding`` (int32 codes, a 256-entry table: works on any device and in
torch 1.13, which has no float8 dtype). Neither peer handles invalid rows (NaN queries, NaN
markers) the way hdk does: the benchmark feeds valid data only.
"""

import torch
import torch.nn.functional as F

from hdk.bench.dsv4_kv_torch import DATA_BYTES, KEY_DATA_BYTES, _pages

NOPE, ROPE, GROUP = 448, 64, 64
KEY_DIM, KEY_GROUP = 128, 32
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

_TABLES = {}


def _fp8_table(device, dtype):
    """[256, 1]: the E4M3 value of every byte (0x7F / 0xFF: NaN)."""
    key = ("fp8", str(device), dtype)
    if key not in _TABLES:
        codes = torch.arange(256)
        exponent, mantissa = (codes >> 3) & 15, (codes & 7).double()
        magnitude = torch.where(
            exponent == 0, mantissa * 2.0**-9, (8 + mantissa) * torch.exp2(exponent.double() - 10)
        )
        magnitude[(codes & 0x7F) == 0x7F] = float("nan")
        value = torch.where(codes >= 128, -magnitude, magnitude)
        _TABLES[key] = value.to(device=device, dtype=dtype)[:, None]
    return _TABLES[key]


def _fp4_pair_table(device, dtype):
    """[256, 2]: the two E2M1 values of every packed byte (low nibble first)."""
    key = ("fp4", str(device), dtype)
    if key not in _TABLES:
        nibble = torch.tensor(E2M1_VALUES + tuple(-v for v in E2M1_VALUES), dtype=torch.float64)
        codes = torch.arange(256)
        pairs = torch.stack([nibble[codes & 15], nibble[codes >> 4]], dim=1)
        _TABLES[key] = pairs.to(device=device, dtype=dtype)
    return _TABLES[key]


def _ue8m0(exponents, dtype):
    """2^(e - 127) for UE8M0 bytes, NaN for 255 (exact in bf16 and fp32)."""
    scale = torch.exp2(exponents.float() - 127)
    scale = torch.where(exponents == 255, torch.full_like(scale, float("nan")), scale)
    return scale.to(dtype)


def dequantize_entries(cache, block_size, slots, dtype=torch.bfloat16):
    """[N, L, 512] entries of MODEL1 slots [N, L] and the mask of the live ones (slot >= 0);
    dead slots give zero rows."""
    flat = slots.long()
    live = flat >= 0
    flat = flat.clamp(min=0)
    data_view, scale_view = _pages(cache, block_size, DATA_BYTES)
    pages, offsets = flat // block_size, flat % block_size
    data = data_view[pages, offsets]  # [N, L, 576] uint8
    scales = _ue8m0(scale_view[pages, offsets, : NOPE // GROUP], dtype)  # [N, L, 7]
    nope = F.embedding(data[..., :NOPE].int(), _fp8_table(cache.device, dtype))
    nope = nope.view(*flat.shape, NOPE // GROUP, GROUP) * scales[..., None]
    rope = data[..., NOPE:].contiguous().view(torch.bfloat16).to(dtype)
    entries = torch.cat([nope.view(*flat.shape, NOPE), rope], dim=-1)
    return entries * live[..., None].to(dtype), live


def sparse_decode(
    q,
    cache,
    block_size,
    indices,
    *,
    extra_cache=None,
    extra_block_size=0,
    extra_indices=None,
    sink=None,
    scale=0.0,
    lse_includes_sink=True,
    dtype=torch.bfloat16,
    out_dtype=None,
):
    """Sparse MQA decode with a per-head sink over one or two lists of MODEL1 slots (see
    hdk.dsv4.sparse_decode): ``(out [N, Hq, 512] out_dtype (default q's), lse [N, Hq] fp32)``."""
    entries, live = dequantize_entries(cache, block_size, indices, dtype)
    if extra_indices is not None:
        extra, extra_live = dequantize_entries(extra_cache, extra_block_size, extra_indices, dtype)
        entries = torch.cat([entries, extra], dim=1)
        live = torch.cat([live, extra_live], dim=1)
    scale = scale if scale else 512**-0.5
    scores = torch.bmm(q.to(dtype), entries.transpose(1, 2)).float() * scale  # [N, Hq, L]
    scores = scores.masked_fill(~live[:, None, :], float("-inf"))
    if scores.shape[-1]:
        top = scores.amax(dim=-1)
    else:
        top = scores.new_full(scores.shape[:2], float("-inf"))
    if sink is not None:
        top = torch.maximum(top, sink.float()[None, :])
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)  # an empty list, no sink
    weights = torch.exp(scores - top[..., None])
    total = weights.sum(dim=-1)
    denominator = total + (torch.exp(sink.float()[None, :] - top) if sink is not None else 0.0)
    safe = torch.where(denominator > 0, denominator, torch.ones_like(denominator))
    out = torch.bmm((weights / safe[..., None]).to(dtype), entries)
    lse = torch.log(denominator if lse_includes_sink else total) + top
    return out.to(out_dtype or q.dtype), lse


def sparse_decode_bound(
    q,
    cache,
    block_size,
    indices,
    reference_out,
    *,
    extra_cache=None,
    extra_block_size=0,
    extra_indices=None,
    scale=0.0,
    dtype=torch.bfloat16,
    out_relative=2.0**-8,
):
    """Per-value and per-head bounds on |peer - hdk| for out and lse, from the peer's rounding
    (first order) plus hdk's own bound (docs/dsv4-attention.md, "Accuracy"):

    * a score error d_j moves out by sum_j p_j d_j (E_j - o), at most max|d| (P|E| + |o|);
      the bf16 scores round to 2^-9 |s_j| (2^-8 here for accumulation slack), fp32 ones to
      about 512 x 2^-24 x the score magnitude S, covered by hdk's 1e-4 (1 + S) term;
    * P rounded to bf16 (2^-9 relative each) moves out by at most 2^-9 P|E|;
    * out rounded to bf16 (peer and hdk): ``out_relative`` |o| (2^-8; ~1e-6 for fp32 outputs);
      hdk's own: 1e-4 (1 + S) max|E| (lse: 1e-4 (1 + S)).

    Returns ``(out_bound [N, Hq, 512], lse_bound [N, Hq])`` in fp32."""
    entries, live = dequantize_entries(cache, block_size, indices, torch.float32)
    if extra_indices is not None:
        extra, extra_live = dequantize_entries(
            extra_cache, extra_block_size, extra_indices, torch.float32
        )
        entries = torch.cat([entries, extra], dim=1)
        live = torch.cat([live, extra_live], dim=1)
    scale = scale if scale else 512**-0.5
    qf = q.float()
    scores = torch.bmm(qf, entries.transpose(1, 2)) * scale
    magnitude = torch.bmm(qf.abs(), entries.abs().transpose(1, 2)) * abs(scale)  # [N, Hq, L]
    mask = live[:, None, :]
    # Maxima over the list (a zero column keeps an empty list's maxima at 0).
    big = F.pad(scores.abs().masked_fill(~mask, 0), (0, 1)).amax(dim=-1)  # [N, Hq]
    S = F.pad(magnitude.masked_fill(~mask, 0), (0, 1)).amax(dim=-1).amax(dim=-1)  # [N]
    max_e = F.pad(entries.abs(), (0, 0, 0, 1)).amax(dim=-1).amax(dim=-1)  # [N]
    probability = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1).nan_to_num(0.0)
    spread = torch.bmm(probability, entries.abs())  # P|E|  [N, Hq, 512]
    o = reference_out.float().abs()
    rounding = 2.0**-8 if dtype == torch.bfloat16 else 0.0
    own = (1e-4 * (1 + S) * max_e)[:, None, None]
    out_bound = (
        out_relative * o + rounding * big[..., None] * (spread + o) + rounding * spread + own
    )
    lse_bound = rounding * big + 1e-4 * (1 + S)[:, None]
    return out_bound, lse_bound


def dequantize_keys(key_cache, block_size, block_table, dtype=torch.bfloat16):
    """[N, max_blocks * block_size, 128] MXFP4 keys of every row's pages (the block table's
    columns in order: entry s of row n is column s // block_size, offset s % block_size).
    Negative block ids read page 0 (the caller masks entries beyond num_entries)."""
    rows, columns = block_table.shape
    data_view, scale_view = _pages(key_cache, block_size, KEY_DATA_BYTES)
    pages = block_table.long().clamp(min=0)
    packed = data_view[pages].view(rows, columns * block_size, KEY_DATA_BYTES)
    scales = _ue8m0(scale_view[pages].view(rows, columns * block_size, -1), dtype)
    values = F.embedding(packed.int(), _fp4_pair_table(key_cache.device, dtype))
    values = values.view(rows, columns * block_size, KEY_DIM // KEY_GROUP, KEY_GROUP)
    return (values * scales[..., None]).view(rows, columns * block_size, KEY_DIM)


def index_scores(q, weights, key_cache, block_size, block_table, num_entries, dtype=torch.bfloat16):
    """score[n, s] = sum_h relu(q[n, h] . K[s]) * weights[n, h] over every entry of the block
    table's pages, -inf for s >= num_entries[n]: [N, max_blocks * block_size] fp32."""
    keys = dequantize_keys(key_cache, block_size, block_table, dtype)
    dots = torch.einsum("nhd,nsd->nhs", q.to(dtype), keys)  # [N, H, S]
    scores = (dots.float().relu() * weights.float()[..., None]).sum(dim=1)
    entry = torch.arange(scores.shape[1], device=scores.device)
    return scores.masked_fill(entry[None, :] >= num_entries.long()[:, None], float("-inf"))


def index_topk(
    q, weights, key_cache, block_size, block_table, num_entries, top_k, dtype=torch.bfloat16
):
    """(topk_indices [N, top_k] int32, -1 padding; topk_scores [N, top_k] fp32, -inf padding)
    by torch.topk over index_scores."""
    scores = index_scores(q, weights, key_cache, block_size, block_table, num_entries, dtype)
    k = min(int(top_k), scores.shape[1])
    values, indices = torch.topk(scores, k, dim=1)
    indices = torch.where(torch.isinf(values) & (values < 0), -torch.ones_like(indices), indices)
    if k < top_k:
        pad = top_k - k
        values = F.pad(values, (0, pad), value=float("-inf"))
        indices = F.pad(indices, (0, pad), value=-1)
    return indices.int(), values


def topk_slots(indices, block_table, block_size):
    """The flat slots of selected entry ordinals [N, K] (-1 padding) through the block table:
    sparse_decode's list, as hdk.dsv4.index_topk's ``topk_slots`` gives it."""
    ordinals = indices.long().clamp(min=0)
    pages = block_table.long().gather(1, ordinals // block_size)
    slots = pages * block_size + ordinals % block_size
    return torch.where(indices >= 0, slots, torch.full_like(slots, -1)).int()


def index_score_bound(q, weights, key_cache, block_size, block_table, dtype=torch.bfloat16):
    """Per-entry bound on |peer score - hdk score|: hdk's 1e-5 x sum_h |w_h| sum_d |q_hd K_d|
    (docs/dsv4-attention.md) plus, for bf16 dots, their rounding: 2^-8 of the same magnitude
    (2^-9 per dot, doubled for accumulation slack). [N, S] fp32."""
    keys = dequantize_keys(key_cache, block_size, block_table, torch.float32)
    magnitude = torch.einsum("nhd,nsd->nhs", q.float().abs(), keys.abs())
    magnitude = (magnitude * weights.float().abs()[..., None]).sum(dim=1)
    return (1e-5 + (2.0**-8 if dtype == torch.bfloat16 else 0.0)) * magnitude + 1e-30


def check_selection(indices, scores, reference_scores, bound):
    """Whether a top-k (``indices`` [N, K], -1 padding, and its ``scores``) is a correct top-k
    of ``reference_scores`` [N, S] (-inf beyond a row's entries) within ``bound`` [N, S]: the
    scores match within the bound, no index twice, best first, and every entry left out scores
    at most (the lowest chosen) + both bounds. Returns None or a description of the first
    failure."""
    K = indices.shape[1]
    reference = reference_scores.double()
    slack = bound.double()
    live = torch.isfinite(reference)
    counts = live.sum(dim=1)
    kept = torch.clamp(counts, max=K)
    column = torch.arange(K, device=indices.device)
    used = column[None, :] < kept[:, None]
    idx = indices.long()
    if bool(((idx != -1) & ~used).any()) or bool(((idx < 0) & used).any()):
        return "padding where an entry was expected, or the reverse"
    safe = idx.clamp(min=0)
    want = reference.gather(1, safe)
    tol = slack.gather(1, safe)
    got = scores.double()
    bad = used & ((got - want).abs() > tol)
    if bool(bad.any()):
        n, j = [int(x) for x in bad.nonzero()[0]]
        return f"row {n} position {j}: score {float(got[n, j])}, want {float(want[n, j])}"
    if bool((used[:, 1:] & (got[:, 1:] > got[:, :-1])).any()):
        return "scores not best first"
    times = torch.zeros(live.shape, dtype=torch.int32, device=live.device)
    times.scatter_add_(1, safe, used.int())
    if bool((times > 1).any()):
        return "an index chosen twice"
    chosen = times > 0
    lowest = torch.where(used, want + tol, torch.full_like(want, float("inf"))).amin(dim=1)
    missed = live & ~chosen & (reference - slack > lowest[:, None])
    if bool(missed.any()):
        n, s = [int(x) for x in missed.nonzero()[0]]
        return f"row {n}: entry {s} (score {float(reference[n, s])}) should have been chosen"
    return None


def valid_model1_pages(num_blocks, block_size, device):
    """MODEL1 pages of random valid entries, made on the device (the benchmarks' data): FP8 codes
    except NaN (0x7F, 0xFF become +-448), bf16 RoPE values ~N(0, 1), scale bytes 119..121
    (entries of RMS ~1), pad byte 0."""
    cache = torch.randint(0, 256, (num_blocks, block_size * 584), dtype=torch.uint8, device=device)
    data = cache[:, : block_size * 576].view(num_blocks, block_size, 576)
    codes = data[..., :448]
    codes[(codes & 0x7F) == 0x7F] &= 0xFE
    rope = torch.randn(num_blocks, block_size, 64, device=device).to(torch.bfloat16)
    data[..., 448:] = rope.view(torch.uint8).view(num_blocks, block_size, 128)
    scales = cache[:, block_size * 576 :].view(num_blocks, block_size, 8)
    scales[..., :7] = torch.randint(119, 122, (num_blocks, block_size, 7), device=device).to(
        torch.uint8
    )
    scales[..., 7] = 0
    return cache
