"""hdk.compat.flashinfer: FlashInfer's argument order, defaults and returns; hdk's semantics."""

import warnings

import pytest
import torch

from cases import (
    HV,
    H,
    K,
    V,
    assert_matches,
    assert_pool_matches,
    fused_gating,
    make_generator,
    make_pool,
    poisoned,
    randn,
    tolerance,
)
from gdn_reference import gdn_decode_reference
from hdk.compat.flashinfer import (
    gated_delta_rule_decode,
    gated_delta_rule_decode_pretranspose,
    gated_delta_rule_mtp,
)


def inputs(device, batch, tokens, dtype=torch.bfloat16, seed=0):
    generator = make_generator(seed)
    gating = fused_gating(generator, (batch, tokens), dtype=dtype, device=device)
    return (
        dict(
            q=randn(generator, (batch, tokens, H, K), dtype, device),
            k=randn(generator, (batch, tokens, H, K), dtype, device),
            v=randn(generator, (batch, tokens, HV, V), dtype, device),
            A_log=gating["A_log"],
            a=gating["a"],
            dt_bias=gating["dt_bias"],
            b=gating["b"],
        ),
        generator,
    )


def positional(x):
    """FlashInfer's leading positional order after the state: A_log, a, dt_bias, b."""
    return x["A_log"], x["a"], x["dt_bias"], x["b"]


def test_pretranspose_direct_state_positional_defaults(device):
    x, generator = inputs(device, 3, 1)
    state = make_pool(generator, 3, torch.float32, device)
    before = state.clone()
    expected = gdn_decode_reference(state=state, **x)  # default use_qk_l2norm=True
    out, returned = gated_delta_rule_decode_pretranspose(
        x["q"], x["k"], x["v"], state, *positional(x)
    )
    assert returned is state and out.dtype == x["q"].dtype
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(out, expected.out, tol, "out")
    assert_pool_matches(state, before, expected, tol)


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32])
def test_pretranspose_pool_padding_never_touches_slot_zero(device, state_dtype):
    """FlashInfer's bf16 path reads and writes slot 0 for -1; hdk leaves a live slot 0 alone."""
    x, generator = inputs(device, 4, 1)
    pool = make_pool(generator, 6, state_dtype, device)
    before = pool.clone()
    read = torch.tensor([3, -1, 0, 5], dtype=torch.int32, device=device)
    write = torch.tensor([1, 2, -1, 4], dtype=torch.int64, device=device)
    output = poisoned((4, 1, HV, V), torch.float32, device)
    expected = gdn_decode_reference(
        state=pool, state_indices=read, output_state_indices=write, scale=0.2, **x
    )
    out, returned = gated_delta_rule_decode_pretranspose(
        x["q"],
        x["k"],
        x["v"],
        None,
        *positional(x),
        scale=0.2,
        output=output,
        initial_state=pool,
        initial_state_indices=read,
        output_state_indices=write,
    )
    assert returned is pool and out is output
    tol = tolerance(torch.bfloat16, state_dtype)
    assert_matches(out, expected.out, tol, "out")
    assert torch.all(out[1] == 0)
    assert_pool_matches(pool, before, expected, tol)
    assert expected.written_slots == {1, 4}  # slot 0 is read by request 2, never written


def test_pretranspose_verify_keywords(device):
    x, generator = inputs(device, 2, 3)
    pool = make_pool(generator, 4, torch.bfloat16, device)
    before = pool.clone()
    read = torch.tensor([2, 0], dtype=torch.int32, device=device)
    buffer = poisoned((3, 4, HV, V, K), torch.bfloat16, device)  # more rows and steps than needed
    expected = gdn_decode_reference(
        state=pool,
        state_indices=read,
        update_state=False,
        cache_columns=4,
        use_qk_l2norm=False,
        **x,
    )
    out, _ = gated_delta_rule_decode_pretranspose(
        x["q"],
        x["k"],
        x["v"],
        None,
        *positional(x),
        use_qk_l2norm=False,
        initial_state=pool,
        initial_state_indices=read,
        intermediate_states_buffer=buffer,
        disable_state_update=True,
    )
    tol = tolerance(torch.bfloat16, torch.bfloat16)
    assert_matches(out, expected.out, tol, "out")
    assert_matches(buffer[:2], expected.intermediates, tol, "intermediates")
    assert torch.isnan(buffer[2]).all()
    assert torch.equal(pool, before)


def test_pretranspose_non_contiguous_state_is_copied_back(device):
    x, generator = inputs(device, 2, 1)
    storage = make_pool(generator, 2, torch.float32, device, layout="kv")  # [B, HV, K, V]
    state = storage.transpose(2, 3)  # [B, HV, V, K] with V contiguous: not addressable in place
    before = state.clone()
    expected = gdn_decode_reference(state=state.contiguous(), **x)
    out, returned = gated_delta_rule_decode_pretranspose(
        x["q"], x["k"], x["v"], state, *positional(x)
    )
    assert returned is state
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(out, expected.out, tol, "out")
    assert_pool_matches(state, before, expected, tol)


def test_pretranspose_argument_errors(device):
    x, generator = inputs(device, 2, 1)
    pool = make_pool(generator, 2, torch.float32, device)
    indices = torch.tensor([0, 1], dtype=torch.int32, device=device)
    call = (x["q"], x["k"], x["v"])
    with pytest.raises(ValueError, match="initial_state and initial_state_indices"):
        gated_delta_rule_decode_pretranspose(*call, None, *positional(x), initial_state=pool)
    with pytest.raises(ValueError, match="output_state_indices can only be used with"):
        gated_delta_rule_decode_pretranspose(
            *call, pool, *positional(x), output_state_indices=indices
        )
    with pytest.raises(ValueError, match="either state or initial_state"):
        gated_delta_rule_decode_pretranspose(*call, None, *positional(x))


def test_decode_k_major_state(device):
    x, generator = inputs(device, 3, 1, dtype=torch.float16)
    state = make_pool(generator, 3, torch.float32, device, layout="kv")  # [B, HV, K, V]
    before = state.clone()
    output = poisoned((3, 1, HV, V), torch.float16, device)
    expected = gdn_decode_reference(state=state, layout="kv", scale=0.1, **x)
    out, returned = gated_delta_rule_decode(
        x["q"], x["k"], x["v"], state, *positional(x), 0.1, output
    )
    assert returned is state and out is output
    tol = tolerance(torch.float16, torch.float32)
    assert_matches(out, expected.out, tol, "out")
    assert_pool_matches(state, before, expected, tol)


def test_mtp_default_disable_state_update_warns_and_keeps_the_pool(device):
    x, generator = inputs(device, 2, 2)
    pool = make_pool(generator, 3, torch.float32, device)
    before = pool.clone()
    read = torch.tensor([2, 1], dtype=torch.int32, device=device)
    expected = gdn_decode_reference(state=pool, state_indices=read, update_state=False, **x)
    with pytest.warns(FutureWarning, match="disable_state_update"):
        out, returned = gated_delta_rule_mtp(x["q"], x["k"], x["v"], pool, read, *positional(x))
    assert returned is pool
    assert_matches(out, expected.out, tolerance(torch.bfloat16, torch.float32), "out")
    assert torch.equal(pool, before)


def test_mtp_update_with_split_write_slots_and_buffer(device):
    x, generator = inputs(device, 3, 2)
    pool = make_pool(generator, 8, torch.float32, device)
    before = pool.clone()
    read = torch.tensor([0, -1, 4], dtype=torch.int64, device=device)
    write = torch.tensor([6, 7, -1], dtype=torch.int32, device=device)
    buffer = poisoned((4, 3, HV, V, K), torch.float32, device)
    expected = gdn_decode_reference(
        state=pool, state_indices=read, output_state_indices=write, cache_columns=3, **x
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, _ = gated_delta_rule_mtp(
            x["q"],
            x["k"],
            x["v"],
            pool,
            read,
            *positional(x),
            intermediate_states_buffer=buffer,
            disable_state_update=False,
            output_state_indices=write,
        )
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(out, expected.out, tol, "out")
    assert_matches(buffer[:3], expected.intermediates, tol, "intermediates")
    assert_pool_matches(pool, before, expected, tol)
    assert expected.written_slots == {6}


def test_mtp_ssm_state_indices_scatter_every_token(device):
    x, generator = inputs(device, 3, 3)
    slots = 12
    pool = make_pool(generator, slots, torch.float32, device)
    before = pool.clone()
    read = torch.tensor([1, -1, 0], dtype=torch.int32, device=device)
    per_token = torch.tensor([[5, 6, 7], [8, 9, 10], [11, -1, 2]], dtype=torch.int32, device=device)
    reference = gdn_decode_reference(
        state=pool, state_indices=read, update_state=False, cache_columns=3, **x
    )
    out, _ = gated_delta_rule_mtp(
        x["q"],
        x["k"],
        x["v"],
        pool,
        read,
        *positional(x),
        ssm_state_indices=per_token,
        disable_state_update=False,
    )
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(out, reference.out, tol, "out")
    expected = before.cpu().double().clone()
    for n, t, slot in [(0, 0, 5), (0, 1, 6), (0, 2, 7), (2, 0, 11), (2, 2, 2)]:
        expected[slot] = reference.intermediates[n, t]
    written = [5, 6, 7, 11, 2]
    unchanged = [s for s in range(slots) if s not in written]
    assert torch.equal(pool.cpu()[unchanged], before.cpu()[unchanged])
    assert_matches(pool.cpu()[written], expected[written], tol, "scattered states")


def test_mtp_ssm_state_indices_constraints(device):
    x, generator = inputs(device, 2, 1)
    pool = make_pool(generator, 4, torch.float32, device)
    read = torch.tensor([0, 1], dtype=torch.int32, device=device)
    per_token = torch.tensor([[2], [3]], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="T >= 2"):
        gated_delta_rule_mtp(
            x["q"],
            x["k"],
            x["v"],
            pool,
            read,
            *positional(x),
            ssm_state_indices=per_token,
            disable_state_update=False,
        )
    with pytest.raises(ValueError, match="mutually exclusive"):
        gated_delta_rule_mtp(
            x["q"],
            x["k"],
            x["v"],
            pool,
            read,
            *positional(x),
            intermediate_states_buffer=poisoned((2, 1, HV, V, K), torch.float32, device),
            ssm_state_indices=per_token,
            disable_state_update=False,
        )
