"""The CPU-testable half of bench/dsv4_vs_peers.py (hdk.bench.dsv4_peers): that FlashMLA's and
DeepGEMM's views of hdk's pages are the same memory and read the same values hdk decodes (their
kernels' address arithmetic re-done here in torch), FlashMLA's lse without the sink turned into
hdk's, vLLM's E4M3 indexer query, and that the script starts (--help) and stops with a clear
message without a GPU or the peers. The peers themselves need a GPU (scripts/peers/dsv4.sh)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hdk
import hdk.dsv4
from hdk.bench import dsv4_peers as peers

ROOT = Path(__file__).resolve().parents[2]
E4M3 = getattr(torch, "float8_e4m3fn", None)


def flashmla_read(view, slot):
    """Entry `slot` of a (num_blocks, block_size, 1, 584) cache the way FlashMLA's SM90 MODEL1
    decode reads it (csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh): data at block * stride(0) +
    i * 576 (448 E4M3 codes, 64 bf16), 8 UE8M0 scale bytes at block * stride(0) + block_size *
    576 + i * 8 (the first 7 used, one per 64 codes). Returns the 512 values in fp32."""
    block_size, pitch = view.shape[1], view.stride(0)
    block, i = divmod(slot, block_size)
    flat = view.as_strided((view.shape[0] * pitch,), (1,), view.storage_offset())
    base = block * pitch
    data = flat[base + i * 576 : base + (i + 1) * 576]
    scales = flat[base + block_size * 576 + i * 8 : base + block_size * 576 + i * 8 + 7]
    nope = peers.decode_e4m3(data[:448]).view(7, 64) * torch.exp2(scales.float() - 127).view(7, 1)
    rope = data[448:].clone().view(torch.bfloat16).float()
    return torch.cat([nope.reshape(448), rope])


@pytest.mark.parametrize("pad", [0, 576 * 3 - 584])
def test_flashmla_view_is_hdks_model1_pages(pad):
    g = torch.Generator().manual_seed(5)
    block_size, num_blocks = 16, 3
    pitch = block_size * 584 + pad  # pad: vLLM's blocks padded to a multiple of 576 bytes
    storage = torch.full((num_blocks, pitch), 0x33, dtype=torch.uint8)
    pages = storage[:, : block_size * 584]
    values = torch.randn(num_blocks * block_size, 512, generator=g) * 3
    slots = torch.randperm(num_blocks * block_size, generator=g)
    hdk.dsv4.store_entries(values, slots, pages, block_size)
    view = peers.flashmla_cache_view(pages, block_size)
    assert tuple(view.shape) == (num_blocks, block_size, 1, 584)
    assert view.stride(1) == 584 and view.stride(3) == 1 and view.stride(0) == pitch
    assert view.data_ptr() == pages.data_ptr()
    read = torch.arange(num_blocks * block_size)
    decoded = hdk.dsv4.gather_entries(pages, block_size, read.view(1, -1))[0]
    for slot in read.tolist():
        assert torch.equal(flashmla_read(view, slot), decoded[slot]), slot


def test_flashmla_view_rejects_other_shapes():
    with pytest.raises(ValueError):
        peers.flashmla_cache_view(torch.zeros(2, 64 * 584 + 8, dtype=torch.uint8), 64)
    with pytest.raises(ValueError):
        peers.flashmla_cache_view(torch.zeros(2, 64 * 584, dtype=torch.int16), 64)


def fp8_page_bytes(codes, scales, block_size):
    """hdk's kFP8 page bytes (include/hdk/dsv4/kv_cache.h) from [blocks, bs, 128] codes and
    [blocks, bs] fp32 scales: the codes of key i at i * 128, its scale at bs * 128 + i * 4."""
    blocks = codes.shape[0]
    return torch.cat(
        [codes.reshape(blocks, block_size * 128), scales.contiguous().view(torch.uint8)], dim=1
    )


def test_deepgemm_view_reads_hdks_fp8_page_layout():
    g = torch.Generator().manual_seed(6)
    blocks, block_size = 3, 64
    codes = torch.randint(0, 256, (blocks, block_size, 128), generator=g).to(torch.uint8)
    scales = torch.exp2(torch.randint(-8, 3, (blocks, block_size), generator=g).float())
    pages = fp8_page_bytes(codes, scales, block_size)
    assert tuple(pages.shape) == (blocks, block_size * 132)
    view = peers.deepgemm_cache_view(pages, block_size)
    assert tuple(view.shape) == (blocks, block_size, 1, 132)
    assert view.stride(1) == 132 and view.stride(3) == 1 and view.stride(0) % 4 == 0
    assert view.data_ptr() == pages.data_ptr()
    got_codes, got_scales = peers.deepgemm_codes_and_scales(view)
    assert torch.equal(got_codes, codes) and torch.equal(got_scales, scales)
    # Views, not copies: a write through DeepGEMM's split shows in hdk's page.
    got_scales[1, 5] = 0.125
    assert pages[1, block_size * 128 + 20 : block_size * 128 + 24].view(torch.float32) == 0.125


def fp8_format_supported():
    try:
        hdk.dsv4.store_indexer_keys(
            torch.zeros(1, 128),
            torch.zeros(1, dtype=torch.int64),
            torch.zeros(1, 64 * 132, dtype=torch.uint8),
            64,
            format="fp8",
            rotate=False,
        )
        return True
    except (hdk.HdkError, TypeError, ValueError, RuntimeError):
        return False


def test_deepgemm_keys_are_hdks_fp8_keys():
    if not fp8_format_supported():
        pytest.skip("this hdk build has no format='fp8' indexer keys yet")
    g = torch.Generator().manual_seed(7)
    blocks, block_size = 4, 64
    keys = torch.randn(blocks * block_size, 128, generator=g) * torch.exp2(
        torch.randint(-6, 6, (blocks * block_size, 1), generator=g).float()
    )
    slots = torch.randperm(blocks * block_size, generator=g)
    pages = torch.zeros(blocks, block_size * 132, dtype=torch.uint8)
    hdk.dsv4.store_indexer_keys(keys, slots, pages, block_size, format="fp8", rotate=False)
    theirs = peers.deepgemm_keys(peers.deepgemm_cache_view(pages, block_size))
    read = torch.arange(blocks * block_size).view(1, -1)
    ours = hdk.dsv4.gather_indexer_keys(pages, block_size, read, format="fp8")[0]
    assert torch.equal(theirs.reshape(-1, 128), ours)


def test_e4m3_decode_matches_torch():
    codes = torch.arange(256, dtype=torch.int64).to(torch.uint8)
    if E4M3 is not None:
        want = codes.view(E4M3).float()
        got = peers.decode_e4m3(codes)
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert torch.equal(got.nan_to_num(), want.nan_to_num())
    assert float(peers.decode_e4m3(torch.tensor([0x7E], dtype=torch.uint8))) == 448.0
    assert float(peers.decode_e4m3(torch.tensor([0x01], dtype=torch.uint8))) == 2.0**-9


def test_lse_with_sink_is_hdks_lse():
    g = torch.Generator().manual_seed(8)
    b, h, s_q = 3, 4, 2
    lse = torch.randn(b, s_q, h, generator=g)  # FlashMLA's storage: [b, s_q, h_q] ...
    lse[1, 0] = float("inf")  # ... an empty list: +inf (FlashMLA's value)
    sink = torch.randn(h, generator=g)
    got = peers.lse_with_sink(lse.transpose(1, 2), sink)  # ... returned as [b, h_q, s_q]
    want = torch.logaddexp(lse.reshape(b * s_q, h), sink.expand(b * s_q, h))
    want[2] = sink  # row b = 1, s_q = 0: only the sink
    assert got.shape == (b * s_q, h)
    assert torch.allclose(got, want)
    no_sink = peers.lse_with_sink(lse.transpose(1, 2), None)
    assert torch.isneginf(no_sink[2]).all()


@pytest.mark.skipif(E4M3 is None, reason="this torch has no float8_e4m3fn")
def test_e4m3_query_folds_its_scale_into_the_weights():
    g = torch.Generator().manual_seed(9)
    q = (torch.randn(5, 64, 128, generator=g) * 10).to(torch.bfloat16)
    weights = torch.randn(5, 64, generator=g)
    codes, folded = peers.quantize_q_e4m3(q, weights)
    assert codes.dtype == E4M3 and folded.dtype == torch.float32
    scale = folded / (weights * 128**-0.5 * 64**-0.5)
    assert torch.allclose(torch.exp2(torch.round(torch.log2(scale))), scale)  # powers of two
    back = codes.float() * scale.unsqueeze(-1)
    assert (
        (back - q.float()).abs() <= q.float().abs() * 2.0**-4 + scale.unsqueeze(-1) * 2.0**-9
    ).all()
    assert codes.float().abs().amax() <= 448
    keys = torch.randn(7, 128, generator=g)
    exact = (torch.relu(q.float() @ keys.T) * (weights * 128**-0.5 * 64**-0.5).unsqueeze(-1)).sum(1)
    theirs = (torch.relu(codes.float() @ keys.T) * folded.unsqueeze(-1)).sum(1)
    assert torch.allclose(theirs, exact, rtol=0.1, atol=0.05 * float(exact.abs().max()))


def test_missing_peers_are_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("HDK_DSV4_PEERS_DIR", str(tmp_path))
    for load, name in ((peers.load_flashmla, "flash_mla"), (peers.load_deepgemm, "deep_gemm")):
        module, why = load()
        if module is not None:
            pytest.skip(f"{name} is importable here")
        assert name in why and "dsv4.sh" in why


def run_script(*args):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(Path(hdk.__file__).resolve().parents[1])] + sys.path[1:]
    )
    return subprocess.run(
        [sys.executable, str(ROOT / "bench" / "dsv4_vs_peers.py"), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        timeout=120,
    )


def test_script_help():
    result = run_script("--help")
    assert result.returncode == 0, result.stderr
    for option in (
        "--json",
        "--ops",
        "--N",
        "--iters",
        "--entries",
        "--lists",
        "--index-peer",
        "--flush-code",
    ):
        assert option in result.stdout


def test_script_without_a_gpu_says_so():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = run_script("--ops", "sparse", "--N", "1")
    assert result.returncode != 0
    assert "CUDA" in result.stderr


def test_script_rejects_unknown_cases():
    result = run_script("--ops", "dense")
    assert result.returncode == 2 and "--ops" in result.stderr


def skip_without_fp8_keys():
    """The index cell needs torch's float8_e4m3fn and hdk's format='fp8' indexer keys."""
    if E4M3 is None:
        pytest.skip("this torch has no float8_e4m3fn")
    if not fp8_format_supported():
        pytest.skip("this hdk build has no format='fp8' indexer keys yet")


def bench_module():
    """bench/dsv4_vs_peers.py as a module (bench/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "dsv4_vs_peers", ROOT / "bench" / "dsv4_vs_peers.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sparse_cell_through_flashmlas_signature():
    """The benchmark's FlashMLA call (vLLM's form: SWA ring as k_cache, the compressed list as
    extra_k_cache, lengths, sink, a fresh or reused plan) run through hdk.compat.flashmla, which
    takes FlashMLA's exact signature and conventions, and checked the way the benchmark checks
    FlashMLA: the same out, and hdk's lse = logaddexp(FlashMLA's lse, sink)."""
    from hdk.compat import flashmla as stand_in

    bench = bench_module()
    torch.manual_seed(3)
    for heads, csa in ((64, True), (128, False)):
        cell = bench.SparseCell(stand_in, heads, 16, csa, 2, "cpu")
        assert cell.peer.k_cache.shape == (2, 128, 1, 584)
        assert cell.peer.extra_k_cache.shape[1:] == (bench.BLOCK_SIZE, 1, 584)
        assert cell.peer.indices.shape == (2, 1, 128) and cell.peer.extra_indices.shape == (
            2,
            1,
            16,
        )
        out_diff, lse_diff, out_max = cell.check()
        assert out_diff <= 2.0**-7 * max(1.0, out_max) and lse_diff <= 1e-4
        out, _ = cell.peer.call(fresh_plan=False)
        assert out.shape == (2, 1, heads, 512)


class FakeDeepGEMM:
    """DeepGEMM's two calls in torch, by its definition (README, csrc/apis/attention.hpp):
    logits[n, s] = sum_h relu(q[n, h] . codes[s]) * w[n, h] * scale[s] over the row's pages."""

    @staticmethod
    def get_num_sms():
        return 4

    @staticmethod
    def get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms):
        assert context_lens.dim() == 2 and context_lens.dtype == torch.int32 and block_kv == 64
        return torch.zeros(num_sms + 1, 2, dtype=torch.int32)

    @staticmethod
    def fp8_paged_mqa_logits(q, kv, weights, lens, table, meta, max_len, clean):
        assert q.dtype == E4M3 and q.dim() == 4 and q.shape[1] == 1 and not clean
        assert kv.dtype == torch.uint8 and kv.shape[1:] == (64, 1, 132) and kv.stride(1) == 132
        keys = peers.deepgemm_keys(kv)  # [blocks, 64, 128]
        rows = []
        for n in range(q.shape[0]):
            k = keys[table[n].long()].reshape(-1, 128)[: int(lens[n, 0])]
            s = torch.relu(q[n, 0].float() @ k.T) * weights[n].unsqueeze(-1)
            rows.append(s.sum(0)[:max_len])
        return torch.stack(rows)


def test_index_cell_through_deepgemms_definition():
    """The benchmark's index cell on the CPU with DeepGEMM replaced by its definition in torch:
    the same bytes (hdk's FP8 pages through DeepGEMM's view), vLLM's E4M3 query, and hdk's FP8
    selection checked against the logits as the benchmark checks it."""
    skip_without_fp8_keys()
    bench = bench_module()
    torch.manual_seed(4)
    cell = bench.IndexCell(FakeDeepGEMM(), 2, 256, 32, "cpu")
    score_diff, score_rel, overlap, overlap_mxfp4 = cell.check()
    assert score_rel <= 1e-5 and overlap >= 0.97
    assert 0 <= overlap_mxfp4 <= 1


def test_index_cell_without_a_peer():
    """--index-peer none: the index cell holds no peer and runs hdk's two columns alone."""
    skip_without_fp8_keys()
    bench = bench_module()
    torch.manual_seed(5)
    cell = bench.IndexCell(None, 2, 256, 32, "cpu")
    assert cell.peer is None
    cell.hdk_fp8()
    cell.hdk_mxfp4()
    assert cell.indices.shape == (2, 32) and cell.mxfp4_indices.shape == (2, 32)
    result = run_script("--index-peer", "nope")
    assert result.returncode == 2 and "--index-peer" in result.stderr
