"""hdk.compat.flashinfer: FlashInfer's argument order, defaults and returns; hdk's semantics.
The last tests compare it with the real FlashInfer where that imports and CUDA runs."""

import functools
import os
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
from conftest import CUDA_SKIP
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


# Against the real FlashInfer (flashinfer.gdn_decode): run where it imports and CUDA runs (the
# install of scripts/peers/flashinfer.sh, found as the benchmark finds it: see
# hdk.bench.peers.load_flashinfer), skipped with the reason elsewhere. FlashInfer and
# hdk.compat.flashinfer get the same inputs and copies of the same pool; outputs and states must
# agree within the tolerance of bf16 inputs (and a bf16 state, where the state is bf16). FlashInfer
# needs K = V = 128 (its bf16-state kernels exactly 128), so these cases have their own sizes.
# Its CuTe DSL kernels compile on first use (seconds each, cached in the install's workspace);
# HDK_SKIP_FLASHINFER=1 skips these tests.
FI_H, FI_HV, FI_K, FI_V = 2, 4, 128, 128
STATE_DTYPES = [torch.bfloat16, torch.float32]


@functools.cache
def _load_real_flashinfer():
    from hdk.bench.peers import load_flashinfer

    return load_flashinfer()


def real_flashinfer():
    """FlashInfer's entry points (``decode_pretranspose``, ``decode``, ``mtp``) or a skip."""
    if os.environ.get("HDK_SKIP_FLASHINFER"):
        pytest.skip("HDK_SKIP_FLASHINFER is set")
    if CUDA_SKIP is not None:
        pytest.skip(f"comparing with the real FlashInfer needs CUDA: {CUDA_SKIP}")
    fns, problem = _load_real_flashinfer()
    if fns is None:
        pytest.skip(problem)
    return fns


def fi_inputs(batch, tokens, seed=0):
    """bf16 q/k/v/a/b, fp32 A_log and dt_bias (FlashInfer's dtypes), on CUDA."""
    generator = make_generator(seed)
    gating = fused_gating(generator, (batch, tokens), heads=FI_HV, dtype=torch.bfloat16)
    x = dict(
        q=randn(generator, (batch, tokens, FI_H, FI_K), torch.bfloat16),
        k=randn(generator, (batch, tokens, FI_H, FI_K), torch.bfloat16),
        v=randn(generator, (batch, tokens, FI_HV, FI_V), torch.bfloat16),
        **gating,
    )
    return {name: tensor.to("cuda") for name, tensor in x.items()}, generator


def fi_pool(generator, slots, dtype, layout="vk"):
    shape = (slots, FI_HV, FI_V, FI_K) if layout == "vk" else (slots, FI_HV, FI_K, FI_V)
    return randn(generator, shape, dtype, "cuda", 0.5)


def fi_positional(x):
    return x["q"], x["k"], x["v"]


def fi_gating(x):
    return x["A_log"], x["a"], x["dt_bias"], x["b"]


def fi_slots(values):
    """int32 slot indices, as engines pass them (FlashInfer's bf16-state kernels document int32;
    int64 is hdk's own case above)."""
    return torch.tensor(values, dtype=torch.int32, device="cuda")


def agree(flashinfer_result, hdk_result, tol, what):
    """FlashInfer's tensor within `tol` (relative L2) of hdk's; hdk's zeros exact in both."""
    assert_matches(flashinfer_result, hdk_result.detach().cpu().double(), tol, what)


def pools_agree(flashinfer_pool, hdk_pool, before, written, tol):
    """Slots in `written` agree; every other slot is bit-for-bit `before` in both pools."""
    for slot in range(before.shape[0]):
        if slot in written:
            continue
        assert torch.equal(hdk_pool[slot], before[slot]), f"hdk changed slot {slot}"
        assert torch.equal(flashinfer_pool[slot], before[slot]), f"FlashInfer changed slot {slot}"
    index = sorted(written)
    agree(flashinfer_pool[index], hdk_pool[index], tol, f"states of slots {index}")


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_real_flashinfer_pretranspose_pool_decode(state_dtype):
    fi = real_flashinfer()
    x, generator = fi_inputs(4, 1)
    before = fi_pool(generator, 7, state_dtype)
    read = fi_slots([5, 2, 6, 1])
    ours, theirs = before.clone(), before.clone()
    out, returned = gated_delta_rule_decode_pretranspose(
        *fi_positional(x), None, *fi_gating(x), initial_state=ours, initial_state_indices=read
    )
    fi_out, fi_returned = fi.decode_pretranspose(
        *fi_positional(x), None, *fi_gating(x), initial_state=theirs, initial_state_indices=read
    )
    assert returned is ours and fi_returned is theirs and fi_out.dtype == out.dtype
    tol = tolerance(torch.bfloat16, state_dtype)
    agree(fi_out, out, tol, "out")
    pools_agree(theirs, ours, before, {5, 2, 6, 1}, tol)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_real_flashinfer_pretranspose_split_pool(state_dtype):
    """Read and write slots differ (scale given): both write only the write slots."""
    fi = real_flashinfer()
    x, generator = fi_inputs(4, 1, seed=1)
    before = fi_pool(generator, 8, state_dtype)
    read = fi_slots([1, 3, 5, 0])
    write = fi_slots([2, 4, 6, 7])
    ours, theirs = before.clone(), before.clone()
    options = dict(scale=0.1, initial_state_indices=read, output_state_indices=write)
    out, _ = gated_delta_rule_decode_pretranspose(
        *fi_positional(x), None, *fi_gating(x), initial_state=ours, **options
    )
    fi_out, _ = fi.decode_pretranspose(
        *fi_positional(x), None, *fi_gating(x), initial_state=theirs, **options
    )
    tol = tolerance(torch.bfloat16, state_dtype)
    agree(fi_out, out, tol, "out")
    pools_agree(theirs, ours, before, {2, 4, 6, 7}, tol)


def test_real_flashinfer_fp32_padding_is_skipped_like_hdk():
    """FlashInfer's fp32 T = 1 path skips a request with a negative read index (zero output,
    no slot touched), as hdk does."""
    fi = real_flashinfer()
    x, generator = fi_inputs(3, 1, seed=2)
    before = fi_pool(generator, 6, torch.float32)
    read = fi_slots([3, -1, 5])
    ours, theirs = before.clone(), before.clone()
    out, _ = gated_delta_rule_decode_pretranspose(
        *fi_positional(x), None, *fi_gating(x), initial_state=ours, initial_state_indices=read
    )
    fi_out, _ = fi.decode_pretranspose(
        *fi_positional(x), None, *fi_gating(x), initial_state=theirs, initial_state_indices=read
    )
    assert torch.all(out[1] == 0) and torch.all(fi_out[1] == 0)
    tol = tolerance(torch.bfloat16, torch.float32)
    agree(fi_out, out, tol, "out")
    pools_agree(theirs, ours, before, {3, 5}, tol)


def test_real_flashinfer_bf16_padding_writes_slot_zero_hdk_does_not():
    """The documented difference: on FlashInfer's bf16 path a negative read index runs on slot 0
    (read and written; the pool reserves it); hdk leaves slot 0 alone and outputs zeros. The
    real requests agree."""
    fi = real_flashinfer()
    x, generator = fi_inputs(3, 1, seed=3)
    before = fi_pool(generator, 4, torch.bfloat16)  # slot 0: FlashInfer's null buffer
    read = fi_slots([-1, 2, 3])
    ours, theirs = before.clone(), before.clone()
    out, _ = gated_delta_rule_decode_pretranspose(
        *fi_positional(x), None, *fi_gating(x), initial_state=ours, initial_state_indices=read
    )
    fi_out, _ = fi.decode_pretranspose(
        *fi_positional(x), None, *fi_gating(x), initial_state=theirs, initial_state_indices=read
    )
    tol = tolerance(torch.bfloat16, torch.bfloat16)
    assert torch.all(out[0] == 0)  # FlashInfer's row 0 is undefined
    agree(fi_out[1:], out[1:], tol, "out of the real requests")
    assert torch.equal(ours[0], before[0])
    assert not torch.equal(theirs[0], before[0]), "FlashInfer no longer writes slot 0 for -1"
    theirs[0] = before[0]
    pools_agree(theirs, ours, before, {2, 3}, tol)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_real_flashinfer_verify_caches_every_token(state_dtype):
    """T > 1 verify: pool only read, the state after every token in the buffer (shape[1] = T:
    with more steps FlashInfer's row pitch would differ, see the module docstring). bf16 pools
    go through gated_delta_rule_decode_pretranspose (FlashInfer's gated_delta_rule_mtp takes
    fp32 only), fp32 pools through gated_delta_rule_mtp."""
    fi = real_flashinfer()
    batch, tokens = 3, 3
    x, generator = fi_inputs(batch, tokens, seed=4)
    before = fi_pool(generator, 6, state_dtype)
    read = fi_slots([4, 0, 2])
    ours, theirs = before.clone(), before.clone()
    shape = (batch, tokens, FI_HV, FI_V, FI_K)
    buffer = poisoned(shape, state_dtype, "cuda")
    fi_buffer = poisoned(shape, state_dtype, "cuda")
    if state_dtype == torch.bfloat16:
        options = dict(initial_state_indices=read, disable_state_update=True)
        out, _ = gated_delta_rule_decode_pretranspose(
            *fi_positional(x),
            None,
            *fi_gating(x),
            initial_state=ours,
            intermediate_states_buffer=buffer,
            **options,
        )
        fi_out, _ = fi.decode_pretranspose(
            *fi_positional(x),
            None,
            *fi_gating(x),
            initial_state=theirs,
            intermediate_states_buffer=fi_buffer,
            **options,
        )
    else:
        out, _ = gated_delta_rule_mtp(
            *fi_positional(x),
            ours,
            read,
            *fi_gating(x),
            intermediate_states_buffer=buffer,
            disable_state_update=True,
        )
        fi_out, _ = fi.mtp(
            *fi_positional(x),
            theirs,
            read,
            *fi_gating(x),
            intermediate_states_buffer=fi_buffer,
            disable_state_update=True,
        )
    tol = tolerance(torch.bfloat16, state_dtype)
    agree(fi_out, out, tol, "out")
    agree(fi_buffer, buffer, tol, "intermediate states")
    assert torch.equal(ours, before) and torch.equal(theirs, before)


@pytest.mark.parametrize("state_dtype", STATE_DTYPES)
def test_real_flashinfer_multi_token_update_to_split_slots(state_dtype):
    """T > 1 with the pool updated: final states to separate write slots."""
    fi = real_flashinfer()
    batch, tokens = 3, 2
    x, generator = fi_inputs(batch, tokens, seed=5)
    before = fi_pool(generator, 8, state_dtype)
    read = fi_slots([0, 5, 3])
    write = fi_slots([6, 7, 1])
    ours, theirs = before.clone(), before.clone()
    options = dict(output_state_indices=write, disable_state_update=False)
    if state_dtype == torch.bfloat16:
        out, _ = gated_delta_rule_decode_pretranspose(
            *fi_positional(x), None, *fi_gating(x), initial_state=ours,
            initial_state_indices=read, **options,
        )  # fmt: skip
        fi_out, _ = fi.decode_pretranspose(
            *fi_positional(x), None, *fi_gating(x), initial_state=theirs,
            initial_state_indices=read, **options,
        )  # fmt: skip
    else:
        out, _ = gated_delta_rule_mtp(*fi_positional(x), ours, read, *fi_gating(x), **options)
        fi_out, _ = fi.mtp(*fi_positional(x), theirs, read, *fi_gating(x), **options)
    tol = tolerance(torch.bfloat16, state_dtype)
    agree(fi_out, out, tol, "out")
    pools_agree(theirs, ours, before, {6, 7, 1}, tol)


def test_real_flashinfer_mtp_ssm_state_indices():
    """gated_delta_rule_mtp's per-token scatter (fp32): the state after token t to slot
    ssm_state_indices[n, t], the read slots not written back."""
    fi = real_flashinfer()
    x, generator = fi_inputs(2, 3, seed=6)
    before = fi_pool(generator, 10, torch.float32)
    read = fi_slots([1, 0])
    per_token = fi_slots([[4, 5, 6], [7, 8, 9]])
    ours, theirs = before.clone(), before.clone()
    options = dict(ssm_state_indices=per_token, disable_state_update=False)
    out, _ = gated_delta_rule_mtp(*fi_positional(x), ours, read, *fi_gating(x), **options)
    fi_out, _ = fi.mtp(*fi_positional(x), theirs, read, *fi_gating(x), **options)
    tol = tolerance(torch.bfloat16, torch.float32)
    agree(fi_out, out, tol, "out")
    pools_agree(theirs, ours, before, set(range(4, 10)), tol)


def test_real_flashinfer_decode_k_major_state():
    fi = real_flashinfer()
    x, generator = fi_inputs(3, 1, seed=7)
    before = fi_pool(generator, 3, torch.float32, layout="kv")  # [B, HV, K, V]
    ours, theirs = before.clone(), before.clone()
    out, returned = gated_delta_rule_decode(*fi_positional(x), ours, *fi_gating(x), 0.1)
    fi_out, fi_returned = fi.decode(*fi_positional(x), theirs, *fi_gating(x), 0.1)
    assert returned is ours and fi_returned is theirs
    tol = tolerance(torch.bfloat16, torch.float32)
    agree(fi_out, out, tol, "out")
    agree(theirs, ours, tol, "state")
