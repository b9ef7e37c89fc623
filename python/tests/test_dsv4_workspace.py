"""The optional workspace of hdk.dsv4.index_topk and sparse_decode: the size functions (0 on the
CPU, growing with every argument on CUDA), the argument's validation (dtype, rank, alignment,
too small, wrong type) leaving the outputs untouched, results that are the same bytes with and
without a workspace (a poisoned one included, and under CUDA-graph replay), and the workspace
KVCacheManager owns and passes to its calls."""

import pytest
import torch

import dsv4_kv_reference as ref
import hdk
import hdk.dsv4
from conftest import CUDA_SKIP
from test_dsv4_attention import stored_entries, stored_keys

needs_cuda = pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))


def aligned_workspace(size, device, fill=0xAB):
    """A 256-byte aligned uint8 workspace of `size` bytes filled with `fill` (the CPU allocator
    only promises 64 bytes)."""
    storage = torch.full((size + 256,), fill, dtype=torch.uint8, device=device)
    offset = (-storage.data_ptr()) % 256
    return storage[offset : offset + size]


def problem(device, g):
    """index_topk and sparse_decode arguments over stored keys and entries (4 rows of ragged
    counts; 3 query rows over a compressed list and an SWA-like extra list)."""
    counts = [0, 9, 300, 700]
    key_cache, block_table, _ = stored_keys(counts, 16, "mxfp4", g)
    index_args = dict(
        q=torch.randn(4, 64, 128, generator=g).to(torch.bfloat16),
        weights=torch.rand(4, 64, generator=g) * 0.02,
        key_cache=key_cache,
        block_size=16,
        block_table=block_table,
        num_entries=torch.tensor(counts, dtype=torch.int32),
        top_k=64,
    )
    cache, _ = stored_entries(512, 64, g)
    ring, _ = stored_entries(3 * 128, 128, g)
    indices = torch.randint(0, 512, (3, 200), generator=g, dtype=torch.int32)
    indices[1, 50:] = -1
    decode_args = dict(
        q=torch.randn(3, 64, 512, generator=g).to(torch.bfloat16),
        cache=cache,
        block_size=64,
        indices=indices,
        extra_cache=ring,
        extra_block_size=128,
        extra_indices=torch.arange(3 * 128, dtype=torch.int32).reshape(3, 128),
        sink=torch.randn(64, generator=g),
    )
    return _to(index_args, device), _to(decode_args, device)


def _to(args, device):
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in args.items()}


def run_index(args, **options):
    # Made on the queries' device: a host-to-device copy is not allowed inside graph capture.
    slots = torch.full(
        (args["q"].shape[0], args["top_k"]), -7, dtype=torch.int32, device=args["q"].device
    )
    indices, scores = hdk.dsv4.index_topk(**args, topk_slots=slots, **options)
    return indices, scores, slots


def run_decode(args, **options):
    return hdk.dsv4.sparse_decode(**args, **options)


def assert_same(got, want):
    for g_tensor, w_tensor in zip(got, want):
        assert torch.equal(g_tensor, w_tensor)


# ---- sizes ----------------------------------------------------------------------------------


def test_sizes_are_zero_on_the_cpu():
    for device in ("cpu", torch.device("cpu")):
        for rows, entries in ((0, 0), (1, 65536), (128, 262144)):
            assert hdk.dsv4.index_topk_workspace_bytes(rows, entries, device) == 0
        for rows, heads, length in ((0, 64, 128), (1, 64, 640), (128, 128, 1152)):
            assert hdk.dsv4.sparse_decode_workspace_bytes(rows, heads, length, device) == 0


def test_size_errors_name_the_argument():
    with pytest.raises(hdk.HdkError, match="'num_rows'"):
        hdk.dsv4.index_topk_workspace_bytes(-1, 16, "cpu")
    with pytest.raises(hdk.HdkError, match="'max_entries'"):
        hdk.dsv4.index_topk_workspace_bytes(1, -16, "cpu")
    with pytest.raises(hdk.HdkError, match="'list_length'"):
        hdk.dsv4.sparse_decode_workspace_bytes(1, 64, -1, "cpu")


@needs_cuda
def test_sizes_grow_with_every_argument_on_cuda():
    def index(rows, entries):
        return hdk.dsv4.index_topk_workspace_bytes(rows, entries, "cuda")

    def sparse(rows, heads, length):
        return hdk.dsv4.sparse_decode_workspace_bytes(rows, heads, length, "cuda")

    # One request of a long context is what the workspace is for: it must get one.
    assert index(1, 65536) > 0
    assert sparse(1, 64, 640) > 0
    rows = [1, 2, 3, 8, 64, 65, 128, 512]
    entries = [64, 1024, 16384, 65536, 262144]
    for r0, r1 in zip(rows, rows[1:]):
        for e in entries:
            assert index(r0, e) <= index(r1, e)
    for e0, e1 in zip(entries, entries[1:]):
        for r in rows:
            assert index(r, e0) <= index(r, e1)
    lengths = [128, 640, 1152, 2176, 8320]
    for r0, r1 in zip(rows, rows[1:]):
        for h in (64, 128):
            for length in lengths:
                assert sparse(r0, h, length) <= sparse(r1, h, length)
    for l0, l1 in zip(lengths, lengths[1:]):
        for r in rows:
            assert sparse(r, 64, l0) <= sparse(r, 64, l1)
            assert sparse(r, 64, l0) <= sparse(r, 128, l0)


# ---- the argument ---------------------------------------------------------------------------


def test_workspace_argument_is_validated():
    index_args, decode_args = problem("cpu", ref.generator(71))
    bad = [
        (torch.zeros(1024, dtype=torch.float32), "'workspace'"),
        (aligned_workspace(1024, "cpu").view(4, 256), "'workspace'"),
        (aligned_workspace(1025, "cpu")[1:], "aligned"),
    ]
    for workspace, message in bad:
        out = torch.full((3, 64, 512), 7.0, dtype=torch.bfloat16)
        with pytest.raises(hdk.HdkError, match=message):
            run_decode(decode_args, out=out, workspace=workspace)
        assert (out == 7).all()
        indices = torch.full((4, 64), 5, dtype=torch.int32)
        with pytest.raises(hdk.HdkError, match=message):
            run_index(index_args, topk_indices=indices, workspace=workspace)
        assert (indices == 5).all()
    with pytest.raises(TypeError, match="'workspace'"):
        run_index(index_args, workspace=bytearray(1024))
    with pytest.raises(TypeError, match="'workspace'"):
        run_decode(decode_args, workspace=bytearray(1024))


def test_results_are_the_same_with_and_without_a_workspace_on_the_cpu():
    index_args, decode_args = problem("cpu", ref.generator(72))
    want_index = run_index(index_args)
    want_decode = run_decode(decode_args)
    for fill in (0x00, 0xFF):
        workspace = aligned_workspace(4096, "cpu", fill)
        assert_same(run_index(index_args, workspace=workspace), want_index)
        assert_same(
            run_decode(decode_args, workspace=aligned_workspace(4096, "cpu", fill)), want_decode
        )


@needs_cuda
def test_cuda_workspace_too_small_poisoned_and_replayed():
    index_args, decode_args = problem("cuda", ref.generator(73))
    rows, entries = 4, index_args["block_table"].shape[1] * 16
    index_bytes = hdk.dsv4.index_topk_workspace_bytes(rows, entries, "cuda")
    decode_bytes = hdk.dsv4.sparse_decode_workspace_bytes(3, 64, 200 + 128, "cuda")
    want_index = run_index(index_args)  # workspace from the caching allocator
    want_decode = run_decode(decode_args)
    # Too small: a clear error before anything runs, outputs untouched.
    for size, call, args in (
        (index_bytes, run_index, index_args),
        (decode_bytes, run_decode, decode_args),
    ):
        if size == 0:
            continue
        small = aligned_workspace(size - 256, "cuda")
        with pytest.raises(hdk.HdkError, match="'workspace'"):
            call(args, workspace=small)
    # A poisoned workspace of the size asked for changes nothing.
    for fill in (0x00, 0xFF, 0x7F):
        workspace = aligned_workspace(max(index_bytes, 256), "cuda", fill)
        assert_same(run_index(index_args, workspace=workspace), want_index)
        got = run_decode(
            decode_args, workspace=aligned_workspace(max(decode_bytes, 256), "cuda", fill)
        )
        assert_same(got, want_decode)
    # Captured in a CUDA graph (the workspace then comes from the graph's pool) and replayed.
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run_index(index_args)  # warm up outside the capture
        run_decode(decode_args)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            got_index = run_index(index_args)
            got_decode = run_decode(decode_args)
    torch.cuda.current_stream().wait_stream(stream)
    for tensor in (*got_index, *got_decode):
        tensor.fill_(0x55 if tensor.dtype == torch.int32 else 0.5)
    graph.replay()
    torch.cuda.synchronize()
    assert_same(got_index, want_index)
    assert_same(got_decode, want_decode)


# ---- KVCacheManager -------------------------------------------------------------------------


def test_manager_owns_no_workspace_on_the_cpu_and_passes_one_given():
    manager = hdk.dsv4.KVCacheManager("flash", num_layers=4, max_requests=2, device="cpu")
    assert manager.workspace is None
    manager.admit_request("a", prompt_length=40)
    step = manager.step_inputs(["a"])
    q = torch.randn(1, 64, 128)
    weights = torch.rand(1, 64)
    with pytest.raises(hdk.HdkError, match="'workspace'"):
        manager.index_topk(2, step, q, weights, 8, workspace=torch.zeros(64))
    with pytest.raises(hdk.HdkError, match="'workspace'"):
        manager.attend(0, step, torch.randn(1, 64, 512), workspace=torch.zeros(64))


@needs_cuda
def test_manager_workspace_is_sized_for_its_calls_on_cuda():
    manager = hdk.dsv4.KVCacheManager(
        "pro", num_layers=4, max_requests=4, max_context=65536, device="cuda"
    )
    capacity = manager.max_blocks[4] * manager.block_size[4]
    needed = max(
        hdk.dsv4.index_topk_workspace_bytes(4, capacity, "cuda"),
        hdk.dsv4.sparse_decode_workspace_bytes(4, 128, 128 + 2048, "cuda"),
    )
    assert needed > 0
    assert manager.workspace is not None
    assert manager.workspace.dtype == torch.uint8 and manager.workspace.is_cuda
    assert manager.workspace.numel() >= needed
    held = manager.workspace
    manager.admit_request("a", prompt_length=400)
    step = manager.step_inputs(["a"])
    q = torch.randn(1, 64, 128, device="cuda")
    manager.index_topk(2, step, q, torch.rand(1, 64, device="cuda"), 64)
    assert manager.workspace is held  # no call of the sizes it was made for grows it
