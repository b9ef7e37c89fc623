"""hdk.dsv4.index_topk and hdk.dsv4.sparse_decode against a float64 reference written here over
dsv4_kv_reference.py's decoders, on keys and entries stored by hdk.dsv4.store_indexer_keys /
store_entries into shuffled pages, with poisoned outputs and counters that start at 3: ragged
entry counts, fewer entries than top_k, exact ties, empty lists with and without a sink, NaN
queries counted, errors naming the argument. index_topk's quantized q forms (E4M3 codes, also as
torch.float8_e4m3fn where torch has it, over fp8 keys; packed MXFP4 with q_scales over mxfp4
keys, also as quantize_indexer_query makes it) run over key pages written here as random bytes.
The cases run on the CPU; test_cuda_matches_the_cpu runs both ops on CUDA tensors where a GPU
exists (the C++ tests hold the CUDA cases).

Tolerances are those of tests/dsv4/attention_test.cpp (docs/dsv4-attention.md, "Accuracy")."""

import math

import pytest
import torch

import dsv4_kv_reference as ref
import hdk
import hdk.dsv4
from conftest import CUDA_SKIP

needs_cuda = pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
NOT_ON_CUDA = (
    "the case builds its inputs on the CPU; CUDA is covered by test_cuda_matches_the_cpu and the "
    "C++ tests"
)
NAN = float("nan")
INF = float("inf")


# This file's own `device` fixture: the CUDA case is skipped for the backend, not the machine.
@pytest.fixture(params=["cpu", pytest.param("cuda", marks=pytest.mark.skip(reason=NOT_ON_CUDA))])
def device(request):
    return request.param


def counter(device):
    return torch.full((1,), 3, dtype=torch.int32, device=device)


# ---- index_topk -----------------------------------------------------------------------------


def stored_keys(counts, block_size, fmt, g, distinct=0):
    """Keys for rows with `counts` entries, stored into shuffled pages of a poisoned key cache.
    Returns (cache, block_table, decoded keys [row][entry] float64 [128])."""
    pages_per_row = [max(1, -(-c // block_size)) for c in counts]
    num_blocks = sum(pages_per_row) + 3
    order = torch.randperm(num_blocks, generator=g).tolist()
    max_blocks = max(pages_per_row) + 1
    block_table = torch.full((len(counts), max_blocks), 999, dtype=torch.int32)  # unused: junk
    total = ref.KEY_BYTES[fmt]
    cache = torch.full((num_blocks, block_size * total), 0x5A, dtype=torch.uint8)
    palette = torch.randn(max(distinct, 1), 128, generator=g)
    decoded = []
    for row, count in enumerate(counts):
        pages = [order.pop() for _ in range(pages_per_row[row])]
        block_table[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        if distinct:
            keys = palette[torch.randint(0, distinct, (count,), generator=g)]
        else:
            keys = torch.randn(count, 128, generator=g) * torch.exp2(
                torch.randint(-3, 4, (count, 1), generator=g).float()
            )
        slots = torch.tensor(
            [pages[s // block_size] * block_size + s % block_size for s in range(count)],
            dtype=torch.int64,
        )
        if count:
            hdk.dsv4.store_indexer_keys(keys, slots, cache, block_size, format=fmt, rotate=False)
        decoded.append(
            [ref.decode_key(ref.read(cache, block_size, int(s), total, 64), fmt) for s in slots]
        )
    return cache, block_table, decoded


def reference_topk(q, weights, decoded, top_k):
    """float64 scores, magnitudes (the tolerance's scale), and the reference's top-k."""
    rows = []
    for n, keys in enumerate(decoded):
        qn, wn = q[n].double(), weights[n].double()
        if not (torch.isfinite(qn).all() and torch.isfinite(wn).all()) or not keys:
            rows.append(([], [], []))
            continue
        # Scored once per distinct key, so that equal keys get bit-equal scores (exact ties).
        k, inverse = torch.unique(torch.stack(keys), dim=0, return_inverse=True)  # [U, 128]
        dots = qn @ k.T  # [H, U]
        scores = (dots.clamp(min=0) * wn[:, None]).sum(0)[inverse]
        magnitudes = (wn.abs()[:, None] * (qn.abs() @ k.abs().T)).sum(0)[inverse]
        order = sorted(range(len(keys)), key=lambda s: (-float(scores[s]), s))[:top_k]
        rows.append((scores.tolist(), magnitudes.tolist(), order))
    return rows


def check_topk(indices, scores, expected, top_k, exact, relative=1e-5):
    for n, (score, magnitude, order) in enumerate(expected):
        got = indices[n].tolist()
        got_scores = scores[n].tolist()
        kept = len(order)
        assert got[kept:] == [-1] * (top_k - kept), f"row {n}: padding"
        assert all(s == -INF for s in got_scores[kept:]), f"row {n}: padding scores"
        if exact:
            assert got[:kept] == order, f"row {n}: exact ties go to the lower ordinal"
        tol = [relative * m + 1e-30 for m in magnitude]
        chosen = got[:kept]
        assert len(set(chosen)) == kept and all(0 <= s < len(score) for s in chosen), f"row {n}"
        for j, s in enumerate(chosen):
            assert abs(got_scores[j] - score[s]) <= tol[s], f"row {n}: score of entry {s}"
            if j:
                assert got_scores[j - 1] >= got_scores[j], f"row {n}: best first at {j}"
                if got_scores[j - 1] == got_scores[j]:
                    assert chosen[j - 1] < chosen[j], f"row {n}: tie order at {j}"
        lowest = min((score[s] + tol[s] for s in chosen), default=INF)
        for s in set(range(len(score))) - set(chosen):
            assert score[s] - tol[s] <= lowest, f"row {n}: entry {s} should have been chosen"


@pytest.mark.parametrize("fmt", ["mxfp4", "nvfp4"])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16])
def test_index_topk_matches_the_reference(device, fmt, q_dtype):
    g = ref.generator(31)
    block_size, top_k, heads = 16, 64, 64
    counts = [0, 7, 40, 100, 163, 64, 90]  # ragged; rows 1 and 2 have fewer than top_k
    cache, block_table, decoded = stored_keys(counts, block_size, fmt, g)
    n = len(counts)
    q = torch.randn(n, heads, 128, generator=g).to(q_dtype)
    weights = torch.rand(n, heads, generator=g) * 0.02
    q[5, 3, 17] = NAN  # counted, only padding
    weights[6, 9] = INF  # counted, only padding
    indices = torch.full((n, top_k), 12345, dtype=torch.int32)
    scores = torch.full((n, top_k), NAN)
    slots = torch.full((n, top_k), 54321, dtype=torch.int32)
    count = counter("cpu")
    got_indices, got_scores = hdk.dsv4.index_topk(
        q,
        weights,
        cache,
        block_size,
        block_table,
        torch.tensor(counts, dtype=torch.int32),
        top_k,
        format=fmt,
        topk_indices=indices,
        topk_scores=scores,
        topk_slots=slots,
        invalid_count=count,
    )
    assert got_indices is indices and got_scores is scores
    assert int(count.item()) == 3 + 2
    check_topk(indices, scores, reference_topk(q, weights, decoded, top_k), top_k, exact=False)
    # The slots are the entries' places through the block table, -1 for padding.
    pages = block_table.long().gather(1, indices.clamp(min=0).long() // block_size)
    want = torch.where(indices >= 0, pages * block_size + indices % block_size, -1)
    assert torch.equal(slots.long(), want)


def test_index_topk_exact_ties_and_allocated_outputs(device):
    g = ref.generator(32)
    block_size, top_k = 8, 48
    counts = [70, 30, 5]
    cache, block_table, decoded = stored_keys(counts, block_size, "mxfp4", g, distinct=4)
    q = torch.randn(3, 64, 128, generator=g)
    weights = torch.rand(3, 64, generator=g)
    indices, scores = hdk.dsv4.index_topk(
        q, weights, cache, block_size, block_table, torch.tensor(counts), top_k
    )
    assert indices.shape == (3, top_k) and indices.dtype == torch.int32
    assert scores.shape == (3, top_k) and scores.dtype == torch.float32
    check_topk(indices, scores, reference_topk(q, weights, decoded, top_k), top_k, exact=True)

    again, none = hdk.dsv4.index_topk(
        q,
        weights,
        cache,
        block_size,
        block_table,
        torch.tensor(counts),
        top_k,
        return_scores=False,
    )
    assert none is None and torch.equal(again, indices)


# ---- index_topk's quantized q forms -----------------------------------------------------------

FLOAT8_E4M3 = getattr(torch, "float8_e4m3fn", None)


def e4m3_value(codes):
    """float64 values of E4M3 codes (any shape; NaN for 0x7F and 0xFF)."""
    codes = codes.long()
    magnitude = ref.E4M3[(codes & 0x7F).clamp(max=0x7E)]
    magnitude = torch.where((codes & 0x7F) == 0x7F, torch.full_like(magnitude, NAN), magnitude)
    return torch.where(codes >= 0x80, -magnitude, magnitude)


def e2m1_value(packed):
    """float64 [..., 2 * B] values of packed E2M1 bytes [..., B] (dim 2i in the low nibble)."""
    codes = torch.stack([packed & 15, packed >> 4], dim=-1).flatten(-2).long()
    return torch.where(codes >= 8, -ref.E2M1[codes & 7], ref.E2M1[codes & 7])


def ue8m0_value(scales):
    """float64 2^(byte - 127) (NaN for 0xFF), each repeated over its 32 dims."""
    value = torch.exp2(scales.double() - 127)
    value = torch.where(scales == 0xFF, torch.full_like(value, NAN), value)
    return value.repeat_interleave(32, dim=-1)


def random_e4m3(shape, g):
    """Random E4M3 codes, every one but the NaN codes 0x7F and 0xFF."""
    codes = torch.randint(0, 254, shape, generator=g)
    return (codes + (codes >= 0x7F).long()).to(torch.uint8)


def byte_keys(counts, block_size, fmt, g):
    """Random key bytes in shuffled pages of a poisoned cache: fp8, 128 E4M3 codes and a
    power-of-two fp32 scale 2^-6 .. 2^6; mxfp4, 64 random bytes of E2M1 pairs and 4 UE8M0
    scales 2^-4 .. 2^4. Returns (cache, block_table, keys [row][entry] float64 [128])."""
    data = 128 if fmt == "fp8" else 64
    tail = ref.KEY_BYTES[fmt] - data
    pages_per_row = [max(1, -(-c // block_size)) for c in counts]
    num_blocks = sum(pages_per_row) + 3
    order = torch.randperm(num_blocks, generator=g).tolist()
    block_table = torch.full((len(counts), max(pages_per_row) + 1), 999, dtype=torch.int32)
    cache = torch.randint(0, 256, (num_blocks, block_size * (data + tail)), generator=g)
    cache = cache.to(torch.uint8)
    keys = []
    for row, count in enumerate(counts):
        pages = [order.pop() for _ in range(pages_per_row[row])]
        block_table[row, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        keys.append([])
        for s in range(count):
            page, offset = pages[s // block_size], s % block_size
            if fmt == "fp8":
                codes = random_e4m3((128,), g)
                scale = torch.exp2(torch.randint(-6, 7, (1,), generator=g).float())
                scale_bytes = scale.view(torch.uint8)
                key = e4m3_value(codes) * scale.double()
            else:
                codes = torch.randint(0, 256, (64,), generator=g).to(torch.uint8)
                scale_bytes = torch.randint(123, 132, (4,), generator=g).to(torch.uint8)
                key = e2m1_value(codes) * ue8m0_value(scale_bytes)
            cache[page, offset * data : (offset + 1) * data] = codes
            start = block_size * data + offset * tail
            cache[page, start : start + tail] = scale_bytes
            keys[-1].append(key)
    return cache, block_table, keys


def reference_quantized_topk(q, weights, keys, top_k, group):
    """reference_topk for dequantized q [N, H, 128] float64 (NaN where invalid); `group` = 32
    takes the tolerance's scale over the exact 32-dim group terms (packed MXFP4 q), 1 over the
    products."""
    rows = []
    for n, row_keys in enumerate(keys):
        qn, wn = q[n], weights[n].double()
        if not (torch.isfinite(qn).all() and torch.isfinite(wn).all()) or not row_keys:
            rows.append(([], [], []))
            continue
        k = torch.stack(row_keys)  # [S, 128]
        heads = qn.shape[0]
        parts = torch.einsum("hgd,sgd->hsg", qn.view(heads, -1, group), k.view(len(k), -1, group))
        scores = (parts.sum(-1).clamp(min=0) * wn[:, None]).sum(0)
        magnitudes = (wn.abs()[:, None] * parts.abs().sum(-1)).sum(0)
        order = sorted(range(len(k)), key=lambda s: (-float(scores[s]), s))[:top_k]
        rows.append((scores.tolist(), magnitudes.tolist(), order))
    return rows


@pytest.mark.parametrize("as_float8", [False, True])
def test_index_topk_e4m3_query_over_fp8_keys(device, as_float8):
    if as_float8 and FLOAT8_E4M3 is None:
        pytest.skip(f"torch {torch.__version__} has no float8_e4m3fn")
    g = ref.generator(33)
    block_size, top_k, heads = 16, 64, 64
    counts = [0, 7, 40, 100, 163, 64, 90]
    cache, block_table, keys = byte_keys(counts, block_size, "fp8", g)
    n = len(counts)
    q = random_e4m3((n, heads, 128), g)
    q[5, 3, 17] = 0x7F  # a NaN code: counted, only padding
    weights = torch.rand(n, heads, generator=g) * 0.02
    weights[6, 9] = INF  # counted, only padding
    count = counter("cpu")
    slots = torch.full((n, top_k), 54321, dtype=torch.int32)
    indices, scores = hdk.dsv4.index_topk(
        q.view(FLOAT8_E4M3) if as_float8 else q,
        weights,
        cache,
        block_size,
        block_table,
        torch.tensor(counts, dtype=torch.int32),
        top_k,
        format="fp8",
        topk_slots=slots,
        invalid_count=count,
    )
    assert int(count.item()) == 3 + 2
    expected = reference_quantized_topk(e4m3_value(q), weights, keys, top_k, group=1)
    check_topk(indices, scores, expected, top_k, exact=False)
    pages = block_table.long().gather(1, indices.clamp(min=0).long() // block_size)
    assert torch.equal(
        slots.long(), torch.where(indices >= 0, pages * block_size + indices % block_size, -1)
    )


def test_index_topk_packed_mxfp4_query(device):
    g = ref.generator(34)
    block_size, top_k, heads = 16, 64, 64
    counts = [0, 7, 40, 100, 163, 64, 90]
    cache, block_table, keys = byte_keys(counts, block_size, "mxfp4", g)
    n = len(counts)
    q = torch.randint(0, 256, (n, heads, 64), generator=g).to(torch.uint8)
    q_scales = torch.randint(123, 132, (n, heads, 4), generator=g).to(torch.uint8)
    q_scales[5, 10, 2] = 0xFF  # a NaN scale: counted, only padding
    weights = torch.rand(n, heads, generator=g) * 0.02
    weights[6, 0] = NAN  # counted, only padding
    count = counter("cpu")
    indices, scores = hdk.dsv4.index_topk(
        q,
        weights,
        cache,
        block_size,
        block_table,
        torch.tensor(counts, dtype=torch.int64),
        top_k,
        format="mxfp4",
        q_scales=q_scales,
        invalid_count=count,
    )
    assert int(count.item()) == 3 + 2
    dequantized = e2m1_value(q) * ue8m0_value(q_scales)
    expected = reference_quantized_topk(dequantized, weights, keys, top_k, group=32)
    # The group terms are exact: only the fp32 sums over groups and heads round
    # (docs/dsv4-attention.md, "Accuracy").
    check_topk(indices, scores, expected, top_k, exact=False, relative=(heads + 8) * 2.0**-24)


def test_index_topk_over_quantize_indexer_query(device):
    """The engine's MXFP4 path: q quantized by quantize_indexer_query (the bytes of an mxfp4 key)
    scores over stored mxfp4 keys as its dequantized values do; a non-finite q vector's NaN
    markers make its row invalid."""
    g = ref.generator(35)
    block_size, top_k, heads = 16, 32, 64
    counts = [50, 130, 9]
    cache, block_table, decoded = stored_keys(counts, block_size, "mxfp4", g)
    q = torch.randn(3, heads, 128, generator=g)
    q[2, 5, 100] = INF
    weights = torch.rand(3, heads, generator=g) * 0.02
    count = counter("cpu")
    q_packed, q_scales = hdk.dsv4.quantize_indexer_query(q, rotate=False, invalid_count=count)
    assert int(count.item()) == 3 + 1
    dequantized = e2m1_value(q_packed) * ue8m0_value(q_scales)
    error = (dequantized[:2] - q[:2].double()).norm(dim=-1) / q[:2].double().norm(dim=-1)
    assert error.max() < 0.2  # FP4's rounding, not a layout mix-up
    indices, scores = hdk.dsv4.index_topk(
        q_packed,
        weights,
        cache,
        block_size,
        block_table,
        torch.tensor(counts),
        top_k,
        q_scales=q_scales,
        invalid_count=count,
    )
    assert int(count.item()) == 3 + 1 + 1
    expected = reference_quantized_topk(dequantized, weights, decoded, top_k, group=32)
    check_topk(indices, scores, expected, top_k, exact=False, relative=(heads + 8) * 2.0**-24)


def test_index_topk_quantized_query_errors():
    index_args, _ = small_problem()
    fp8_args = dict(index_args, key_cache=torch.zeros(4, 16 * 132, dtype=torch.uint8))
    with pytest.raises(hdk.HdkError, match="format fp8 takes argument 'q' as uint8 E4M3 codes"):
        hdk.dsv4.index_topk(**fp8_args, format="fp8")
    codes = torch.zeros(2, 64, 128, dtype=torch.uint8)
    with pytest.raises(hdk.HdkError, match="format mxfp4 takes argument 'q' as bfloat16"):
        hdk.dsv4.index_topk(**dict(index_args, q=codes))
    with pytest.raises(hdk.HdkError, match="argument 'q_scales' is given only with packed E2M1"):
        hdk.dsv4.index_topk(**index_args, q_scales=torch.zeros(2, 64, 4, dtype=torch.uint8))
    packed = dict(index_args, q=torch.zeros(2, 64, 64, dtype=torch.uint8))
    with pytest.raises(hdk.HdkError, match=r"argument 'q_scales' must have shape \[N, H, 4\]"):
        hdk.dsv4.index_topk(**packed, q_scales=torch.zeros(2, 64, 8, dtype=torch.uint8))
    with pytest.raises(TypeError, match="'q_scales'"):
        hdk.dsv4.index_topk(**packed, q_scales=[127] * 4)
    hdk.dsv4.index_topk(**packed, q_scales=torch.full((2, 64, 4), 127, dtype=torch.uint8))
    hdk.dsv4.index_topk(**dict(fp8_args, q=codes), format="fp8")


# ---- sparse_decode --------------------------------------------------------------------------


def stored_entries(num_slots, block_size, g):
    """Random MODEL1 entries in every slot of a cache; returns (cache, decoded [slots, 512])."""
    num_blocks = -(-num_slots // block_size)
    cache = torch.full((num_blocks, block_size * 584), 0x5A, dtype=torch.uint8)
    values = torch.randn(num_blocks * block_size, 512, generator=g)
    values[:, 448:] *= 0.5
    slots = torch.randperm(num_blocks * block_size, generator=g)
    hdk.dsv4.store_entries(values[slots], slots, cache, block_size)
    decoded = torch.stack(
        [
            ref.decode_entry(ref.read(cache, block_size, s, 584, 576))
            for s in range(num_blocks * block_size)
        ]
    )
    return cache, decoded


def reference_attention(q, decoded, indices, sink, scale):
    """float64 out [N, Hq, 512], lse [N, Hq], and per row the tolerance's S and max |E|."""
    n, heads, _ = q.shape
    out = torch.zeros(n, heads, 512, dtype=torch.float64)
    lse = torch.empty(n, heads, dtype=torch.float64)
    bounds = []
    for row in range(n):
        live = [s for s in indices[row].tolist() if s >= 0]
        qn = q[row].double()
        sink_term = sink.double() if sink is not None else torch.full((heads,), -INF)
        if not torch.isfinite(qn).all():
            lse[row] = NAN
            bounds.append((0.0, 0.0))
            continue
        if not live:
            lse[row] = sink_term
            bounds.append((0.0, 0.0))
            continue
        e = decoded[live]  # [L, 512]
        logits = scale * (qn @ e.T)  # [Hq, L]
        both = torch.cat([logits, sink_term[:, None]], dim=1)
        lse[row] = torch.logsumexp(both, dim=1)
        out[row] = torch.exp(logits - lse[row][:, None]) @ e
        bounds.append((float(scale * (qn.abs() @ e.abs().T).max()), float(e.abs().max())))
    return out, lse, bounds


def check_attention(out, lse, expected, invalid_rows):
    want_out, want_lse, bounds = expected
    relative = 2.0**-8 if out.dtype == torch.bfloat16 else 1e-6
    for row, (s, e_max) in enumerate(bounds):
        score_tol = 1e-4 * (1 + s)
        got = out[row].double()
        if row in invalid_rows:
            assert (got == 0).all(), f"row {row}: an invalid row is zeroed"
            assert torch.isnan(lse[row]).all(), f"row {row}: an invalid row's lse is NaN"
            continue
        tol = relative * want_out[row].abs() + score_tol * e_max
        assert ((got - want_out[row]).abs() <= tol).all(), f"row {row}: out"
        want = want_lse[row]
        finite = torch.isfinite(want)
        assert torch.equal(lse[row][~finite].double(), want[~finite]), f"row {row}: lse"
        assert ((lse[row][finite].double() - want[finite]).abs() <= score_tol).all(), f"row {row}"


@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("with_sink", [True, False])
def test_sparse_decode_matches_the_reference(device, heads, out_dtype, with_sink):
    g = ref.generator(41)
    block_size, length = 64, 128 + 160
    cache, decoded = stored_entries(600, block_size, g)
    num_slots = decoded.shape[0]
    n = 5
    indices = torch.randint(0, num_slots, (n, length), generator=g, dtype=torch.int32)
    indices[1, 100:] = -1  # a shorter list
    indices[2, ::3] = -1  # holes
    indices[3] = -1  # an empty list
    q = (torch.randn(n, heads, 512, generator=g) * 2).to(torch.bfloat16)
    q[4, 7, 300] = NAN  # counted, zeroed
    sink = torch.randn(heads, generator=g) if with_sink else None
    out = torch.full((n, heads, 512), NAN, dtype=out_dtype)
    lse = torch.full((n, heads), 12345.0)
    count = counter("cpu")
    got_out, got_lse = hdk.dsv4.sparse_decode(
        q, cache, block_size, indices, sink=sink, out=out, lse=lse, invalid_count=count
    )
    assert got_out is out and got_lse is lse
    assert int(count.item()) == 3 + 1
    expected = reference_attention(q, decoded, indices, sink, 512**-0.5)
    check_attention(out, lse, expected, invalid_rows={4})
    assert (out[3] == 0).all()
    assert torch.equal(lse[3], sink if with_sink else torch.full((heads,), -INF))


def test_sparse_decode_empty_lists_scale_and_allocated_outputs(device):
    g = ref.generator(42)
    block_size = 16
    cache, decoded = stored_entries(64, block_size, g)
    q = torch.randn(3, 8, 512, generator=g)  # fp32 q: fp32 out
    indices = torch.randint(0, 64, (3, 40), generator=g)  # int64 indices
    indices[0] = -1
    sink = torch.tensor([0.5, -1.0, 2.0, -INF, 0.0, 1.0, 3.0, -2.0])
    out, lse = hdk.dsv4.sparse_decode(q, cache, block_size, indices, sink=sink, scale=0.03)
    assert out.dtype == torch.float32 and out.shape == (3, 8, 512) and lse.shape == (3, 8)
    check_attention(out, lse, reference_attention(q, decoded, indices, sink, 0.03), set())
    assert (out[0] == 0).all() and torch.equal(lse[0], sink)

    empty = torch.empty(3, 0, dtype=torch.int32)  # L = 0, no sink
    out, none = hdk.dsv4.sparse_decode(q, cache, block_size, empty, return_lse=False)
    assert none is None and (out == 0).all()
    _, lse = hdk.dsv4.sparse_decode(q, cache, block_size, empty)
    assert (lse == -INF).all()


def test_sparse_decode_extra_list_over_a_second_cache(device):
    """The SWA ring in its own tensor (pages of 128, KVCacheManager's layout) next to the
    compressed pool (pages of 64): one softmax over both lists."""
    g = ref.generator(43)
    cache, decoded = stored_entries(256, 64, g)
    swa, swa_decoded = stored_entries(3 * 128, 128, g)
    n, heads = 3, 64
    indices = torch.randint(0, 256, (n, 96), generator=g, dtype=torch.int32)
    swa_indices = torch.randint(0, 3 * 128, (n, 128), generator=g, dtype=torch.int32)
    indices[1] = -1  # only the SWA list
    swa_indices[2, 50:] = -1
    q = torch.randn(n, heads, 512, generator=g).to(torch.bfloat16)
    sink = torch.randn(heads, generator=g)
    out, lse = hdk.dsv4.sparse_decode(
        q,
        cache,
        64,
        indices,
        extra_cache=swa,
        extra_block_size=128,
        extra_indices=swa_indices,
        sink=sink,
    )
    # The reference over one list: the second cache's entries appended after the first's.
    both = torch.cat([decoded, swa_decoded])
    joined = torch.cat([indices, torch.where(swa_indices >= 0, swa_indices + 256, swa_indices)], 1)
    check_attention(out, lse, reference_attention(q, both, joined, sink, 512**-0.5), set())
    with pytest.raises(hdk.HdkError, match="'extra_cache' and 'extra_indices' go together"):
        hdk.dsv4.sparse_decode(q, cache, 64, indices, extra_cache=swa, extra_block_size=128)


# ---- errors and CUDA ------------------------------------------------------------------------


def small_problem(device="cpu"):
    g = ref.generator(51)
    key_cache = torch.zeros(4, 16 * 68, dtype=torch.uint8, device=device)
    cache = torch.zeros(4, 16 * 584, dtype=torch.uint8, device=device)
    index_args = dict(
        q=torch.randn(2, 64, 128, generator=g).to(device),
        weights=torch.rand(2, 64, generator=g).to(device),
        key_cache=key_cache,
        block_size=16,
        block_table=torch.zeros(2, 2, dtype=torch.int32, device=device),
        num_entries=torch.tensor([3, 20], dtype=torch.int32, device=device),
        top_k=8,
    )
    decode_args = dict(
        q=torch.randn(2, 64, 512, generator=g).to(torch.bfloat16).to(device),
        cache=cache,
        block_size=16,
        indices=torch.tensor([[0, 5, -1], [63, 1, 2]], dtype=torch.int32, device=device),
    )
    return index_args, decode_args


def test_errors_name_the_argument():
    index_args, decode_args = small_problem()
    bad = dict(index_args, weights=torch.rand(2, 32))
    with pytest.raises(hdk.HdkError, match="'weights'"):
        hdk.dsv4.index_topk(**bad)
    with pytest.raises(hdk.HdkError, match="'top_k'"):
        hdk.dsv4.index_topk(**dict(index_args, top_k=0))
    with pytest.raises(hdk.HdkError, match="num_entries"):
        hdk.dsv4.index_topk(**dict(index_args, num_entries=torch.tensor([3, 33])))
    with pytest.raises(hdk.HdkError, match="'q'"):
        hdk.dsv4.sparse_decode(**dict(decode_args, q=torch.randn(2, 64, 256)))
    with pytest.raises(hdk.HdkError, match=r"indices\[0, 0\] = 64 is beyond"):
        hdk.dsv4.sparse_decode(**dict(decode_args, indices=torch.tensor([[64, 0], [0, 0]])))
    with pytest.raises(hdk.HdkError, match="'sink'"):
        hdk.dsv4.sparse_decode(**decode_args, sink=torch.zeros(63))
    with pytest.raises(TypeError, match="'sink'"):
        hdk.dsv4.sparse_decode(**decode_args, sink=[0.0] * 64)
    with pytest.raises(hdk.HdkError, match="key format"):
        hdk.dsv4.index_topk(**index_args, format="fp6")
    # Nothing written before an error: the output stays poisoned.
    out = torch.full((2, 64, 512), 7.0, dtype=torch.bfloat16)
    with pytest.raises(hdk.HdkError):
        hdk.dsv4.sparse_decode(
            **dict(
                decode_args,
                indices=torch.tensor([[0, 64]], dtype=torch.int32).repeat(2, 1),
            ),
            out=out,
        )
    assert (out == 7).all()


def test_ops_are_registered():
    for name in ("dsv4_index_topk", "dsv4_sparse_decode"):
        assert hasattr(torch.ops.hdk, name)


@needs_cuda
def test_cuda_matches_the_cpu():
    """The ops on CUDA tensors against the CPU backend on the same stored bytes (the C++ tests
    check the CUDA kernels against the float64 reference case by case)."""
    g = ref.generator(55)
    counts = [0, 7, 300, 1000]
    key_cache, block_table, _ = stored_keys(counts, 16, "mxfp4", g)
    q = torch.randn(4, 64, 128, generator=g).to(torch.bfloat16)
    weights = torch.rand(4, 64, generator=g) * 0.02
    num_entries = torch.tensor(counts, dtype=torch.int32)
    want_slots = torch.empty(4, 64, dtype=torch.int32)
    want_indices, want_scores = hdk.dsv4.index_topk(
        q, weights, key_cache, 16, block_table, num_entries, 64, topk_slots=want_slots
    )
    slots = torch.empty(4, 64, dtype=torch.int32, device="cuda")
    indices, scores = hdk.dsv4.index_topk(
        q.cuda(),
        weights.cuda(),
        key_cache.cuda(),
        16,
        block_table.cuda(),
        num_entries.cuda(),
        64,
        topk_slots=slots,
    )
    assert torch.equal(indices.cpu() < 0, want_indices < 0)
    assert torch.allclose(scores.cpu(), want_scores, rtol=1e-4, atol=1e-6)
    pages = block_table.long().gather(1, indices.cpu().clamp(min=0).long() // 16)
    assert torch.equal(
        slots.cpu().long(), torch.where(indices.cpu() >= 0, pages * 16 + indices.cpu() % 16, -1)
    )

    cache, _ = stored_entries(600, 64, g)
    entry_list = torch.randint(0, 600, (5, 200), generator=g, dtype=torch.int32)
    entry_list[3] = -1
    sink = torch.randn(64, generator=g)
    q = torch.randn(5, 64, 512, generator=g).to(torch.bfloat16)
    want_out, want_lse = hdk.dsv4.sparse_decode(q, cache, 64, entry_list, sink=sink)
    out, lse = hdk.dsv4.sparse_decode(
        q.cuda(), cache.cuda(), 64, entry_list.cuda(), sink=sink.cuda()
    )
    scale = want_out.float().abs().max()
    assert ((out.cpu().float() - want_out.float()).abs() <= 2.0**-7 * scale).all()
    assert torch.allclose(lse.cpu(), want_lse, rtol=1e-4, atol=1e-4)


def test_reference_is_a_softmax_with_sink():
    """The test's own reference, on numbers worked by hand: two entries and a sink."""
    e = torch.zeros(2, 512, dtype=torch.float64)
    e[0, 0], e[1, 1] = 1.0, 2.0
    q = torch.zeros(1, 1, 512)
    q[0, 0, 0], q[0, 0, 1] = 1.0, 1.0
    out, lse, _ = reference_attention(q, e, torch.tensor([[0, 1]]), torch.tensor([0.0]), 1.0)
    total = math.e + math.e**2 + 1.0
    assert math.isclose(float(lse[0, 0]), math.log(total))
    assert math.isclose(float(out[0, 0, 0]), math.e / total)
    assert math.isclose(float(out[0, 0, 1]), 2 * math.e**2 / total)
