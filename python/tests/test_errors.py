"""Bad calls raise a Python exception whose message is hdk's and names the argument."""

import pytest
import torch

import hdk
from cases import HV, H, K, V, fused_gating, make_generator, make_pool, randn
from conftest import CUDA_SKIP


def valid_call(device, batch=2, tokens=1):
    generator = make_generator(0)
    return dict(
        q=randn(generator, (batch, tokens, H, K), torch.float32, device),
        k=randn(generator, (batch, tokens, H, K), torch.float32, device),
        v=randn(generator, (batch, tokens, HV, V), torch.float32, device),
        state=make_pool(generator, batch, torch.float32, device),
        **fused_gating(generator, (batch, tokens), device=device),
    )


def raises_hdk_error(match, **kwargs):
    with pytest.raises(hdk.HdkError, match=match) as caught:
        hdk.gdn_decode(**kwargs)
    message = str(caught.value)
    assert "Exception raised from" not in message, "the C++ backtrace leaked into the message"
    # Raised from C++: re-raised without the torch exception chained to it.
    assert caught.value.__context__ is None or caught.value.__suppress_context__
    return caught.value


def test_valid_call_passes(device):
    hdk.gdn_decode(**valid_call(device))


def test_wrong_shape_names_the_argument(device):
    call = valid_call(device)
    call["k"] = call["k"][..., : K // 2]
    error = raises_hdk_error(r"argument 'k' must have shape \[B, T, H, K\]", **call)
    assert str(error).startswith("hdk::gdn::decode: ")


def test_hdk_error_is_value_and_runtime_error(device):
    call = valid_call(device)
    call["v"] = call["v"].to(torch.bfloat16)
    with pytest.raises(ValueError, match="argument 'v' must have the dtype of 'q'"):
        hdk.gdn_decode(**call)
    with pytest.raises(RuntimeError, match="argument 'v' must have the dtype of 'q'"):
        hdk.gdn_decode(**call)


@pytest.mark.parametrize(
    "name, replacement, match",
    [
        (
            "state",
            lambda t: t.double(),
            "argument 'state' must have dtype float32 or bfloat16, got float64$",
        ),
        ("state", lambda t: t.half(), "argument 'state' must have dtype float32 or bfloat16"),
        ("A_log", lambda t: t.bfloat16(), "argument 'A_log' must have dtype float32"),
        ("a", lambda t: t[:, :, :2], "argument 'a' must have shape"),
        ("q", lambda t: t.transpose(2, 3), "argument 'q'"),
        ("b", lambda t: t.to(torch.int32), "argument 'b' must have dtype"),
    ],
)
def test_bad_argument(device, name, replacement, match):
    call = valid_call(device)
    call[name] = replacement(call[name])
    raises_hdk_error(match, **call)


def test_missing_gating(device):
    call = valid_call(device)
    del call["b"]
    raises_hdk_error("argument 'b' is required for fused gating", **call)


def test_both_gating_sets(device):
    call = valid_call(device)
    call["g"] = torch.zeros(2, 1, HV, device=device)
    raises_hdk_error("give exactly one gating set", **call)


def test_bad_indices(device):
    call = valid_call(device)
    raises_hdk_error(
        "argument 'state_indices' must have dtype int32 or int64",
        state_indices=torch.zeros(2, dtype=torch.float32, device=device),
        **call,
    )
    raises_hdk_error(
        "argument 'num_accepted_tokens' needs 2-D state_indices",
        state_indices=torch.zeros(2, dtype=torch.int32, device=device),
        num_accepted_tokens=torch.ones(2, dtype=torch.int32, device=device),
        **call,
    )


def test_out_overlapping_an_input(device):
    call = valid_call(device)
    raises_hdk_error("argument 'out' overlaps 'v'", out=call["v"], **call)


def test_bad_layout_and_out_dtype(device):
    call = valid_call(device)
    raises_hdk_error("option 'layout' must be", layout="vkv", **call)
    raises_hdk_error(
        "argument 'out' has dtype",
        out=torch.empty(2, 1, HV, V, device=device),
        out_dtype=torch.bfloat16,
        **call,
    )


def test_bad_option_values(device):
    call = valid_call(device)
    raises_hdk_error("option 'scale' must be finite", scale=float("inf"), **call)
    raises_hdk_error("option 'softplus_beta' must be finite and > 0", softplus_beta=0.0, **call)


@pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
def test_mixed_devices():
    call = valid_call("cuda")
    call["A_log"] = call["A_log"].cpu()
    raises_hdk_error("argument 'A_log' is on cpu but q, k, v, .* are on cuda:0", **call)


def test_not_a_tensor():
    call = valid_call("cpu")
    call["q"] = call["q"].tolist()
    with pytest.raises(TypeError, match="argument 'q' must be a torch.Tensor, got list"):
        hdk.gdn_decode(**call)
    call = valid_call("cpu")
    with pytest.raises(TypeError, match="argument 'state_indices' must be a torch.Tensor or None"):
        hdk.gdn_decode(state_indices=[0, 1], **call)
