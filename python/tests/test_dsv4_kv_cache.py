"""hdk.dsv4's KV cache ops against plain float64 torch decoders of the spec's formats, on every
available device: store + gather round trips within the FP8 bound, NaN markers, errors naming the
argument, and blocks_to_reserve."""

import math

import pytest
import torch

import hdk
import hdk.dsv4


def test_store_gather_round_trip_within_fp8_bound(device):
    g = torch.Generator().manual_seed(3)
    n, block_size = 40, 16
    values = (torch.randn(n, 512, generator=g) * 3).to(device)
    slots = torch.randperm(3 * block_size, generator=g)[:n].to(device)
    cache = torch.full((3, block_size * 584), 0x5A, dtype=torch.uint8, device=device)
    hdk.dsv4.store_entries(values, slots, cache, block_size)
    out = hdk.dsv4.gather_entries(cache, block_size, slots.view(1, n))[0].cpu().double()
    x = values.cpu().double()
    nope, rope = x[:, :448], x[:, 448:]
    amax = nope.view(n, 7, 64).abs().amax(-1).clamp(min=1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448))).repeat_interleave(64, dim=1)
    bound = nope.abs() / 16 + scale / 1024
    assert ((out[:, :448] - nope).abs() <= bound).all()
    assert ((out[:, 448:] - rope).abs() <= rope.abs() / 256).all()
    # The scale bytes are UE8M0 of the group scales, the pad byte zero.
    page, offset = slots.cpu() // block_size, slots.cpu() % block_size
    scales = torch.stack([cache.cpu()[p, block_size * 576 + o * 8: block_size * 576 + o * 8 + 8]
                          for p, o in zip(page.tolist(), offset.tolist())])
    assert torch.equal(scales[:, :7].double() - 127, torch.log2(scale[:, ::64]))
    assert (scales[:, 7] == 0).all()


def test_nan_marks_the_group_and_counts(device):
    values = torch.randn(2, 512, device=device)
    values[1, 70] = float("nan")
    cache = torch.zeros((1, 4 * 584), dtype=torch.uint8, device=device)
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    slots = torch.tensor([0, 2], device=device)
    hdk.dsv4.store_entries(values, slots, cache, 4, invalid_count=counter)
    assert int(counter.item()) == 1
    out = hdk.dsv4.gather_entries(cache, 4, slots.view(1, 2))[0].cpu()
    assert torch.isnan(out[1, 64:128]).all() and not torch.isnan(out[0]).any()
    assert not torch.isnan(out[1, :64]).any()


def test_indexer_keys_round_trip(device):
    g = torch.Generator().manual_seed(5)
    keys = torch.randn(8, 128, generator=g).to(device)
    slots = torch.arange(8, device=device)
    for fmt in ("mxfp4", "nvfp4"):
        cache = torch.zeros((2, 4 * hdk.dsv4.KEY_BYTES[fmt]), dtype=torch.uint8, device=device)
        hdk.dsv4.store_indexer_keys(keys, slots, cache, 4, format=fmt, rotate=False)
        out = hdk.dsv4.gather_indexer_keys(cache, 4, slots.view(1, 8), format=fmt)[0].cpu()
        x = keys.cpu()
        amax = x.abs().amax(-1, keepdim=True)
        assert ((out - x).abs() <= 0.25 * torch.maximum(amax / 3, x.abs()) + 1e-6).all()


def test_errors_name_the_argument():
    values = torch.zeros(2, 448)
    cache = torch.zeros((1, 4 * 584), dtype=torch.uint8)
    with pytest.raises(hdk.HdkError, match="argument 'values' must have shape"):
        hdk.dsv4.store_entries(values, torch.tensor([0, 1]), cache, 4)
    with pytest.raises(hdk.HdkError, match="slots\\[1\\] = 9 is beyond the cache"):
        hdk.dsv4.store_entries(torch.zeros(2, 512), torch.tensor([0, 9]), cache, 4)


def test_blocks_to_reserve():
    assert hdk.dsv4.blocks_to_reserve(4, 64, 0, 4) == 1
    assert hdk.dsv4.blocks_to_reserve(128, 1, 0, 384) == 3
    assert hdk.dsv4.blocks_to_reserve(4, 64, 4, 256) == 0
