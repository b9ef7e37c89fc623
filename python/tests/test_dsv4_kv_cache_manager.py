"""hdk.dsv4.KVCacheManager and BlockAllocator: presets and sizes, admission and release,
exhaustion that changes nothing, double release, and simulated decode steps whose SWA entries,
compressed entries and indexer keys (written by the real hdk.dsv4 calls through the manager's
tensors) are checked against the float64 oracle."""

import pytest
import torch

import dsv4_kv_reference as ref
import hdk
import hdk.dsv4
from hdk.dsv4 import BlockAllocator, KVCacheManager


def small(**options):
    settings = dict(
        num_layers=4,
        max_requests=3,
        csa_blocks=6,
        hca_blocks=4,
        block_size=2,
        hca_block_size=1,
        max_context=1024,
    )
    settings.update(options)
    return KVCacheManager("flash", **settings)


def snapshot(manager):
    """Everything a failed call must leave as it was."""
    return (
        manager.free_blocks(),
        sorted(map(str, manager.requests())),
        [
            (manager.position(r), manager.blocks(r, "csa"), manager.blocks(r, "hca"))
            for r in manager.requests()
        ],
        [t.clone() for t in manager._device_tables.values()],
        [a._free[:] for a in manager.allocators.values()],
    )


def same(a, b):
    return a[:3] == b[:3] and all(torch.equal(x, y) for x, y in zip(a[3], b[3])) and a[4] == b[4]


def test_presets_follow_the_spec():
    flash, pro = hdk.dsv4.layer_kinds("flash"), hdk.dsv4.layer_kinds("pro")
    assert len(flash) == 43 and len(pro) == 61
    assert flash[:2] == ("swa", "swa") and pro[:2] == ("hca", "hca")
    assert all(k == ("csa" if i % 2 == 0 else "hca") for i, k in enumerate(flash) if i >= 2)
    assert all(k == ("csa" if i % 2 == 0 else "hca") for i, k in enumerate(pro) if i >= 2)
    # Compress calls of a decode step: CSA layers make two, HCA one (docs: 62 and 91).
    assert sum({"swa": 0, "csa": 2, "hca": 1}[k] for k in flash) == 62
    assert sum({"swa": 0, "csa": 2, "hca": 1}[k] for k in pro) == 91
    with pytest.raises(hdk.HdkError, match="unknown preset"):
        hdk.dsv4.layer_kinds("mini")


@pytest.mark.parametrize("preset", ["flash", "pro"])
def test_tensors_and_memory_bytes(preset):
    m = KVCacheManager(
        preset,
        num_layers=6,
        max_requests=5,
        csa_blocks=7,
        hca_blocks=3,
        block_size=4,
        hca_block_size=2,
        max_context=4096,
        key_format="nvfp4",
    )
    kinds = hdk.dsv4.layer_kinds(preset, 6)
    expected = dict(swa=6 * 5 * 128 * 584, csa=0, hca=0, indexer=0, state=0)
    for layer, kind in zip(m.layers, kinds):
        assert layer.kind == kind and layer.swa.shape == (5, 128 * 584)
        assert layer.swa.dtype == torch.uint8
        if kind == "csa":
            assert layer.cache.shape == (7, 4 * 584) and layer.index_cache.shape == (7, 4 * 72)
            assert layer.state.shape == (5, 3, 3, 512) and layer.index_state.shape == (5, 3, 3, 128)
            expected["csa"] += 7 * 4 * 584
            expected["indexer"] += 7 * 4 * 72
            expected["state"] += 5 * 9 * 512 * 4 + 5 * 9 * 128 * 4
        elif kind == "hca":
            assert layer.cache.shape == (3, 2 * 584) and layer.state.shape == (5, 1, 3, 512)
            assert layer.index_cache is None
            expected["hca"] += 3 * 2 * 584
            expected["state"] += 5 * 3 * 512 * 4
        else:
            assert layer.cache is None and layer.state is None
    # Block tables: 4096 tokens -> 1024 CSA entries / 4 = 256 pages; 32 HCA entries / 2 = 16.
    expected["block_tables"] = 5 * (256 + 16) * 4
    expected["total"] = sum(expected.values())
    assert m.memory_bytes() == expected


def test_fp8_indexer_pages_and_the_format_error():
    m = small(key_format="fp8")
    csa = [layer for layer in m.layers if layer.kind == "csa"]
    assert csa and all(layer.index_cache.shape == (6, 2 * 132) for layer in csa)
    assert m.memory_bytes()["indexer"] == len(csa) * 6 * 2 * 132
    with pytest.raises(hdk.HdkError, match="key format must be 'mxfp4', 'nvfp4' or 'fp8'"):
        small(key_format="fp4")


def test_block_allocator_rules():
    a = BlockAllocator(5)
    assert a.allocate(3) == [0, 1, 2] and a.free_count() == 2
    a.release([1, 0])
    assert a.allocate(2) == [0, 1]  # the most recently released first
    before = (a._free[:], a._is_free[:])
    with pytest.raises(hdk.HdkError, match="cannot allocate 3 blocks: 2 of 5 are free"):
        a.allocate(3)
    for ids, message in [
        ([7], "not a block of this pool"),
        ([3], "already free"),
        ([2, 2], "given twice"),
        ([0, 4], "already free"),
    ]:
        with pytest.raises(hdk.HdkError, match=message):
            a.release(ids)
        assert (a._free, a._is_free) == before, f"release({ids}) changed the pool"


def test_admit_release_and_exhaustion():
    m = small()
    assert m.free_blocks() == {"csa": 6, "hca": 4}
    slot_a = m.admit_request("a", prompt_length=9)  # 2 CSA entries: one page of 2
    assert m.blocks("a", "csa") == [0] and m.blocks("a", "hca") == []
    assert m.position("a") == 9 and m.slot("a") == slot_a
    m.admit_request("b", prompt_length=20)  # 5 entries: 3 pages
    assert m.blocks("b", "csa") == [1, 2, 3] and m.free_blocks() == {"csa": 2, "hca": 4}
    assert m.block_table("csa", ["b"])[0, :4].tolist() == [1, 2, 3, -1]
    before = snapshot(m)
    with pytest.raises(
        hdk.HdkError,
        match=r"CSA pool is exhausted: 5 blocks requested, 2 free "
        r"\(of 6\); nothing was reserved",
    ):
        m.admit_request("x", prompt_length=40)
    with pytest.raises(hdk.HdkError, match="already admitted"):
        m.admit_request("a")
    with pytest.raises(hdk.HdkError, match="beyond max_context = 1024"):
        m.admit_request("y", prompt_length=1025)
    assert same(snapshot(m), before) and "x" not in m.requests()

    m.release_request("a")
    assert m.free_blocks() == {"csa": 3, "hca": 4}
    assert (m._device_tables[4][slot_a] == -1).all()
    with pytest.raises(hdk.HdkError, match="request 'a' is not admitted"):
        m.release_request("a")
    assert m.admit_request("c") == slot_a  # the slot is reused
    with pytest.raises(hdk.HdkError, match="32 blocks requested, 3 free"):
        m.admit_request("d", prompt_length=256)  # the HCA pages fit; nothing is taken
    assert m.free_blocks() == {"csa": 3, "hca": 4}
    m.admit_request("d", prompt_length=8)
    assert m.blocks("d", "csa") == [0]  # the most recently released page first
    before = snapshot(m)
    with pytest.raises(hdk.HdkError, match="all 3 request slots are taken"):
        m.admit_request("e")
    assert same(snapshot(m), before)
    for request in ("b", "c", "d"):
        m.release_request(request)
    assert m.free_blocks() == {"csa": 6, "hca": 4} and m.requests() == []


def test_reserve_for_step_is_all_or_nothing():
    m = small()
    m.admit_request("a")  # position 0
    m.admit_request("b", prompt_length=3)
    # a: 0 -> 1 needs nothing; b: 3 -> 4 completes entry 0: one page.
    assert m.reserve_for_step(["a", None, "b"]) == {"csa": 1, "hca": 0}
    assert m.reserve_for_step(["a", None, "b"]) == {"csa": 0, "hca": 0}  # already held
    m.advance(["a", None, "b"])
    assert (m.position("a"), m.position("b")) == (1, 4)
    with pytest.raises(hdk.HdkError, match="beyond its reserved 1; call reserve_for_step"):
        m.advance(["a"])
    assert m.position("a") == 1
    m.release_request("a")
    m.release_request("b")
    # a and b each hold one page and need a second one for 8 -> 12 (entry 2); one is free.
    m.admit_request("a", prompt_length=8)
    m.admit_request("b", prompt_length=8)
    m.admit_request("c", prompt_length=24)  # 6 entries: 3 pages
    assert m.free_blocks()["csa"] == 1
    before = snapshot(m)
    with pytest.raises(
        hdk.HdkError, match=r"CSA pool is exhausted: 2 blocks requested, 1 free " r"\(of 6\)"
    ):
        m.reserve_for_step(["a", "b"], tokens_per_request=4)
    assert same(snapshot(m), before)
    assert m.reserve_for_step(["a"], tokens_per_request=4) == {"csa": 1, "hca": 0}
    before = snapshot(m)
    with pytest.raises(hdk.HdkError, match="appears twice"):
        m.reserve_for_step(["a", "a"])
    with pytest.raises(hdk.HdkError, match="tokens_per_request must be 1 .. 4"):
        m.reserve_for_step(["a"], tokens_per_request=5)
    with pytest.raises(hdk.HdkError, match="request 'zz' is not admitted"):
        m.reserve_for_step(["a", "zz"])
    assert same(snapshot(m), before)


def test_step_inputs():
    m = small(max_requests=4, csa_blocks=40)
    m.admit_request("a", prompt_length=130)
    m.admit_request("b", prompt_length=7)
    slot_a, slot_b = m.slot("a"), m.slot("b")
    m.reserve_for_step(["b", None, "a"], tokens_per_request=2)
    step = m.step_inputs(["b", None, "a"], tokens_per_request=2)
    assert step.positions.tolist() == [7, 0, 130]
    assert step.state_slots.tolist() == [slot_b, -1, slot_a]
    assert step.swa_slots.tolist() == [
        [slot_b * 128 + 7, slot_b * 128 + 8],
        [-1, -1],
        [slot_a * 128 + 2, slot_a * 128 + 3],
    ]
    csa = step.csa_block_table
    assert csa.dtype == torch.int32 and csa.shape == (3, m.max_blocks[4])
    # Admission: a 32 entries (pages 0 .. 15), b 1 entry (16); the step: a 33 entries (17).
    assert m.blocks("b", "csa") == [16] and m.blocks("a", "csa") == list(range(16)) + [17]
    assert csa[0, :2].tolist() == [16, -1] and csa[2, :18].tolist() == m.blocks("a", "csa") + [-1]
    assert (csa[1] == -1).all()
    assert step.hca_block_table[2, :2].tolist() == m.blocks("a", "hca") + [-1]
    one = m.step_inputs(["a"])
    assert one.swa_slots.shape == (1,) and one.swa_slots.tolist() == [slot_a * 128 + 2]


@pytest.mark.parametrize("key_format", ["mxfp4", "fp8"])
def test_decode_steps_through_the_manager(key_format):
    """Four requests over ~68 steps of 2 tokens (MTP-like) through a 4-layer Flash config (SWA,
    SWA, CSA, HCA): one is released midway and a new one takes its slot and pages; a padding
    row in every batch. The real hdk.dsv4 calls write through the manager's tensors; the SWA
    rings must hold the oracle's bytes of the last 128 tokens, the CSA / HCA entries and the
    indexer keys (MXFP4, or FP8 pages of 132 bytes a key) must decode within the bound of the
    oracle's float64 entries."""
    g = ref.generator(51)
    tokens, steps = 2, 68
    m = small(
        max_requests=3,
        csa_blocks=64,
        hca_blocks=4,
        block_size=2,
        hca_block_size=1,
        max_context=256,
        key_format=key_format,
    )
    assert m.key_format == key_format
    for layer in m.layers:
        if layer.kind == "csa":
            assert layer.index_cache.shape == (64, 2 * ref.KEY_BYTES[key_format])
    for layer in m.layers:  # poison: garbage a fresh request must never read
        for tensor in (layer.state, layer.index_state):
            if tensor is not None:
                tensor.fill_(float("nan"))
    cos, sin = ref.rope_tables(256, g)
    params = {}
    oracles = {}  # (layer, indexer) -> ref.Compressor keyed by request number
    for layer in m.layers:
        for indexer in [False, True] if layer.kind == "csa" else [False] * (layer.kind == "hca"):
            dim = 128 if indexer else 512
            width = (2 if layer.ratio == 4 else 1) * dim
            params[(layer.index, indexer)] = (
                width,
                torch.randn(layer.ratio, width, generator=g),
                torch.rand(dim, generator=g) + 0.5,
            )
            oracles[(layer.index, indexer)] = ref.Compressor(layer.ratio, dim)
    number = {"a": 0, "b": 1, "c": 2, "d": 3}
    swa_values = {}  # (layer, request, position) -> fp32 row
    expected = {}  # (layer, indexer, request) -> {entry index: float64 value}
    checked = 0

    def check_entries(request):
        nonlocal checked
        for (layer_index, indexer, owner), entries in expected.items():
            if owner != request:
                continue
            layer = m.layers[layer_index]
            kind = layer.kind
            pages = m.blocks(request, kind)
            size = m.block_size[layer.ratio]
            cache = (layer.index_cache if indexer else layer.cache).cpu()
            total = cache.shape[1] // size
            for index, value in entries.items():
                slot = pages[index // size] * size + index % size
                data = ref.KEY_DATA_BYTES[m.key_format] if indexer else 576
                image = ref.read(cache, size, slot, total, data)
                ref.check_entry(image, value, m.key_format)
                checked += 1

    m.admit_request("a")
    m.admit_request("c")
    for step_number in range(steps):
        if step_number == 3:
            m.admit_request("b")
        if step_number == 20:
            check_entries("c")
            m.release_request("c")
            m.admit_request("d")  # takes c's slot, state and (later) pages
        batch = ["a", None, "b" if step_number >= 3 else None, "d" if step_number >= 20 else "c"]
        m.reserve_for_step(batch, tokens_per_request=tokens)
        step = m.step_inputs(batch, tokens_per_request=tokens)
        n = len(batch)
        for layer in m.layers:
            values = torch.randn(n * tokens, 512, generator=g) * 4
            for row, request in enumerate(batch):
                for t in range(tokens):
                    if request is not None:
                        position = m.position(request) + t
                        swa_values[(layer.index, request, position)] = values[row * tokens + t]
            inputs = {}  # indexer -> (kv, score, ape, norm_weight)
            for indexer in (
                [False, True] if layer.kind == "csa" else [False] * (layer.kind == "hca")
            ):
                width, ape, norm = params[(layer.index, indexer)]
                kv = torch.randn(n, tokens, width, generator=g)
                score = torch.randn(n, tokens, width, generator=g) * 2
                inputs[indexer] = (kv, score, ape, norm)
            if layer.kind != "swa" and step_number % 3 == 1:  # the layer's writes in one launch
                m.store_and_compress(
                    layer, step, values, inputs[False], cos, sin, indexer=inputs.get(True)
                )
            elif layer.kind == "csa" and step_number % 3 == 0:  # both compressors in one launch
                m.store_swa(layer, values, step)
                m.compress_csa(layer, step, inputs[False], inputs[True], cos, sin)
            else:
                m.store_swa(layer, values, step)
                for indexer, (kv, score, ape, norm) in inputs.items():
                    m.compress(layer, step, kv, score, ape, norm, cos, sin, indexer=indexer)
            for indexer, (kv, score, ape, norm) in inputs.items():
                keys = torch.tensor([-1 if r is None else number[r] for r in batch])
                done = oracles[(layer.index, indexer)].run(
                    kv, score, ape, step.positions, keys, norm, cos, sin
                )
                for row, index, value in done:
                    expected.setdefault((layer.index, indexer, batch[row]), {})[index] = value
        m.advance(batch, tokens_per_request=tokens)

    for request in ("a", "b", "d"):
        check_entries(request)
        position = m.position(request)
        for layer in m.layers:
            rows = [
                swa_values[(layer.index, request, p)]
                for p in range(max(0, position - 128), position)
            ]
            images, _ = ref.encode_entries(torch.stack(rows).double())
            slots = torch.tensor(
                [m.slot(request) * 128 + p % 128 for p in range(max(0, position - 128), position)]
            )
            want = layer.swa.clone()
            ref.place(want, 128, slots, images, ref.DATA_BYTES)
            assert torch.equal(layer.swa, want), f"layer {layer.index}: SWA ring of {request}"
    assert m.position("a") == 136 and m.position("d") == 96
    # a: 34 CSA entries (main + indexer) and 1 HCA entry; b: 32 + 32 + 1; c: 10 + 10; d: 24 + 24.
    assert checked == 34 * 2 + 1 + 32 * 2 + 1 + 10 * 2 + 24 * 2


def test_compress_csa_needs_a_csa_layer():
    m = small()
    hca = next(layer for layer in m.layers if layer.kind == "hca")
    with pytest.raises(hdk.HdkError, match="only CSA layers have two compressors"):
        m.compress_csa(hca, None, (None,) * 4, (None,) * 4, None, None)


def test_store_and_compress_takes_the_compressors_the_layer_has():
    m = small()
    kinds = {
        kind: next(layer for layer in m.layers if layer.kind == kind)
        for kind in ("swa", "csa", "hca")
    }
    four = (None,) * 4
    with pytest.raises(hdk.HdkError, match="is SWA, it has no compressor"):
        m.store_and_compress(kinds["swa"], None, None, four, None, None)
    with pytest.raises(hdk.HdkError, match="give its indexer compressor's inputs"):
        m.store_and_compress(kinds["csa"], None, None, four, None, None)
    with pytest.raises(hdk.HdkError, match="it has no indexer compressor"):
        m.store_and_compress(kinds["hca"], None, None, four, None, None, indexer=four)
