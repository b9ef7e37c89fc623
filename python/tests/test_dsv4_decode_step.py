"""A whole DeepSeek-V4 decode step through hdk.dsv4.KVCacheManager, read side included: per layer
store_swa, compress (main and indexer), index_topk and attend, with no list built by the caller.
Over a sequence of steps (one token, and two tokens per request as with MTP, a padding row in
every batch; on the CPU and, where a GPU exists, on CUDA), the lists the manager builds (SWA
window, selected and all compressed entries) are checked against lists computed here from
positions and pages, index_topk against the float64 top-k over the keys in the pool, and
attend's output against the float64 softmax with sink over the entries decoded from the pools'
bytes."""

import pytest
import torch

import dsv4_kv_reference as ref
from hdk.dsv4 import KVCacheManager
from test_dsv4_attention import check_topk, reference_attention, reference_topk

HEADS, INDEX_HEADS, TOP_K = 8, 64, 6


def expected_swa(m, request, query_position, last_position):
    first = max(0, last_position - 127)
    return [m.slot(request) * 128 + p % 128 for p in range(first, query_position + 1)]


def compressed_slots(m, request, kind, count):
    pages = m.blocks(request, kind)
    size = m.block_size[4 if kind == "csa" else 128]
    return [pages[e // size] * size + e % size for e in range(count)]


@pytest.mark.parametrize("tokens", [1, 2])
def test_decode_steps_with_the_read_side(device, tokens):
    g = ref.generator(70 + tokens)
    m = KVCacheManager(
        "flash",
        num_layers=4,  # SWA, SWA, CSA, HCA
        max_requests=3,
        csa_blocks=48,
        hca_blocks=6,
        block_size=2,
        hca_block_size=1,
        max_context=512,
        device=device,
    )
    cos, sin = (t.to(device) for t in ref.rope_tables(512, g))
    weights = {}
    for layer in m.layers:
        for indexer in [False, True] if layer.kind == "csa" else [False] * (layer.kind == "hca"):
            width = (2 if layer.ratio == 4 else 1) * (128 if indexer else 512)
            weights[(layer.index, indexer)] = (
                torch.randn(layer.ratio, width, generator=g).to(device),
                (torch.rand(width // (2 if layer.ratio == 4 else 1), generator=g) + 0.5).to(device),
            )
    sink = torch.randn(HEADS, generator=g)
    m.admit_request("a", prompt_length=250)  # HCA entries 0 and 1 exist (as zero pages)
    m.admit_request("b")
    batch = ["a", None, "b"]
    checked = {"swa": 0, "csa": 0, "hca": 0}
    for step_number in range(24 // tokens):
        m.reserve_for_step(batch, tokens_per_request=tokens)
        step = m.step_inputs(batch, tokens_per_request=tokens)
        rows = len(batch) * tokens
        for layer in m.layers:
            m.store_swa(layer, torch.randn(rows, 512, generator=g).to(device), step)
            for indexer in (
                [False, True] if layer.kind == "csa" else [False] * (layer.kind == "hca")
            ):
                ape, norm = weights[(layer.index, indexer)]
                kv = torch.randn(len(batch), tokens, ape.shape[1], generator=g).to(device)
                score = torch.randn(len(batch), tokens, ape.shape[1], generator=g).to(device)
                m.compress(layer, step, kv, score, ape, norm, cos, sin, indexer=indexer)
            q = torch.randn(rows, HEADS, 512, generator=g).to(torch.bfloat16)
            selected = None
            if layer.kind == "csa":
                q_index = torch.randn(rows, INDEX_HEADS, 128, generator=g).to(torch.bfloat16)
                w_index = torch.rand(rows, INDEX_HEADS, generator=g) * 0.02
                results = m.index_topk(layer, step, q_index.to(device), w_index.to(device), TOP_K)
                indices, scores, selected = (t.cpu() for t in results)
                index_cache = layer.index_cache.cpu()
                keys = []
                for row in range(rows):
                    request, t = batch[row // tokens], row % tokens
                    count = 0 if request is None else (m.position(request) + t + 1) // 4
                    slots = [] if request is None else compressed_slots(m, request, "csa", count)
                    keys.append(
                        [
                            ref.decode_key(ref.read(index_cache, 2, s, 68, 64), "mxfp4")
                            for s in slots
                        ]
                    )
                    want = [slots[s] if s >= 0 else -1 for s in indices[row].tolist()]
                    assert selected[row].tolist() == want, f"row {row}: topk_slots"
                check_topk(
                    indices, scores, reference_topk(q_index, w_index, keys, TOP_K), TOP_K, False
                )
            out, lse = m.attend(
                layer,
                step,
                q.to(device),
                sink=sink.to(device),
                selected=None if selected is None else selected.to(device),
            )
            out, lse = out.cpu(), lse.cpu()
            # The list of every query row, computed here, as (pool, slot) pairs.
            size = m.block_size[layer.ratio] if layer.kind != "swa" else 0
            lists = []
            for row in range(rows):
                request, t = batch[row // tokens], row % tokens
                if request is None:
                    lists.append([])
                    continue
                position = m.position(request) + t
                last = m.position(request) + tokens - 1
                swa = expected_swa(m, request, position, last)
                got_window = [s for s in step.swa_window[row].tolist() if s >= 0]
                assert sorted(got_window) == sorted(swa), f"row {row}: SWA window"
                compressed = []
                if layer.kind == "csa":
                    compressed = [s for s in selected[row].tolist() if s >= 0]
                elif layer.kind == "hca":
                    compressed = compressed_slots(m, request, "hca", (position + 1) // 128)
                    got_list = [s for s in step.hca_list[row].tolist() if s >= 0]
                    assert got_list == compressed, f"row {row}: HCA list"
                lists.append([("pool", s) for s in compressed] + [("ring", s) for s in swa])
                checked[layer.kind] += 1
            # One table of the entries the lists name, decoded from the pools' bytes.
            names = sorted(set(entry for x in lists for entry in x))
            pool_bytes = layer.cache.cpu() if size else None
            ring_bytes = layer.swa.cpu()
            number = {name: i for i, name in enumerate(names)}
            table = [
                ref.decode_entry(
                    ref.read(pool_bytes, size, s, 584, 576)
                    if pool == "pool"
                    else ref.read(ring_bytes, 128, s, 584, 576)
                )
                for pool, s in names
            ] or [torch.zeros(512, dtype=torch.float64)]
            lists = [[number[entry] for entry in x] for x in lists]
            width = max(1, max(len(x) for x in lists))
            padded = torch.tensor([x + [-1] * (width - len(x)) for x in lists])
            want_out, want_lse, bounds = reference_attention(
                q.float(), torch.stack(table), padded, sink, 512**-0.5
            )
            for row, (s, e_max) in enumerate(bounds):
                # CUDA's tensor-core kernel also rounds the softmax weights to bf16.
                rounding = 2.0**-8 * e_max if device == "cuda" else 0.0
                tol = 2.0**-8 * want_out[row].abs() + 1e-4 * (1 + s) * e_max + rounding
                assert ((out[row].double() - want_out[row]).abs() <= tol).all(), f"row {row}: out"
                assert ((lse[row].double() - want_lse[row]).abs() <= 1e-4 * (1 + s)).all()
        m.advance(batch, tokens_per_request=tokens)
    assert m.position("b") == 24 and checked["csa"] > 0 and checked["hca"] > 0
