"""hdk.gdn_decode against the float64 reference: every option, on every available device."""

import pytest
import torch

import hdk
from cases import (
    DTYPES,
    H,
    HV,
    K,
    V,
    assert_matches,
    assert_pool_matches,
    fused_gating,
    make_generator,
    make_pool,
    poisoned,
    precomputed_gating,
    randn,
    tolerance,
)
from gdn_reference import gdn_decode_reference

_NOT_REFERENCE_ARGUMENTS = (
    "out",
    "intermediate_states",
    "invalid_index_count",
    "nonfinite_head_count",
    "out_dtype",
)


def decode_and_check(tol, cache_columns=None, **kwargs):
    """hdk.gdn_decode(**kwargs) against the reference; outputs must arrive poisoned (NaN)."""
    state = kwargs["state"]
    before = state.clone()
    reference_arguments = {
        name: value for name, value in kwargs.items() if name not in _NOT_REFERENCE_ARGUMENTS
    }
    reference_arguments.pop("check_indices", None)
    expected = gdn_decode_reference(cache_columns=cache_columns, **reference_arguments)
    out = hdk.gdn_decode(**kwargs)
    if kwargs.get("out") is not None:
        assert out is kwargs["out"]
    assert_matches(out, expected.out, tol, "out")
    if cache_columns is not None:
        assert_matches(kwargs["intermediate_states"], expected.intermediates, tol, "intermediates")
    assert_pool_matches(state, before, expected, tol)
    return expected


def token_inputs(generator, lead, dtype, device):
    return dict(
        q=randn(generator, lead + (H, K), dtype, device),
        k=randn(generator, lead + (H, K), dtype, device),
        v=randn(generator, lead + (HV, V), dtype, device),
    )


def index_tensor(values, dtype, device):
    return torch.tensor(values, dtype=dtype, device=device)


@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("tokens", [1, 3])
def test_fused_gating(device, dtype, state_dtype, layout, tokens):
    generator = make_generator(1)
    dtype, state_dtype = DTYPES[dtype], DTYPES[state_dtype]
    batch, slots = 3, 6
    decode_and_check(
        tolerance(dtype, state_dtype),
        **token_inputs(generator, (batch, tokens), dtype, device),
        **fused_gating(generator, (batch, tokens), dtype=dtype, device=device),
        state=make_pool(generator, slots, state_dtype, device, layout),
        state_indices=index_tensor([4, 0, 2], torch.int32, device),
        out=poisoned((batch, tokens, HV, V), dtype, device),
        layout=layout,
    )


@pytest.mark.parametrize("layout", ["vk", "kv"])
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
def test_precomputed_gating(device, state_dtype, layout):
    generator = make_generator(2)
    state_dtype = DTYPES[state_dtype]
    batch, tokens = 2, 2
    decode_and_check(
        tolerance(torch.float32, state_dtype),
        **token_inputs(generator, (batch, tokens), torch.float32, device),
        **precomputed_gating(generator, (batch, tokens), device=device),
        state=make_pool(generator, batch, state_dtype, device, layout),
        out=poisoned((batch, tokens, HV, V), torch.float32, device),
        layout=layout,
    )


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_padding_rows_touch_nothing(device, index_dtype):
    generator = make_generator(3)
    batch, tokens, slots = 4, 2, 7
    expected = decode_and_check(
        tolerance(torch.bfloat16, torch.float32),
        **token_inputs(generator, (batch, tokens), torch.bfloat16, device),
        **fused_gating(generator, (batch, tokens), dtype=torch.bfloat16, device=device),
        state=make_pool(generator, slots, torch.float32, device),
        state_indices=index_tensor([-1, 3, -5, 0], index_dtype, device),
        out=poisoned((batch, tokens, HV, V), torch.bfloat16, device),
    )
    assert expected.written_slots == {3, 0}


def test_no_state_indices_uses_slot_n(device):
    generator = make_generator(4)
    batch = 3
    expected = decode_and_check(
        tolerance(torch.float32, torch.float32),
        **token_inputs(generator, (batch, 1), torch.float32, device),
        **fused_gating(generator, (batch, 1), device=device),
        state=make_pool(generator, batch + 2, torch.float32, device),
        out=poisoned((batch, 1, HV, V), torch.float32, device),
    )
    assert expected.written_slots == {0, 1, 2}


def test_output_state_indices_split_pool(device):
    generator = make_generator(5)
    batch = 3
    expected = decode_and_check(
        tolerance(torch.float32, torch.bfloat16),
        **token_inputs(generator, (batch, 2), torch.float32, device),
        **fused_gating(generator, (batch, 2), device=device),
        state=make_pool(generator, 8, torch.bfloat16, device),
        state_indices=index_tensor([0, 1, 2], torch.int64, device),
        output_state_indices=index_tensor([5, -1, 7], torch.int32, device),
        out=poisoned((batch, 2, HV, V), torch.float32, device),
    )
    assert expected.written_slots == {5, 7}


@pytest.mark.parametrize("with_accepted", [True, False])
def test_per_token_indices_speculative(device, with_accepted):
    generator = make_generator(6)
    batch, tokens, columns, slots = 3, 3, 4, 16
    indices = [[1, 2, 3, 4], [5, -1, 6, 7], [8, 9, 10, 11]]
    options = {}
    if with_accepted:
        options["num_accepted_tokens"] = index_tensor([2, 1, 4], torch.int32, device)
    decode_and_check(
        tolerance(torch.bfloat16, torch.float32),
        **token_inputs(generator, (batch, tokens), torch.bfloat16, device),
        **fused_gating(generator, (batch, tokens), dtype=torch.bfloat16, device=device),
        state=make_pool(generator, slots, torch.float32, device),
        state_indices=index_tensor(indices, torch.int32, device)[:, :columns],
        out=poisoned((batch, tokens, HV, V), torch.bfloat16, device),
        **options,
    )


def test_variable_length_batch(device):
    generator = make_generator(7)
    total = 7
    # Request 1 has no tokens, request 3 is padding; the others own 3, 1 and 3 tokens.
    cu_seqlens = index_tensor([0, 3, 3, 4, 4, 7], torch.int32, device)
    decode_and_check(
        tolerance(torch.float32, torch.float32),
        **token_inputs(generator, (1, total), torch.float32, device),
        **fused_gating(generator, (1, total), device=device),
        state=make_pool(generator, 9, torch.float32, device),
        state_indices=index_tensor([6, 2, 0, -1, 8], torch.int64, device),
        cu_seqlens=cu_seqlens,
        out=poisoned((1, total, HV, V), torch.float32, device),
    )


@pytest.mark.parametrize("update_state", [True, False])
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
def test_intermediate_states(device, update_state, state_dtype):
    generator = make_generator(8)
    state_dtype = DTYPES[state_dtype]
    batch, tokens, columns = 3, 3, 5
    decode_and_check(
        tolerance(torch.bfloat16, state_dtype),
        cache_columns=columns,
        **token_inputs(generator, (batch, tokens), torch.bfloat16, device),
        **fused_gating(generator, (batch, tokens), dtype=torch.bfloat16, device=device),
        state=make_pool(generator, 5, state_dtype, device),
        state_indices=index_tensor([3, -1, 1], torch.int32, device),
        intermediate_states=poisoned((batch, columns, HV, V, K), state_dtype, device),
        update_state=update_state,
        out=poisoned((batch, tokens, HV, V), torch.bfloat16, device),
    )


def test_strided_views_of_packed_buffers(device):
    """q/k/v slices of one packed row, a/b slices of another, a pool with padded slots."""
    generator = make_generator(9)
    batch, tokens = 3, 2
    width = 2 * H * K + HV * V + 8
    packed = randn(generator, (batch, tokens, width), torch.bfloat16, device)
    q = packed[..., : H * K].unflatten(-1, (H, K))
    k = packed[..., H * K : 2 * H * K].unflatten(-1, (H, K))
    v = packed[..., 2 * H * K : 2 * H * K + HV * V].unflatten(-1, (HV, V))
    gates = randn(generator, (batch, tokens, 2 * HV + 3), torch.bfloat16, device)
    padded_pool = make_pool(generator, 4 * 2, torch.float32, device).view(4, 2 * HV, V, K)
    decode_and_check(
        tolerance(torch.bfloat16, torch.float32),
        q=q,
        k=k,
        v=v,
        A_log=(torch.rand(HV, generator=generator) * 2).to(device),
        a=gates[..., :HV],
        dt_bias=randn(generator, (HV,), torch.float32, device),
        b=gates[..., HV + 3 :],
        state=padded_pool[:, :HV],
        state_indices=index_tensor([3, 0, 2], torch.int32, device),
        out=poisoned((batch, tokens, HV, V), torch.bfloat16, device),
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(scale=0.3),
        dict(scale=0.0),
        dict(use_qk_l2norm=False, scale=0.02),
        dict(l2norm_eps=0.5),
        dict(softplus_beta=2.0, softplus_threshold=0.5),
    ],
    ids=["scale", "scale0", "no-l2norm", "eps", "softplus"],
)
def test_options(device, options):
    generator = make_generator(10)
    batch, tokens = 2, 2
    decode_and_check(
        tolerance(torch.float32, torch.float32),
        **token_inputs(generator, (batch, tokens), torch.float32, device),
        **fused_gating(generator, (batch, tokens), device=device),
        state=make_pool(generator, batch, torch.float32, device),
        out=poisoned((batch, tokens, HV, V), torch.float32, device),
        **options,
    )


def test_dt_bias_bf16_and_out_dtype(device):
    generator = make_generator(11)
    batch = 2
    gating = fused_gating(generator, (batch, 1), dtype=torch.float16, device=device)
    gating["dt_bias"] = gating["dt_bias"].to(torch.bfloat16)
    inputs = token_inputs(generator, (batch, 1), torch.float16, device)
    state = make_pool(generator, batch, torch.float32, device)
    expected = gdn_decode_reference(state=state, **inputs, **gating)
    out = hdk.gdn_decode(state=state, out_dtype=torch.float32, **inputs, **gating)
    assert out.dtype == torch.float32 and out.device == state.device
    assert_matches(out, expected.out, 5e-3, "out")


def test_allocated_out_is_like_v(device):
    generator = make_generator(12)
    inputs = token_inputs(generator, (2, 1), torch.bfloat16, device)
    state = make_pool(generator, 2, torch.float32, device)
    expected = gdn_decode_reference(
        state=state, **inputs, **precomputed_gating(make_generator(0), (2, 1))
    )
    out = hdk.gdn_decode(
        state=state, **inputs, **precomputed_gating(make_generator(0), (2, 1), device=device)
    )
    assert out.dtype == torch.bfloat16 and out.shape == inputs["v"].shape
    assert_matches(out, expected.out, 5e-3, "out")


def test_invalid_indices_are_counted_and_run_as_padding(device):
    generator = make_generator(13)
    batch, tokens, slots = 4, 2, 6
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    expected = decode_and_check(
        tolerance(torch.float32, torch.float32),
        **token_inputs(generator, (batch, tokens), torch.float32, device),
        **fused_gating(generator, (batch, tokens), device=device),
        state=make_pool(generator, slots, torch.float32, device),
        state_indices=index_tensor(
            [[0, 1], [slots, 2], [3, slots + 5], [4, 5]], torch.int64, device
        ),
        num_accepted_tokens=index_tensor([1, 1, 2, 0], torch.int32, device),
        invalid_index_count=counter,
        out=poisoned((batch, tokens, HV, V), torch.float32, device),
    )
    assert expected.invalid_count == 3
    assert counter.item() == 3


def test_invalid_cu_seqlens_range_leaves_outputs_untouched(device):
    generator = make_generator(14)
    total = 4
    counter = torch.full((), 5, dtype=torch.int64, device=device)
    decode_and_check(
        tolerance(torch.float32, torch.float32),
        **token_inputs(generator, (1, total), torch.float32, device),
        **fused_gating(generator, (1, total), device=device),
        state=make_pool(generator, 3, torch.float32, device),
        state_indices=index_tensor([0, 1, 2], torch.int32, device),
        cu_seqlens=index_tensor([0, 2, 5, 4], torch.int32, device),
        invalid_index_count=counter,
        out=poisoned((1, total, HV, V), torch.float32, device),
    )
    assert counter.item() == 5 + 2


def test_nonfinite_input_refuses_the_head_and_keeps_its_slot(device):
    generator = make_generator(16)
    batch, slots = 3, 4
    inputs = token_inputs(generator, (batch, 1), torch.float32, device)
    gating = fused_gating(generator, (batch, 1), device=device)
    pool = make_pool(generator, slots, torch.float32, device)
    indices = index_tensor([2, 0, 3], torch.int32, device)
    clean_pool = pool.clone()
    clean = hdk.gdn_decode(**inputs, **gating, state=clean_pool, state_indices=indices)
    gating["a"][1, 0, HV - 1] = float("nan")
    before = pool.clone()
    counter = torch.full((1,), 4, dtype=torch.int64, device=device)
    out = hdk.gdn_decode(
        **inputs, **gating, state=pool, state_indices=indices, nonfinite_head_count=counter
    )
    assert counter.item() == 4 + 1
    assert torch.isnan(out[1, 0, HV - 1]).all()
    assert torch.equal(pool[0, HV - 1], before[0, HV - 1])  # request 1's slot, refused head
    refused = torch.zeros_like(out, dtype=torch.bool)
    refused[1, 0, HV - 1] = True
    assert torch.equal(out[~refused], clean[~refused])
    kept = torch.ones_like(pool, dtype=torch.bool)
    kept[0, HV - 1] = False
    assert torch.equal(pool[kept], clean_pool[kept])


def test_nonfinite_input_refuses_the_head_from_its_token_on(device):
    """A verify pass keeps the tokens before the bad one; nothing from that token on is stored."""
    generator = make_generator(17)
    batch, tokens, columns = 2, 3, 3
    inputs = token_inputs(generator, (batch, tokens), torch.bfloat16, device)
    gating = fused_gating(generator, (batch, tokens), dtype=torch.bfloat16, device=device)
    pool = make_pool(generator, 2, torch.float32, device)
    indices = index_tensor([1, 0], torch.int32, device)
    clean_pool, clean_cache = pool.clone(), poisoned((batch, columns, HV, V, K), torch.float32, device)
    clean = hdk.gdn_decode(
        **inputs, **gating, state=clean_pool, state_indices=indices, intermediate_states=clean_cache
    )
    inputs["v"][1, 1, 2, 5] = float("inf")
    cache = poisoned((batch, columns, HV, V, K), torch.float32, device)
    before = pool.clone()
    counter = torch.zeros((1,), dtype=torch.int32, device=device)
    out = hdk.gdn_decode(
        **inputs,
        **gating,
        state=pool,
        state_indices=indices,
        intermediate_states=cache,
        nonfinite_head_count=counter,
    )
    assert counter.item() == 1
    assert torch.isnan(out[1, 1:, 2]).all()
    assert torch.equal(out[1, 0, 2], clean[1, 0, 2])  # the token before the bad one
    assert torch.equal(cache[1, 0, 2], clean_cache[1, 0, 2])
    assert torch.isnan(cache[1, 1:, 2]).all()  # never written: still the poison
    assert torch.equal(pool[0, 2], before[0, 2])  # request 1's slot keeps the old state
    refused = torch.zeros_like(out, dtype=torch.bool)
    refused[1, 1:, 2] = True
    assert torch.equal(out[~refused], clean[~refused])


def test_check_indices_raises_on_a_shared_write_slot(device):
    generator = make_generator(15)
    batch = 2
    kwargs = dict(
        **token_inputs(generator, (batch, 1), torch.float32, device),
        **fused_gating(generator, (batch, 1), device=device),
        state=make_pool(generator, 4, torch.float32, device),
        state_indices=index_tensor([1, 2], torch.int32, device),
        output_state_indices=index_tensor([3, 3], torch.int32, device),
    )
    with pytest.raises(hdk.HdkError, match="check_indices: slot 3 is written by request 0"):
        hdk.gdn_decode(check_indices=True, **kwargs)
    with pytest.raises(hdk.HdkError, match="check_indices"):
        hdk.gdn_decode(
            check_indices=True,
            **dict(kwargs, state_indices=index_tensor([1, 9], torch.int32, device)),
        )


def test_qwen_shapes(device):
    """The Qwen3.5-397B head layout (H=16, HV=64, K=V=128), bf16 pool."""
    generator = make_generator(16)
    heads, value_heads, dim = 16, 64, 128
    batch = 2
    q = randn(generator, (batch, 1, heads, dim), torch.bfloat16, device)
    k = randn(generator, (batch, 1, heads, dim), torch.bfloat16, device)
    v = randn(generator, (batch, 1, value_heads, dim), torch.bfloat16, device)
    pool = randn(generator, (3, value_heads, dim, dim), torch.bfloat16, device, 0.5)
    decode_and_check(
        tolerance(torch.bfloat16, torch.bfloat16),
        q=q,
        k=k,
        v=v,
        **fused_gating(
            generator, (batch, 1), heads=value_heads, dtype=torch.bfloat16, device=device
        ),
        state=pool,
        state_indices=index_tensor([2, 0], torch.int32, device),
        out=poisoned((batch, 1, value_heads, dim), torch.bfloat16, device),
    )


def test_meta_tensors_trace_without_running():
    """The Meta kernel (what torch.compile traces with) accepts the call and writes nothing."""
    meta = torch.device("meta")
    q = torch.empty(2, 1, H, K, device=meta)
    v = torch.empty(2, 1, HV, V, device=meta)
    out = hdk.gdn_decode(
        q,
        q,
        v,
        torch.empty(2, HV, V, K, device=meta),
        g=torch.empty(2, 1, HV, device=meta),
        beta=torch.empty(2, 1, HV, device=meta),
    )
    assert out.device == meta and out.shape == v.shape


def test_max_tokens_per_request_bounds_variable_length_requests(device):
    generator = make_generator(17)
    total = 5
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    expected = decode_and_check(
        tolerance(torch.float32, torch.float32),
        **token_inputs(generator, (1, total), torch.float32, device),
        **fused_gating(generator, (1, total), device=device),
        state=make_pool(generator, 6, torch.float32, device),
        state_indices=index_tensor([0, 1, 2, 3, 4], torch.int32, device),
        cu_seqlens=index_tensor([0, 1, 3, 4, 4, 5], torch.int32, device),
        max_tokens_per_request=1,
        invalid_index_count=counter,
        out=poisoned((1, total, HV, V), torch.float32, device),
    )
    assert expected.invalid_count == 1 and counter.item() == 1  # request 1 has two tokens


def test_max_tokens_per_request_below_T_is_an_error(device):
    generator = make_generator(18)
    with pytest.raises(hdk.HdkError, match="option 'max_tokens_per_request' is 1"):
        hdk.gdn_decode(
            **token_inputs(generator, (2, 2), torch.float32, device),
            **fused_gating(generator, (2, 2), device=device),
            state=make_pool(generator, 2, torch.float32, device),
            max_tokens_per_request=1,
        )
