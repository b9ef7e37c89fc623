"""The plain PyTorch peers of bench/dsv4_vs_torch.py (hdk.bench.dsv4_kv_torch) against hdk: the
same store bytes and gathered values exactly, and compressor entries within the FP8 / FP4 bounds
of the float64 oracle, so the benchmark compares like with like."""

import pytest
import torch

import dsv4_kv_reference as ref
import hdk.dsv4
from hdk.bench import dsv4_kv_torch as peer
from test_dsv4_kv_cache import hard_rows, POISON


def test_store_and_gather_match_hdk(device):
    g = ref.generator(61)
    n, block_size, blocks = 36, 8, 6
    values = hard_rows(n, 512, g).to(device)
    slots = torch.randperm(blocks * block_size, generator=g)[:n].to(device)
    ours = torch.full((blocks, block_size * 584), POISON, dtype=torch.uint8, device=device)
    theirs = ours.clone()
    hdk.dsv4.store_entries(values, slots, ours, block_size)
    peer.store_entries(values, slots, theirs, block_size)
    assert torch.equal(ours.cpu(), theirs.cpu())
    read = torch.cat([slots, torch.tensor([-1, -3], device=device)]).view(2, 19)
    want = hdk.dsv4.gather_entries(ours, block_size, read)
    got = peer.gather_entries(theirs, block_size, read)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0))


def test_mxfp4_keys_match_hdk(device):
    g = ref.generator(62)
    keys = hard_rows(20, 128, g).to(device)
    slots = torch.arange(20, device=device)
    ours = torch.full((5, 4 * 68), POISON, dtype=torch.uint8, device=device)
    theirs = ours.clone()
    hdk.dsv4.store_indexer_keys(keys, slots, ours, 4, rotate=False)
    packed, scales = peer.encode_mxfp4_keys(keys)
    peer._scatter(theirs, 4, slots, packed, scales, peer.KEY_DATA_BYTES)
    assert torch.equal(ours.cpu(), theirs.cpu())


@pytest.mark.parametrize("ratio,dim", [(4, 512), (4, 128), (8, 512)])
def test_compressor_chain_within_bound_of_the_oracle(device, ratio, dim):
    g = ref.generator(63 + ratio + dim)
    rows, block_size, steps = 3, 2, 6 * ratio
    width = (2 if ratio == 4 else 1) * dim
    entries = steps // ratio
    pages = -(-entries // block_size)
    table = torch.arange(rows * pages, dtype=torch.int32).view(rows, pages).to(device)
    entry_bytes = 584 if dim == 512 else 68
    cache = torch.full(
        (rows * pages + 1, block_size * entry_bytes), POISON, dtype=torch.uint8, device=device
    )
    chain = peer.Compressor(ratio, dim, rows, device)
    oracle = ref.Compressor(ratio, dim)
    ape, norm = torch.randn(ratio, width, generator=g), torch.rand(dim, generator=g) + 0.5
    cos, sin = ref.rope_tables(steps + ratio, g)
    slots = torch.tensor([2, 0, 1])
    expected = {}
    for step in range(steps):
        kv, score = torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)
        positions = torch.full((rows,), step)
        chain(
            kv.to(device),
            score.to(device),
            ape.to(device),
            positions.to(device),
            slots.to(device),
            norm.to(device),
            cos.to(device),
            sin.to(device),
            table,
            cache,
            block_size,
        )
        for row, index, value in oracle.run(kv, score, ape, positions, slots, norm, cos, sin):
            expected[(row, index)] = value
    assert len(expected) == rows * entries
    host = cache.cpu()
    for (row, index), value in expected.items():
        slot = int(table[row, index // block_size]) * block_size + index % block_size
        image = ref.read(host, block_size, slot, entry_bytes, 576 if dim == 512 else 64)
        ref.check_entry(image, value)
