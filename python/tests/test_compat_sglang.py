"""hdk.compat.sglang: SGLang's argument order, defaults and return; hdk's semantics."""

import pytest
import torch

from cases import (
    HV,
    H,
    K,
    V,
    assert_matches,
    assert_pool_matches,
    make_generator,
    make_pool,
    randn,
    tolerance,
)
from gdn_reference import gdn_decode_reference
from hdk.compat.sglang import fused_sigmoid_gating_delta_rule_update


def gating_parameters(generator, device):
    return (
        (torch.rand(HV, generator=generator) * 2.5).to(device),
        randn(generator, (HV,), torch.float32, device, 0.5),
    )


def test_production_decode_call(device):
    """GDNAttnBackend.forward_decode: [1, B, ..] views of mixed_qkv, a/b [B, HV], cu_seqlens,
    CUDA-graph padding (index -1 and zero-length sequences at the tail)."""
    generator = make_generator(0)
    batch, real = 5, 3
    mixed_qkv = randn(generator, (batch, 2 * H * K + HV * V), torch.bfloat16, device)
    q = mixed_qkv[:, : H * K].view(1, batch, H, K)
    k = mixed_qkv[:, H * K : 2 * H * K].view(1, batch, H, K)
    v = mixed_qkv[:, 2 * H * K :].view(1, batch, HV, V)
    ba = randn(generator, (batch, 2 * HV), torch.bfloat16, device)
    b, a = ba[:, :HV], ba[:, HV:]
    A_log, dt_bias = gating_parameters(generator, device)
    pool = make_pool(generator, 8, torch.bfloat16, device)
    before = pool.clone()
    cache_indices = torch.tensor([6, 0, 3, -1, -1], dtype=torch.int32, device=device)
    query_start_loc = torch.tensor([0, 1, 2, 3, 3, 3], dtype=torch.int32, device=device)
    expected = gdn_decode_reference(
        q,
        k,
        v,
        pool,
        A_log=A_log,
        a=a.unsqueeze(0),
        dt_bias=dt_bias,
        b=b.unsqueeze(0),
        state_indices=cache_indices,
        cu_seqlens=query_start_loc,
    )
    o = fused_sigmoid_gating_delta_rule_update(
        A_log=A_log,
        dt_bias=dt_bias,
        q=q,
        k=k,
        v=v,
        a=a,
        b=b,
        initial_state_source=pool,
        initial_state_indices=cache_indices,
        cu_seqlens=query_start_loc,
        use_qk_l2norm_in_kernel=True,
        softplus_beta=1.0,
        softplus_threshold=20.0,
    )
    assert isinstance(o, torch.Tensor) and o.shape == v.shape and o.dtype == q.dtype
    tol = tolerance(torch.bfloat16, torch.bfloat16)
    assert_matches(o[:, :real], expected.out[:, :real], tol, "out")
    assert_pool_matches(pool, before, expected, tol)
    assert expected.written_slots == {6, 0, 3}


def test_positional_order_and_defaults(device):
    """A_log, a, dt_bias, softplus_beta, softplus_threshold, q, k, v, b, pool, indices, scale;
    use_qk_l2norm_in_kernel defaults to False."""
    generator = make_generator(1)
    batch, tokens = 2, 2
    A_log, dt_bias = gating_parameters(generator, device)
    a = randn(generator, (batch, tokens, HV), torch.float32, device)
    b = randn(generator, (batch, tokens, HV), torch.float32, device)
    q = randn(generator, (batch, tokens, H, K), torch.float32, device)
    k = randn(generator, (batch, tokens, H, K), torch.float32, device)
    v = randn(generator, (batch, tokens, HV, V), torch.float32, device)
    pool = make_pool(generator, 3, torch.float32, device)
    before = pool.clone()
    indices = torch.tensor([2, -1], dtype=torch.int64, device=device)
    expected = gdn_decode_reference(
        q,
        k,
        v,
        pool,
        A_log=A_log,
        a=a,
        dt_bias=dt_bias,
        b=b,
        state_indices=indices,
        scale=0.05,
        use_qk_l2norm=False,
        softplus_beta=1.5,
        softplus_threshold=3.0,
    )
    o = fused_sigmoid_gating_delta_rule_update(
        A_log, a, dt_bias, 1.5, 3.0, q, k, v, b, pool, indices, 0.05
    )
    tol = tolerance(torch.float32, torch.float32)
    assert_matches(o, expected.out, tol, "out")
    assert_pool_matches(pool, before, expected, tol)


def verify_inputs(device, batch=3, tokens=3, seed=2):
    generator = make_generator(seed)
    A_log, dt_bias = gating_parameters(generator, device)
    return generator, dict(
        A_log=A_log,
        dt_bias=dt_bias,
        a=randn(generator, (batch * tokens, HV), torch.bfloat16, device),
        b=randn(generator, (batch * tokens, HV), torch.bfloat16, device),
        q=randn(generator, (batch, tokens, H, K), torch.bfloat16, device),
        k=randn(generator, (batch, tokens, H, K), torch.bfloat16, device),
        v=randn(generator, (batch, tokens, HV, V), torch.bfloat16, device),
        softplus_beta=1.0,
        softplus_threshold=20.0,
        use_qk_l2norm_in_kernel=True,
    )


def reference_for(x, pool, **options):
    batch, tokens = x["q"].shape[:2]
    return gdn_decode_reference(
        x["q"],
        x["k"],
        x["v"],
        pool,
        A_log=x["A_log"],
        dt_bias=x["dt_bias"],
        a=x["a"].view(batch, tokens, HV),
        b=x["b"].view(batch, tokens, HV),
        **options,
    )


def test_verify_with_batch_indexed_buffer(device):
    generator, x = verify_inputs(device)
    pool = make_pool(generator, 4, torch.float32, device)
    before = pool.clone()
    indices = torch.tensor([3, 1, -1], dtype=torch.int32, device=device)
    buffer = torch.full((3, 5, HV, V, K), float("nan"), device=device)
    expected = reference_for(x, pool, state_indices=indices, update_state=False, cache_columns=5)
    o = fused_sigmoid_gating_delta_rule_update(
        **x,
        initial_state_source=pool,
        initial_state_indices=indices,
        disable_state_update=True,
        intermediate_states_buffer=buffer,
        cache_steps=3,
    )
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(o, expected.out, tol, "out")
    assert_matches(buffer, expected.intermediates, tol, "intermediates")
    assert torch.equal(pool, before)


def test_verify_with_intermediate_state_indices(device):
    """Buffer rows named by intermediate_state_indices (negative: not cached); the buffer's
    steps dim is the row pitch; rows and steps nobody writes keep their contents."""
    generator, x = verify_inputs(device)
    pool = make_pool(generator, 4, torch.bfloat16, device)
    indices = torch.tensor([0, 2, 3], dtype=torch.int32, device=device)
    rows = torch.tensor([4, -1, 1], dtype=torch.int64, device=device)
    buffer = make_pool(generator, 6 * 5, torch.bfloat16, device).view(6, 5, HV, V, K)
    buffer_before = buffer.clone()
    expected = reference_for(x, pool, state_indices=indices, update_state=False, cache_columns=3)
    o = fused_sigmoid_gating_delta_rule_update(
        **x,
        initial_state_source=pool,
        initial_state_indices=indices,
        disable_state_update=True,
        intermediate_states_buffer=buffer,
        intermediate_state_indices=rows,
    )
    tol = tolerance(torch.bfloat16, torch.bfloat16)
    assert_matches(o, expected.out, tol, "out")
    assert_matches(buffer[4, :3], expected.intermediates[0], tol, "request 0 cache")
    assert_matches(buffer[1, :3], expected.intermediates[2], tol, "request 2 cache")
    changed = torch.zeros(6, 5, dtype=torch.bool)
    changed[4, :3] = changed[1, :3] = True
    assert torch.equal(buffer.cpu()[~changed], buffer_before.cpu()[~changed])


def test_without_a_pool_starts_from_zero(device):
    generator, x = verify_inputs(device, batch=2, tokens=1)
    zeros = torch.zeros(2, HV, V, K, device=device)
    expected = reference_for(x, zeros)
    o = fused_sigmoid_gating_delta_rule_update(
        **x, initial_state_source=None, initial_state_indices=None
    )
    assert_matches(o, expected.out, tolerance(torch.bfloat16, torch.float32), "out")


def test_unsupported_and_invalid_options(device):
    generator, x = verify_inputs(device, batch=2, tokens=1)
    pool = make_pool(generator, 2, torch.float32, device)
    call = dict(x, initial_state_source=pool, initial_state_indices=None)
    with pytest.raises(NotImplementedError, match="is_kda"):
        fused_sigmoid_gating_delta_rule_update(**call, is_kda=True)
    with pytest.raises(NotImplementedError, match="retrieve_parent_token"):
        fused_sigmoid_gating_delta_rule_update(
            **call, retrieve_parent_token=torch.zeros(2, 1, dtype=torch.int64, device=device)
        )
    with pytest.raises(NotImplementedError, match="cache_ring"):
        fused_sigmoid_gating_delta_rule_update(**call, cache_ring=True)
    with pytest.raises(ValueError, match="scale must be positive"):
        fused_sigmoid_gating_delta_rule_update(**call, scale=-1.0)
    with pytest.raises(ValueError, match="argument 'a' of shape"):
        fused_sigmoid_gating_delta_rule_update(**dict(call, a=call["a"][:1]))
