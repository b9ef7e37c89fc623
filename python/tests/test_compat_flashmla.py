"""hdk.compat.flashmla: FlashMLA's sparse MODEL1 decode call form against a float64 reference
with FlashMLA's conventions (the sink scales the output and stays out of softmax_lse, +inf lse
for an empty list, lse as [b, h_q, s_q]), on caches written by hdk.dsv4.store_entries and read
through FlashMLA's (num_blocks, page_block_size, 1, 584) view, with padded block pitches, a
separate SWA cache (extra_k_cache) and per-request list lengths."""

import inspect

import pytest
import torch

import dsv4_kv_reference as ref
import hdk
from hdk.compat.flashmla import flash_mla_with_kvcache, get_mla_metadata
from test_dsv4_attention import reference_attention, stored_entries

INF = float("inf")


def flashmla_view(pages, block_size, pitch=None, device="cpu"):
    """hdk's [num_blocks, block_size * 584] pages as FlashMLA's (num_blocks, block_size, 1, 584)
    tensor, the blocks `pitch` bytes apart (FlashMLA pads blocks to a multiple of 576).
    """
    num_blocks = pages.shape[0]
    pitch = pitch or block_size * 584
    storage = torch.full((num_blocks, pitch), 0x77, dtype=torch.uint8)
    storage[:, : block_size * 584] = pages
    storage = storage.to(device)
    return storage.as_strided((num_blocks, block_size, 1, 584), (pitch, 584, 584, 1))


def flashmla_reference(q, decoded, indices, sink, scale):
    """FlashMLA's out and lse from the float64 softmax without a sink."""
    n, heads = q.shape[0], q.shape[1]
    out, lse, _ = reference_attention(q, decoded, indices, None, scale)
    if sink is not None:
        out = out * torch.sigmoid(lse - sink.double()).unsqueeze(-1)
    lse = torch.where(lse == -INF, torch.full_like(lse, INF), lse)
    return out, lse


def test_signature_follows_flashmla():
    assert list(inspect.signature(flash_mla_with_kvcache).parameters) == [
        "q",
        "k_cache",
        "block_table",
        "cache_seqlens",
        "head_dim_v",
        "tile_scheduler_metadata",
        "num_splits",
        "softmax_scale",
        "causal",
        "is_fp8_kvcache",
        "indices",
        "attn_sink",
        "extra_k_cache",
        "extra_indices_in_kvcache",
        "topk_length",
        "extra_topk_length",
    ]


@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("with_sink", [True, False])
def test_sparse_decode_with_an_extra_swa_cache(device, heads, with_sink):
    g = ref.generator(61)
    batch, tokens, topk, window = 3, 2, 96, 128
    compressed, compressed_decoded = stored_entries(320, 64, g)
    swa, swa_decoded = stored_entries(batch * window, window, g)
    indices = torch.randint(0, 320, (batch, tokens, topk), generator=g, dtype=torch.int32)
    swa_indices = torch.randint(
        0, batch * window, (batch, tokens, window), generator=g, dtype=torch.int32
    )
    indices[0, 1, ::5] = -1
    topk_length = torch.tensor([topk, 40, 0], dtype=torch.int32)  # request 2: no compressed list
    swa_length = torch.tensor([window, window, 17], dtype=torch.int32)
    q = torch.randn(batch, tokens, heads, 512, generator=g).to(torch.bfloat16)
    sink = torch.randn(heads, generator=g) if with_sink else None
    metadata, none = get_mla_metadata(torch.zeros(batch, dtype=torch.int32), tokens * heads, 1)
    assert none is None

    out, lse = flash_mla_with_kvcache(
        q.to(device),
        flashmla_view(compressed, 64, pitch=64 * 584 + 576, device=device),
        None,
        None,
        512,
        metadata,
        is_fp8_kvcache=True,
        indices=indices.to(device),
        attn_sink=None if sink is None else sink.to(device),
        extra_k_cache=flashmla_view(swa, window, device=device),
        extra_indices_in_kvcache=swa_indices.to(device),
        topk_length=topk_length.to(device),
        extra_topk_length=swa_length.to(device),
    )
    out, lse = out.cpu(), lse.cpu()
    assert out.shape == (batch, tokens, heads, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (batch, heads, tokens) and lse.dtype == torch.float32

    # The reference over one list: the SWA entries after the compressed ones, lengths applied.
    masked = indices.clone()
    for b in range(batch):
        masked[b, :, topk_length[b] :] = -1
    masked_swa = swa_indices.clone()
    for b in range(batch):
        masked_swa[b, :, swa_length[b] :] = -1
    shifted = torch.where(masked_swa >= 0, masked_swa + 320, masked_swa)
    joined = torch.cat([masked, shifted], dim=2).reshape(batch * tokens, -1)
    decoded = torch.cat([compressed_decoded, swa_decoded])
    want_out, want_lse = flashmla_reference(
        q.reshape(batch * tokens, heads, 512), decoded, joined, sink, 512**-0.5
    )
    got_out = out.reshape(batch * tokens, heads, 512).double()
    got_lse = lse.transpose(1, 2).reshape(batch * tokens, heads).double()
    # CUDA's tensor-core kernel also rounds the softmax weights to bf16 (2^-8 max |E|).
    rounding = 2.0**-8 * float(decoded.abs().max()) if device == "cuda" else 0.0
    assert ((got_out - want_out).abs() <= 2.0**-8 * want_out.abs() + 1e-3 + rounding).all()
    assert ((got_lse - want_lse).abs() <= 1e-3 * (1 + want_lse.abs())).all()


def test_empty_lists_get_zero_and_infinite_lse(device):
    g = ref.generator(62)
    cache, _ = stored_entries(64, 16, g)
    q = torch.randn(2, 1, 8, 512, generator=g).to(torch.bfloat16)
    indices = torch.full((2, 1, 10), -1, dtype=torch.int32)
    indices[1, 0, :4] = torch.tensor([3, 9, 60, 1], dtype=torch.int32)
    sink = torch.randn(8, generator=g)
    out, lse = flash_mla_with_kvcache(
        q.to(device),
        flashmla_view(cache, 16, device=device),
        None,
        None,
        512,
        None,
        None,
        None,
        False,
        True,
        indices.to(device),
        sink.to(device),
    )
    out, lse = out.cpu(), lse.cpu()
    assert (out[0] == 0).all() and (lse[0] == INF).all()
    assert torch.isfinite(lse[1]).all() and (out[1] != 0).any()


def test_unsupported_forms_raise():
    g = ref.generator(63)
    cache, _ = stored_entries(32, 16, g)
    view = flashmla_view(cache, 16)
    q = torch.randn(1, 1, 64, 512, generator=g).to(torch.bfloat16)
    indices = torch.zeros(1, 1, 4, dtype=torch.int32)
    args = dict(
        q=q,
        k_cache=view,
        block_table=None,
        cache_seqlens=None,
        head_dim_v=512,
        tile_scheduler_metadata=None,
        is_fp8_kvcache=True,
        indices=indices,
    )
    with pytest.raises(NotImplementedError, match="dense MLA decode"):
        flash_mla_with_kvcache(**dict(args, indices=None))
    with pytest.raises(NotImplementedError, match="576"):
        flash_mla_with_kvcache(**dict(args, q=torch.zeros(1, 1, 64, 576, dtype=torch.bfloat16)))
    with pytest.raises(ValueError, match="causal"):
        flash_mla_with_kvcache(**args, causal=True)
    with pytest.raises(ValueError, match="is_fp8_kvcache"):
        flash_mla_with_kvcache(**dict(args, is_fp8_kvcache=False))
    with pytest.raises(ValueError, match="num_splits"):
        flash_mla_with_kvcache(**args, num_splits=torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="scale"):
        flash_mla_with_kvcache(**args, softmax_scale=0.0)
    with pytest.raises(ValueError, match="go together"):
        flash_mla_with_kvcache(**args, extra_k_cache=view)
    with pytest.raises(ValueError, match="contiguous"):
        flash_mla_with_kvcache(**dict(args, k_cache=view.transpose(0, 1)))
    with pytest.raises(ValueError, match="584"):
        flash_mla_with_kvcache(**dict(args, k_cache=torch.zeros(2, 16, 1, 656, dtype=torch.uint8)))
    with pytest.raises(hdk.HdkError, match="beyond the cache"):
        flash_mla_with_kvcache(**dict(args, indices=torch.full((1, 1, 4), 32, dtype=torch.int32)))
