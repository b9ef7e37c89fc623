"""hdk.compat.vllm: vLLM's argument order, defaults and returns; hdk's semantics."""

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
    poisoned,
    randn,
    tolerance,
)
from gdn_reference import gdn_decode_reference
from hdk.compat.vllm import fused_recurrent_gated_delta_rule, fused_sigmoid_gating_delta_rule_update


def tokens_inputs(generator, lead, dtype, device):
    return (
        randn(generator, lead + (H, K), dtype, device),
        randn(generator, lead + (H, K), dtype, device),
        randn(generator, lead + (HV, V), dtype, device),
    )


def precomputed(generator, lead, device, dtype=torch.float32):
    g = (-torch.rand(lead + (HV,), generator=generator) * 2).to(device, dtype)
    beta = torch.rand(lead + (HV,), generator=generator).to(device, dtype)
    return g, beta


def test_fused_recurrent_positional_in_place(device):
    generator = make_generator(0)
    q, k, v = tokens_inputs(generator, (3, 1), torch.bfloat16, device)
    g, beta = precomputed(generator, (3, 1), device)
    pool = make_pool(generator, 5, torch.float32, device)
    before = pool.clone()
    indices = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    expected = gdn_decode_reference(
        q, k, v, pool, g=g, beta=beta, state_indices=indices, use_qk_l2norm=False, scale=0.3
    )
    o, final = fused_recurrent_gated_delta_rule(q, k, v, g, beta, 0.3, pool, True, None, indices)
    assert final is pool and o.dtype == q.dtype
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(o, expected.out, tol, "out")
    assert_pool_matches(pool, before, expected, tol)


def spec_decode_inputs(device, requests=3, tokens=3, seed=1):
    """vLLM's spec-decode form: [1, requests * tokens] + cu_seqlens, 2-D slots per token."""
    generator = make_generator(seed)
    total = requests * tokens
    q, k, v = tokens_inputs(generator, (1, total), torch.bfloat16, device)
    cu = torch.arange(0, total + 1, tokens, dtype=torch.int32, device=device)
    slots = torch.tensor(
        [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], dtype=torch.int32, device=device
    )[:requests]
    accepted = torch.tensor([2, 1, 3], dtype=torch.int32, device=device)[:requests]
    return generator, q, k, v, cu, slots, accepted


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_fused_recurrent_spec_decode_in_place(device, state_dtype):
    generator, q, k, v, cu, slots, accepted = spec_decode_inputs(device)
    g, beta = precomputed(generator, (1, q.shape[1]), device)
    pool = make_pool(generator, 14, state_dtype, device)
    before = pool.clone()
    expected = gdn_decode_reference(
        q,
        k,
        v,
        pool,
        g=g,
        beta=beta,
        state_indices=slots,
        num_accepted_tokens=accepted,
        cu_seqlens=cu,
        use_qk_l2norm=True,
    )
    o, final = fused_recurrent_gated_delta_rule(
        q,
        k,
        v,
        g=g,
        beta=beta,
        initial_state=pool,
        inplace_final_state=True,
        cu_seqlens=cu,
        ssm_state_indices=slots,
        num_accepted_tokens=accepted,
        use_qk_l2norm_in_kernel=True,
    )
    assert final is pool
    tol = tolerance(torch.bfloat16, state_dtype)
    assert_matches(o, expected.out, tol, "out")
    assert_pool_matches(pool, before, expected, tol)
    assert expected.written_slots == {1, 2, 3, 5, 6, 7, 9, 10, 11}


def test_fused_recurrent_per_token_states_batched(device):
    """inplace_final_state=False with [B, T] inputs: B * T states at rows n * T + t."""
    generator = make_generator(2)
    batch, tokens = 2, 3
    q, k, v = tokens_inputs(generator, (batch, tokens), torch.float32, device)
    g, beta = precomputed(generator, (batch, tokens), device, dtype=torch.bfloat16)
    pool = make_pool(generator, 3, torch.float32, device)
    before = pool.clone()
    indices = torch.tensor([[2, 0, 1], [1, 2, 0]], dtype=torch.int64, device=device)
    expected = gdn_decode_reference(
        q,
        k,
        v,
        pool,
        g=g,
        beta=beta,
        state_indices=indices,
        update_state=False,
        cache_columns=3,
        use_qk_l2norm=False,
    )
    o, states = fused_recurrent_gated_delta_rule(
        q, k, v, g, beta, initial_state=pool, inplace_final_state=False, ssm_state_indices=indices
    )
    tol = tolerance(torch.float32, torch.float32)
    assert states.shape == (batch * tokens, HV, V, K) and states.dtype == pool.dtype
    assert_matches(o, expected.out, tol, "out")
    assert_matches(states, expected.intermediates.flatten(0, 1), tol, "per-token states")
    assert torch.equal(pool, before)


def test_fused_recurrent_per_token_states_variable_length(device):
    """inplace_final_state=False with cu_seqlens: the state after token t of request n at row
    cu_seqlens[n] + t; padding and zero-length requests write no row."""
    generator = make_generator(3)
    total = 6
    q, k, v = tokens_inputs(generator, (1, total), torch.bfloat16, device)
    g, beta = precomputed(generator, (1, total), device)
    cu = torch.tensor([0, 2, 2, 3, 5, 6], dtype=torch.int32, device=device)
    indices = torch.tensor([3, 1, 0, -1, 2], dtype=torch.int32, device=device)
    pool = make_pool(generator, 4, torch.bfloat16, device)
    before = pool.clone()
    expected = gdn_decode_reference(
        q,
        k,
        v,
        pool,
        g=g,
        beta=beta,
        state_indices=indices,
        cu_seqlens=cu,
        update_state=False,
        cache_columns=total,
        use_qk_l2norm=False,
    )
    o, states = fused_recurrent_gated_delta_rule(
        q,
        k,
        v,
        g,
        beta,
        initial_state=pool,
        inplace_final_state=False,
        cu_seqlens=cu,
        ssm_state_indices=indices,
    )
    tol = tolerance(torch.bfloat16, torch.bfloat16)
    assert states.shape == (total, HV, V, K)
    assert_matches(o[:, [0, 1, 2, 5]], expected.out[:, [0, 1, 2, 5]], tol, "out")
    assert torch.all(o[:, 3:5] == 0)  # request 3 is padding (-1)
    rows = {0: (0, 0), 1: (0, 1), 2: (2, 0), 5: (4, 0)}  # row -> (request, token)
    for row, (n, t) in rows.items():
        assert_matches(states[row], expected.intermediates[n, t], tol, f"state row {row}")
    assert torch.equal(pool, before)


def test_fused_recurrent_default_beta_has_value_heads(device):
    generator = make_generator(4)
    q, k, v = tokens_inputs(generator, (2, 1), torch.float32, device)
    g, _ = precomputed(generator, (2, 1), device)
    pool = make_pool(generator, 2, torch.float32, device)
    expected = gdn_decode_reference(
        q, k, v, pool, g=g, beta=torch.ones(2, 1, HV), use_qk_l2norm=False
    )
    o, _ = fused_recurrent_gated_delta_rule(q, k, v, g, initial_state=pool)
    assert_matches(o, expected.out, tolerance(torch.float32, torch.float32), "out")


def test_fused_recurrent_errors(device):
    generator = make_generator(5)
    q, k, v = tokens_inputs(generator, (2, 1), torch.float32, device)
    g, beta = precomputed(generator, (2, 1), device)
    pool = make_pool(generator, 2, torch.float32, device)
    cu = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="batch size is expected to be 1"):
        fused_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=pool, cu_seqlens=cu)
    with pytest.raises(ValueError, match="initial_state"):
        fused_recurrent_gated_delta_rule(q, k, v, g, beta)
    with pytest.raises(ValueError, match="scale must be positive"):
        fused_recurrent_gated_delta_rule(q, k, v, g, beta, scale=0.0, initial_state=pool)
    with pytest.raises(NotImplementedError, match="per-V beta"):
        fused_recurrent_gated_delta_rule(
            q, k, v, g, beta.unsqueeze(-1).expand(2, 1, HV, V), initial_state=pool
        )


def gating(generator, tokens, device):
    return dict(
        A_log=(torch.rand(HV, generator=generator) * 2.5).to(device),
        a=randn(generator, (tokens, HV), torch.bfloat16, device),
        b=randn(generator, (tokens, HV), torch.bfloat16, device),
        dt_bias=randn(generator, (HV,), torch.float32, device, 0.5),
    )


def reference_gating(x):
    return dict(
        A_log=x["A_log"], a=x["a"].unsqueeze(0), b=x["b"].unsqueeze(0), dt_bias=x["dt_bias"]
    )


def test_fused_sigmoid_production_decode_call(device):
    """QwenGatedDeltaNetAttention's non-spec decode call (keywords, a/b [T, HV])."""
    generator = make_generator(6)
    total = 4
    q, k, v = tokens_inputs(generator, (1, total), torch.bfloat16, device)
    x = gating(generator, total, device)
    pool = make_pool(generator, 6, torch.bfloat16, device)
    before = pool.clone()
    cu = torch.arange(total + 1, dtype=torch.int32, device=device)
    indices = torch.tensor([5, 2, -1, 1], dtype=torch.int32, device=device)
    expected = gdn_decode_reference(
        q, k, v, pool, **reference_gating(x), state_indices=indices, cu_seqlens=cu
    )
    o, final = fused_sigmoid_gating_delta_rule_update(
        A_log=x["A_log"],
        a=x["a"],
        b=x["b"],
        dt_bias=x["dt_bias"],
        q=q,
        k=k,
        v=v,
        initial_state=pool,
        inplace_final_state=True,
        cu_seqlens=cu,
        ssm_state_indices=indices,
        use_qk_l2norm_in_kernel=True,
    )
    assert final is pool
    tol = tolerance(torch.bfloat16, torch.bfloat16)
    assert_matches(o, expected.out, tol, "out")
    assert_pool_matches(pool, before, expected, tol)


def test_fused_sigmoid_positional_softplus_and_spec_decode(device):
    """Positional order A_log, a, b, dt_bias, q, k, v, beta, threshold (softplus), scale."""
    generator, q, k, v, cu, slots, accepted = spec_decode_inputs(device, seed=7)
    x = gating(generator, q.shape[1], device)
    pool = make_pool(generator, 13, torch.float32, device)
    before = pool.clone()
    expected = gdn_decode_reference(
        q,
        k,
        v,
        pool,
        **reference_gating(x),
        state_indices=slots,
        num_accepted_tokens=accepted,
        cu_seqlens=cu,
        softplus_beta=2.0,
        softplus_threshold=1.0,
        scale=0.1,
        use_qk_l2norm=False,
    )
    o, final = fused_sigmoid_gating_delta_rule_update(
        x["A_log"],
        x["a"],
        x["b"],
        x["dt_bias"],
        q,
        k,
        v,
        2.0,
        1.0,
        0.1,
        pool,
        True,
        cu,
        slots,
        accepted,
    )
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(o, expected.out, tol, "out")
    assert_pool_matches(pool, before, expected, tol)


def test_fused_sigmoid_not_in_place_spec_decode(device):
    generator, q, k, v, cu, slots, accepted = spec_decode_inputs(device, seed=8)
    x = gating(generator, q.shape[1], device)
    pool = make_pool(generator, 13, torch.float32, device)
    before = pool.clone()
    expected = gdn_decode_reference(
        q,
        k,
        v,
        pool,
        **reference_gating(x),
        state_indices=slots,
        num_accepted_tokens=accepted,
        cu_seqlens=cu,
        update_state=False,
        cache_columns=3,
        use_qk_l2norm=False,
    )
    o, states = fused_sigmoid_gating_delta_rule_update(
        **x,
        q=q,
        k=k,
        v=v,
        initial_state=pool,
        inplace_final_state=False,
        cu_seqlens=cu,
        ssm_state_indices=slots,
        num_accepted_tokens=accepted,
    )
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(o, expected.out, tol, "out")
    assert_matches(states, expected.intermediates.flatten(0, 1), tol, "per-token states")
    assert torch.equal(pool, before)


def test_fused_sigmoid_mixed_qkv_and_split_write_slots(device):
    generator = make_generator(9)
    batch = 3
    mixed = randn(generator, (batch, 2 * H * K + HV * V), torch.bfloat16, device)
    x = gating(generator, batch, device)
    pool = make_pool(generator, 7, torch.float32, device)
    before = pool.clone()
    read = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    write = torch.tensor([4, -1, 6], dtype=torch.int32, device=device)
    q = mixed[:, : H * K].view(batch, 1, H, K)
    k = mixed[:, H * K : 2 * H * K].view(batch, 1, H, K)
    v = mixed[:, 2 * H * K :].view(batch, 1, HV, V)
    expected = gdn_decode_reference(
        q,
        k,
        v,
        pool,
        A_log=x["A_log"],
        a=x["a"].unsqueeze(1),
        b=x["b"].unsqueeze(1),
        dt_bias=x["dt_bias"],
        state_indices=read,
        output_state_indices=write,
        use_qk_l2norm=False,
    )
    o, _ = fused_sigmoid_gating_delta_rule_update(
        **x,
        initial_state=pool,
        ssm_state_indices=read,
        ssm_state_indices_output=write,
        mixed_qkv=mixed,
        num_qk_heads=H,
        head_qk_dim=K,
        num_v_heads=HV,
        head_v_dim=V,
    )
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(o, expected.out, tol, "out")
    assert_pool_matches(pool, before, expected, tol)


def test_fused_sigmoid_unsupported(device):
    generator = make_generator(10)
    q, k, v = tokens_inputs(generator, (2, 1), torch.float32, device)
    x = gating(generator, 2, device)
    pool = make_pool(generator, 2, torch.float32, device)
    with pytest.raises(NotImplementedError, match="is_kda"):
        fused_sigmoid_gating_delta_rule_update(**x, q=q, k=k, v=v, initial_state=pool, is_kda=True)
    with pytest.raises(NotImplementedError, match="block_table"):
        fused_sigmoid_gating_delta_rule_update(
            **x,
            q=q,
            k=k,
            v=v,
            initial_state=pool,
            block_table=torch.zeros(2, 2, dtype=torch.int32, device=device),
        )
    with pytest.raises(ValueError, match="mixed_qkv and q/k/v"):
        fused_sigmoid_gating_delta_rule_update(
            **x,
            q=q,
            k=k,
            v=v,
            initial_state=pool,
            mixed_qkv=poisoned((2, 8), torch.float32, device),
        )
