"""The plain PyTorch peers of bench/dsv4_vs_torch.py --ops attention,indexer
(hdk.bench.dsv4_attention_torch) against hdk: on entries and keys written by
hdk.dsv4.store_entries / store_indexer_keys into shuffled pages, the chain's sparse_decode (one
list, and the SWA ring as a second list over its own tensor) matches hdk.dsv4.sparse_decode, and
its index scores and torch.topk selection match hdk.dsv4.index_topk, within the bounds the
benchmark checks with (the docs' accuracy bounds, plus the bf16 chain's own rounding), so the
benchmark compares like with like."""

import pytest
import torch

import dsv4_kv_reference as ref
import hdk
import hdk.dsv4
from hdk.bench import dsv4_attention_torch as peer


def call_hdk(function, *args, **kwargs):
    """hdk's result; a CUDA case is skipped while hdk's CUDA backend of the read side is absent."""
    try:
        return function(*args, **kwargs)
    except hdk.HdkError as error:
        if "not implemented on CUDA yet" in str(error):
            pytest.skip(str(error))
        raise


def model1_pool(num_blocks, block_size, g, device):
    """A MODEL1 pool of random entries (every slot written by hdk.dsv4.store_entries)."""
    slots = torch.randperm(num_blocks * block_size, generator=g)
    values = torch.randn(slots.numel(), 512, generator=g) * torch.exp2(
        torch.randint(-2, 3, (slots.numel(), 1), generator=g).float()
    )
    cache = torch.full((num_blocks, block_size * 584), 0x5A, dtype=torch.uint8)
    hdk.dsv4.store_entries(values, slots, cache, block_size)
    return cache.to(device)


def random_list(rows, length, slots, g, device, empty_row=None):
    """[rows, length] int32 slots below `slots`, about one in eight negative."""
    lists = torch.randint(0, slots, (rows, length), generator=g)
    lists[torch.rand(rows, length, generator=g) < 0.125] = -1
    if empty_row is not None:
        lists[empty_row] = -1
    return lists.int().to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("extra", [False, True])
@pytest.mark.parametrize("lse_includes_sink", [True, False])
def test_sparse_decode_chain_matches_hdk(device, dtype, extra, lse_includes_sink):
    g = ref.generator(71)
    rows, heads, length, block_size = 4, 16, 96, 16
    cache = model1_pool(8, block_size, g, device)
    indices = random_list(rows, length, 8 * block_size, g, device, empty_row=2 if extra else None)
    kwargs = {}
    if extra:
        # The SWA rings in their own tensor, one page of 128 per request, as KVCacheManager has.
        ring = model1_pool(rows, 128, g, device)
        ring_slots = (torch.arange(rows)[:, None] * 128 + (torch.arange(128) + 37) % 128).int()
        kwargs = dict(extra_cache=ring, extra_block_size=128, extra_indices=ring_slots.to(device))
    q = (torch.randn(rows, heads, 512, generator=g) * 2).to(device=device, dtype=torch.bfloat16)
    sink = (torch.randn(heads, generator=g) * 2).to(device)
    out_dtype = torch.float32 if dtype == torch.float32 else torch.bfloat16
    out = torch.full((rows, heads, 512), float("nan"), dtype=out_dtype, device=device)
    want, want_lse = call_hdk(
        hdk.dsv4.sparse_decode,
        q,
        cache,
        block_size,
        indices,
        sink=sink,
        out=out,
        lse_includes_sink=lse_includes_sink,
        **kwargs,
    )
    got, got_lse = peer.sparse_decode(
        q,
        cache,
        block_size,
        indices,
        sink=sink,
        lse_includes_sink=lse_includes_sink,
        dtype=dtype,
        out_dtype=out_dtype,
        **kwargs,
    )
    out_bound, lse_bound = peer.sparse_decode_bound(
        q,
        cache,
        block_size,
        indices,
        want,
        dtype=dtype,
        out_relative=2.0**-8 if out_dtype == torch.bfloat16 else 1e-6,
        **kwargs,
    )
    error = (got.float() - want.float()).abs()
    assert bool(
        (error <= out_bound).all()
    ), f"worst error / bound {float((error / out_bound).max())}"
    finite = torch.isfinite(want_lse)
    assert torch.equal(finite, torch.isfinite(got_lse))
    assert torch.equal(want_lse[~finite], got_lse[~finite])
    assert bool(((got_lse - want_lse).abs()[finite] <= lse_bound[finite]).all())
    # Not just within the (loose) bound: fp32 agrees to fp32 rounding, bf16 to a few bf16 ulps.
    # On CUDA hdk's tensor-core kernel rounds the softmax weights to bf16 (2^-8 of max |E| in the
    # bound), so there the fp32 chain agrees to bf16 rounding only (H100: 2^-10 of max |o|).
    close = 1e-5 if dtype == torch.float32 and not got.is_cuda else 2.0**-5
    assert float(error.max()) <= close * float(want.float().abs().max())


def key_pool(rows, counts, block_size, g, device):
    """MXFP4 keys written by hdk.dsv4.store_indexer_keys into shuffled pages, a block table
    [rows, max_blocks] (unused columns -1) and num_entries."""
    pages = [-(-c // block_size) for c in counts]
    max_blocks = max(pages) + 1
    num_blocks = sum(pages) + 2
    order = torch.randperm(num_blocks, generator=g).tolist()
    table = torch.full((rows, max_blocks), -1, dtype=torch.int32)
    cache = torch.full((num_blocks, block_size * 68), 0x5A, dtype=torch.uint8)
    for n, count in enumerate(counts):
        owned = [order.pop() for _ in range(pages[n])]
        table[n, : len(owned)] = torch.tensor(owned, dtype=torch.int32)
        slots = torch.tensor(
            [owned[s // block_size] * block_size + s % block_size for s in range(count)]
        )
        keys = torch.randn(count, 128, generator=g)
        hdk.dsv4.store_indexer_keys(keys, slots, cache, block_size)
    return cache.to(device), table.to(device), torch.tensor(counts, dtype=torch.int32).to(device)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("top_k", [16, 300])
def test_index_chain_matches_hdk(device, dtype, top_k):
    g = ref.generator(72 + top_k)
    counts, heads, block_size = [700, 250, 1000, 5], 64, 64
    rows = len(counts)
    cache, table, num_entries = key_pool(rows, counts, block_size, g, device)
    q = torch.randn(rows, heads, 128, generator=g).to(device=device, dtype=torch.bfloat16)
    weights = (torch.randn(rows, heads, generator=g) * 0.1).to(device)
    hdk_slots = torch.full((rows, top_k), 12345, dtype=torch.int32, device=device)
    hdk_indices, hdk_scores = call_hdk(
        hdk.dsv4.index_topk,
        q,
        weights,
        cache,
        block_size,
        table,
        num_entries,
        top_k,
        topk_slots=hdk_slots,
    )
    assert torch.equal(peer.topk_slots(hdk_indices, table, block_size), hdk_slots)
    exact = peer.index_scores(q, weights, cache, block_size, table, num_entries, torch.float32)
    exact_bound = peer.index_score_bound(q, weights, cache, block_size, table, torch.float32)
    # hdk's selection is a top-k of the fp32 chain's scores within hdk's bound (both fp32).
    assert peer.check_selection(hdk_indices, hdk_scores, exact, 2 * exact_bound) is None
    # The chain's own selection (torch.topk), in `dtype`, within its rounding of the same scores.
    indices, scores = peer.index_topk(
        q, weights, cache, block_size, table, num_entries, top_k, dtype
    )
    assert indices.dtype == torch.int32 and indices.shape == (rows, top_k)
    bound = peer.index_score_bound(q, weights, cache, block_size, table, dtype) + exact_bound
    assert peer.check_selection(indices, scores, exact, bound) is None
    # And the two agree on most of the set (near-ties may differ).
    for n, count in enumerate(counts):
        kept = min(top_k, count)
        same = set(indices[n, :kept].tolist()) & set(hdk_indices[n, :kept].tolist())
        assert len(same) >= 0.9 * kept, f"row {n}"


def test_check_selection_catches_a_wrong_top_k():
    scores = torch.tensor([[3.0, 1.0, 2.0, float("-inf")]])
    bound = torch.full_like(scores, 1e-6)
    good_i, good_s = torch.tensor([[0, 2]], dtype=torch.int32), torch.tensor([[3.0, 2.0]])
    assert peer.check_selection(good_i, good_s, scores, bound) is None
    assert "should have been chosen" in peer.check_selection(
        torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([[3.0, 1.0]]), scores, bound
    )
    assert "score" in peer.check_selection(good_i, torch.tensor([[3.0, 2.5]]), scores, bound)
    assert "twice" in peer.check_selection(
        torch.tensor([[0, 0]], dtype=torch.int32), torch.tensor([[3.0, 3.0]]), scores, bound
    )
    padded = peer.check_selection(
        torch.tensor([[0, 2, 1, -1]], dtype=torch.int32),
        torch.tensor([[3.0, 2.0, 1.0, float("-inf")]]),
        scores,
        bound,
    )
    assert padded is None
