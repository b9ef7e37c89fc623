"""hdk inside CUDA graphs and torch.compile(fullgraph=True): the op allocates nothing, never
synchronizes, and its Meta kernel lets the compiler trace it."""

import re

import pytest
import torch

import hdk
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
    randn,
    tolerance,
)
from conftest import CUDA_SKIP
from gdn_reference import gdn_decode_reference

_version = re.match(r"(\d+)\.(\d+)", torch.__version__)
TORCH_2 = (int(_version.group(1)), int(_version.group(2))) >= (2, 1)
needs_cuda = pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))
needs_compile = pytest.mark.skipif(
    not TORCH_2, reason=f"torch.compile needs torch >= 2.1, this is {torch.__version__}"
)


def step_inputs(generator, batch, tokens, device):
    return dict(
        q=randn(generator, (batch, tokens, H, K), torch.bfloat16, device),
        k=randn(generator, (batch, tokens, H, K), torch.bfloat16, device),
        v=randn(generator, (batch, tokens, HV, V), torch.bfloat16, device),
        **fused_gating(generator, (batch, tokens), dtype=torch.bfloat16, device=device),
    )


@needs_cuda
def test_cuda_graph_capture_and_replay():
    generator = make_generator(0)
    batch, tokens, device = 3, 2, "cuda"
    static = step_inputs(generator, batch, tokens, device)
    pool = make_pool(generator, 5, torch.bfloat16, device)
    indices = torch.tensor([4, -1, 1], dtype=torch.int32, device=device)
    out = torch.empty(batch, tokens, HV, V, dtype=torch.bfloat16, device=device)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    call = dict(static, state=pool, state_indices=indices, out=out, invalid_index_count=counter)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        hdk.gdn_decode(**call)  # warm-up outside the capture, as engines do
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        hdk.gdn_decode(**call)

    tol = tolerance(torch.bfloat16, torch.bfloat16)
    for step in range(3):
        fresh = step_inputs(make_generator(10 + step), batch, tokens, device)
        for name, tensor in fresh.items():
            static[name].copy_(tensor)
        indices.copy_(torch.tensor([step, -1, 3 + step % 2], dtype=torch.int32))
        out.fill_(float("nan"))
        before = pool.clone()
        expected = gdn_decode_reference(state=before, state_indices=indices, **static)
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, expected.out, tol, f"out, replay {step}")
        assert_pool_matches(pool, before, expected, tol, f"state, replay {step}")
    assert counter.item() == 0


def compiled_step(backend):
    def step(q, k, v, A_log, a, dt_bias, b, state, indices):
        out = hdk.gdn_decode(
            q, k, v, state, A_log=A_log, a=a, dt_bias=dt_bias, b=b, state_indices=indices
        )
        return out * 2.0  # something for the compiler to fuse after the op

    return torch.compile(step, fullgraph=True, backend=backend)


def check_compiled(device, backend):
    generator = make_generator(1)
    batch, tokens = 3, 1
    x = step_inputs(generator, batch, tokens, device)
    pool = make_pool(generator, 4, torch.float32, device)
    indices = torch.tensor([3, 0, -1], dtype=torch.int64, device=device)
    before = pool.clone()
    expected = gdn_decode_reference(state=pool, state_indices=indices, **x)
    step = compiled_step(backend)
    doubled = step(x["q"], x["k"], x["v"], x["A_log"], x["a"], x["dt_bias"], x["b"], pool, indices)
    tol = tolerance(torch.bfloat16, torch.float32)
    assert_matches(doubled / 2.0, expected.out, tol, "out")
    assert_pool_matches(pool, before, expected, tol)


@needs_cuda
@needs_compile
def test_torch_compile_fullgraph_cuda():
    check_compiled("cuda", "inductor")


@needs_compile
def test_torch_compile_fullgraph_cpu_functionalized():
    """aot_eager: dynamo + functionalization of the in-place op, without C++ code generation."""
    check_compiled("cpu", "aot_eager")
