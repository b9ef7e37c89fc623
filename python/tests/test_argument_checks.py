"""The checks every operation shares, through the Python API: tensors of one call on one device
(a meta tensor among CPU tensors is refused, not traced), outputs whose elements each have their
own memory, dtype messages that list what the argument accepts, and the distinct slots a KV cache
store writes. A refused call leaves every buffer as it was."""

import pytest
import torch

import hdk
from cases import HV, H, K, V, fused_gating, make_generator, make_pool, randn
from conftest import CUDA_SKIP

META = torch.device("meta")


def gdn_call(batch=2, tokens=1):
    generator = make_generator(0)
    return dict(
        q=randn(generator, (batch, tokens, H, K), torch.float32, "cpu"),
        k=randn(generator, (batch, tokens, H, K), torch.float32, "cpu"),
        v=randn(generator, (batch, tokens, HV, V), torch.float32, "cpu"),
        state=make_pool(generator, batch, torch.float32, "cpu"),
        **fused_gating(generator, (batch, tokens), device="cpu"),
    )


def refused(match, function, *args, **kwargs):
    with pytest.raises(hdk.HdkError, match=match):
        function(*args, **kwargs)


@pytest.mark.parametrize("name", ["state", "q", "a"])
def test_gdn_meta_tensor_among_cpu_tensors_is_named(name):
    call = gdn_call()
    call[name] = torch.empty_like(call[name], device=META)
    out = torch.full((2, 1, HV, V), float("nan"))
    refused(
        rf"hdk::gdn::decode: argument '{name}' is on meta but .* are on cpu",
        hdk.gdn_decode,
        out=out,
        **call,
    )
    assert torch.isnan(out).all()


def test_gdn_cpu_tensor_among_meta_tensors_is_named():
    call = {name: torch.empty_like(t, device=META) for name, t in gdn_call().items()}
    call["state"] = make_pool(make_generator(1), 2, torch.float32, "cpu")
    before = call["state"].clone()
    refused(r"argument 'state' is on cpu but q, k, v, .* are on meta", hdk.gdn_decode, **call)
    assert torch.equal(call["state"], before)


def test_gdn_all_meta_still_traces():
    call = {name: torch.empty_like(t, device=META) for name, t in gdn_call().items()}
    assert hdk.gdn_decode(**call).device == META


def test_other_operations_refuse_a_meta_tensor_among_cpu_tensors():
    values = torch.randn(3, 10)
    refused(
        r"hdk::topk: argument 'out_values' is on meta but values, out_indices are on cpu",
        hdk.topk,
        values,
        2,
        out_values=torch.empty(3, 2, device=META),
    )
    refused(
        r"hdk::dsv4::route: argument 'bias' is on meta",
        hdk.route,
        torch.randn(3, 8),
        bias=torch.empty(8, device=META),
        top_k=2,
    )
    refused(
        r"hdk::dsv4::store_entries: argument 'cache' is on meta but values, slots are on cpu",
        hdk.dsv4.store_entries,
        torch.randn(2, 512),
        torch.tensor([0, 1]),
        torch.empty(1, 4 * 584, dtype=torch.uint8, device=META),
        4,
    )


def test_gdn_expanded_out_is_refused_and_nothing_is_written():
    call = gdn_call(batch=3, tokens=2)
    out = torch.full((1, 1, 1, V), float("nan")).expand(3, 2, HV, V)
    state = call["state"].clone()
    refused(r"argument 'out' has stride 0 in dim 0 \(extent 3", hdk.gdn_decode, out=out, **call)
    assert torch.isnan(out).all()
    assert torch.equal(call["state"], state)


def test_expanded_outputs_of_other_operations_are_refused():
    values = torch.randn(4, 10)
    out_values = torch.full((1, 3), float("nan")).expand(4, 3)
    refused(
        r"argument 'out_values' has stride 0 in dim 0", hdk.topk, values, 3, out_values=out_values
    )
    assert torch.isnan(out_values).all()
    cache = torch.zeros(1, 4 * 584, dtype=torch.uint8)
    slots = torch.tensor([[0, 1]])
    out = torch.full((1, 1, 512), float("nan")).expand(1, 2, 512)
    refused(
        r"argument 'out' has stride 0 in dim 1", hdk.dsv4.gather_entries, cache, 4, slots, out=out
    )


def test_unreadable_dtype_message_lists_what_the_argument_accepts():
    call = gdn_call()
    call["q"] = call["q"].double()
    with pytest.raises(hdk.HdkError) as caught:
        hdk.gdn_decode(**call)
    message = str(caught.value)
    expected = "argument 'q' must have dtype bfloat16 or float16 or float32, got float64"
    assert message.endswith(expected)
    assert "int32" not in message and "uint8" not in message
    refused(
        r"argument 'slots' must have dtype int32 or int64, got float64$",
        hdk.dsv4.store_entries,
        torch.randn(2, 512),
        torch.tensor([0.0, 1.0], dtype=torch.float64),
        torch.zeros(1, 4 * 584, dtype=torch.uint8),
        4,
    )
    refused(
        r"argument 'values' must have dtype float32, got int16$",
        hdk.topk,
        torch.zeros(2, 5, dtype=torch.int16),
        2,
    )


@pytest.mark.parametrize("check_indices", [False, True])
def test_store_entries_refuses_repeated_slots(check_indices):
    cache = torch.zeros(2, 4 * 584, dtype=torch.uint8)
    slots = torch.tensor([5, 0, -1, 5, -1])
    refused(
        r"slots\[3\] = 5 repeats slots\[0\]: the slots one call writes must be distinct",
        hdk.dsv4.store_entries,
        torch.randn(5, 512),
        slots,
        cache,
        4,
        check_indices=check_indices,
    )
    assert not cache.any()
    hdk.dsv4.store_entries(torch.randn(5, 512), torch.tensor([5, 0, -1, 6, -1]), cache, 4)


def test_store_indexer_keys_refuses_repeated_slots():
    cache = torch.zeros(2, 4 * 68, dtype=torch.uint8)
    refused(
        r"slots\[1\] = 2 repeats slots\[0\]",
        hdk.dsv4.store_indexer_keys,
        torch.randn(2, 128),
        torch.tensor([2, 2]),
        cache,
        4,
        check_indices=True,
    )
    assert not cache.any()


@pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
def test_cuda_store_refuses_repeated_slots_with_check_indices():
    cache = torch.zeros(2, 4 * 584, dtype=torch.uint8, device="cuda")
    refused(
        r"slots\[3\] = 5 repeats slots\[0\]",
        hdk.dsv4.store_entries,
        torch.randn(5, 512, device="cuda"),
        torch.tensor([5, 0, -1, 5, -1], device="cuda"),
        cache,
        4,
        check_indices=True,
    )
    assert not cache.any()
