"""hdk.dsv4.route and hdk.topk against float64 torch references, on every available
device: dense and hash routing, logits (fp32, bf16) and the fused gate, planted ties and NaN,
row lengths, errors, and CUDA-graph capture."""

import math

import pytest
import torch

import hdk
import hdk.dsv4
from conftest import CUDA_SKIP

needs_cuda = pytest.mark.skipif(CUDA_SKIP is not None, reason=str(CUDA_SKIP))


def generator(seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return g


# ------------------------------------------------------------------------------------------
# Router reference and comparison


def route_reference(logits64, bias, top_k, route_scale, selected=None):
    """float64: s = sqrt(softplus(x)); top_k of s + bias (ties: lower index); renormalized s."""
    s = torch.sqrt(torch.nn.functional.softplus(logits64, beta=1.0, threshold=1e9))
    keys = s + (bias.to(torch.float64) if bias is not None else 0.0)
    if selected is None:
        selected = torch.sort(keys, dim=-1, descending=True, stable=True).indices[:, :top_k]
    gathered = torch.gather(s, 1, selected.long())
    weights = gathered / gathered.sum(-1, keepdim=True) * route_scale
    invalid = torch.isnan(logits64).any(-1) | torch.isnan(keys).any(-1)
    return s, keys, selected, weights, invalid


def check_route(ids, weights, logits64, bias, top_k, route_scale, tol_key, tol_weight):
    """The selection may differ from the reference only between keys within tol_key; the
    weights must match the reference formula at the chosen ids."""
    ids = ids.cpu()
    weights = weights.cpu().to(torch.float64)
    s, keys, _, _, invalid = route_reference(logits64, bias, top_k, route_scale)
    for n in range(ids.shape[0]):
        if invalid[n]:
            assert (ids[n] == -1).all() and (weights[n] == 0).all(), f"row {n} must be invalid"
            continue
        chosen = ids[n].long()
        assert len(set(chosen.tolist())) == top_k, f"row {n}: repeated expert {chosen.tolist()}"
        k_chosen = keys[n, chosen]
        # Ordered (exact ties toward the lower index), and nothing unselected ranks above.
        for j in range(top_k - 1):
            a, b = chosen[j].item(), chosen[j + 1].item()
            if keys[n, a] == keys[n, b]:
                assert a < b, f"row {n}: tie between {a} and {b} not broken toward the lower"
            else:
                assert keys[n, a] >= keys[n, b] - tol_key, f"row {n}: slots out of order"
        mask = torch.ones(keys.shape[1], dtype=torch.bool)
        mask[chosen] = False
        if mask.any():
            assert keys[n, mask].max() <= k_chosen.min() + tol_key, f"row {n}: missed an expert"
            for u in mask.nonzero().flatten().tolist():
                for a in chosen.tolist():
                    if keys[n, u] == keys[n, a]:
                        assert u > a, f"row {n}: tie between {a} and {u} not broken toward the lower"
        gathered = s[n, chosen]
        want = gathered / gathered.sum() * route_scale
        assert torch.allclose(weights[n], want, rtol=tol_weight, atol=1e-7), (
            f"row {n}: weights {weights[n].tolist()} vs {want.tolist()}"
        )


@pytest.mark.parametrize("experts", [256, 384])
@pytest.mark.parametrize("rows", [1, 7, 64])
@pytest.mark.parametrize("top_k", [1, 6, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_logits(device, experts, rows, top_k, dtype):
    g = generator(experts * 131 + rows * 7 + top_k)
    logits = (torch.randn(rows, experts, generator=g) * 3).to(dtype)
    # Planted ties: a row of few distinct values, and duplicated columns with equal bias.
    if rows > 2:
        logits[1] = (logits[1].float() * 2).round().to(dtype) / 2
    bias = (torch.randint(0, 4, (experts,), generator=g) * 0.25 - 0.25).float()
    logits[:, 5] = logits[:, 4]
    bias[5] = bias[4]
    if rows > 3:
        logits[3, experts // 2] = float("nan")
    counter = torch.zeros(1, dtype=torch.int64, device=device)
    ids, weights = hdk.dsv4.route(
        logits.to(device), bias=bias.to(device), top_k=top_k, route_scale=1.5,
        invalid_count=counter,
    )
    assert ids.dtype == torch.int32 and weights.dtype == torch.float32
    assert ids.shape == (rows, top_k) and ids.device.type == torch.device(device).type
    logits64 = logits.to(torch.float64)
    check_route(ids, weights, logits64, bias, top_k, 1.5, tol_key=1e-5, tol_weight=1e-5)
    assert counter.item() == (1 if rows > 3 else 0)


@pytest.mark.parametrize("experts,hidden_size", [(256, 512), (384, 7168)])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_fused_gate(device, experts, hidden_size, rows):
    g = generator(rows + experts)
    hidden = torch.randn(rows, hidden_size, generator=g).to(torch.bfloat16)
    gate = (torch.randn(experts, hidden_size, generator=g) / math.sqrt(hidden_size)).to(
        torch.bfloat16
    )
    bias = torch.rand(experts, generator=g) - 0.5
    slabs = hdk.dsv4.route_workspace_slabs(rows)
    workspace = torch.full((slabs, rows, experts), float("nan"), device=device)
    ids, weights = hdk.dsv4.route(
        hidden=hidden.to(device), gate_weight=gate.to(device), bias=bias.to(device), top_k=6,
        route_scale=2.5, logits_workspace=workspace,
    )
    logits64 = hidden.to(torch.float64) @ gate.to(torch.float64).T
    magnitude = hidden.to(torch.float64).abs() @ gate.to(torch.float64).abs().T
    logits = workspace[0].cpu().to(torch.float64)
    assert ((logits - logits64).abs() <= 1e-5 * magnitude + 1e-6).all()
    tol = 1e-5 * magnitude.max().item()
    check_route(ids, weights, logits64, bias, 6, 2.5, tol_key=tol, tol_weight=1e-5 + 2 * tol)


def test_fused_gate_allocates_workspace(device):
    g = generator(3)
    hidden = torch.randn(5, 64, generator=g).to(torch.bfloat16).to(device)
    gate = torch.randn(32, 64, generator=g).to(torch.bfloat16).to(device)
    ids, weights = hdk.dsv4.route(hidden=hidden, gate_weight=gate, top_k=4)
    logits64 = hidden.cpu().to(torch.float64) @ gate.cpu().to(torch.float64).T
    tol = 1e-5 * (hidden.cpu().double().abs() @ gate.cpu().double().abs().T).max().item()
    check_route(ids, weights, logits64, None, 4, 1.0, tol_key=tol, tol_weight=1e-5 + 2 * tol)


@pytest.mark.parametrize("token_dtype", [torch.int32, torch.int64])
def test_hash_routing(device, token_dtype):
    g = generator(11)
    rows, experts, vocab, top_k = 9, 256, 1000, 6
    logits = torch.randn(rows, experts, generator=g)
    table = torch.randint(0, experts, (vocab, top_k), generator=g, dtype=torch.int32)
    tokens = torch.randint(0, vocab, (rows,), generator=g).to(token_dtype)
    ids, weights = hdk.dsv4.route(
        logits.to(device), token_ids=tokens.to(device), tid2eid=table.to(device), top_k=top_k,
        route_scale=1.5,
    )
    selected = table[tokens.long()]
    assert torch.equal(ids.cpu(), selected)
    *_, want, _ = route_reference(logits.double(), None, top_k, 1.5, selected=selected)
    assert torch.allclose(weights.cpu().double(), want, rtol=1e-5, atol=1e-7)


def test_hash_token_out_of_table(device):
    rows, experts, vocab, top_k = 4, 64, 10, 2
    logits = torch.randn(rows, experts)
    table = torch.zeros(vocab, top_k, dtype=torch.int32)
    tokens = torch.tensor([1, vocab, 2, -1], dtype=torch.int32)
    counter = torch.zeros(1, dtype=torch.int32, device=device)
    args = dict(token_ids=tokens.to(device), tid2eid=table.to(device), top_k=top_k,
                invalid_count=counter)
    if device == "cpu":
        with pytest.raises(hdk.HdkError, match=r"token_ids\[1\] = 10 is outside tid2eid"):
            hdk.dsv4.route(logits, **args)
        return
    ids, weights = hdk.dsv4.route(logits.to(device), **args)
    assert ids.cpu()[[1, 3]].eq(-1).all() and weights.cpu()[[1, 3]].eq(0).all()
    assert ids.cpu()[[0, 2]].eq(0).all()
    assert counter.item() == 2


def test_route_errors():
    logits = torch.randn(3, 8)
    with pytest.raises(hdk.HdkError, match=r"option 'top_k' must be at most E = 8.*got 9"):
        hdk.dsv4.route(logits, top_k=9)
    with pytest.raises(hdk.HdkError, match=r"option 'top_k' must be at most 2048, got 4096"):
        hdk.dsv4.route(logits, top_k=4096)
    with pytest.raises(hdk.HdkError, match=r"argument 'bias' must have shape \[E\] = \[8\]"):
        hdk.dsv4.route(logits, bias=torch.zeros(7))
    with pytest.raises(hdk.HdkError, match=r"argument 'logits' must have dtype float32 or bfloat16"):
        hdk.dsv4.route(logits.half())
    with pytest.raises(hdk.HdkError, match=r"argument 'gate_weight' must have shape \[E, D\]"):
        hdk.dsv4.route(hidden=torch.zeros(3, 16, dtype=torch.bfloat16),
                       gate_weight=torch.zeros(8, 8, dtype=torch.bfloat16))
    with pytest.raises(hdk.HdkError, match=r"no scores given"):
        hdk.dsv4.route(None)
    with pytest.raises(TypeError, match=r"argument 'bias' must be a torch.Tensor"):
        hdk.dsv4.route(logits, bias=[0.0] * 8)


# ------------------------------------------------------------------------------------------
# topk


def topk_reference(values, k, lengths=None):
    """Full sort per row: descending, NaN after every number, equal values by column."""
    rows, columns = values.shape
    out_values = torch.full((rows, k), float("-inf"))
    out_indices = torch.full((rows, k), -1, dtype=torch.int32)
    for n in range(rows):
        length = columns if lengths is None else min(max(int(lengths[n]), 0), columns)
        row = values[n, :length].tolist()
        order = sorted(
            range(length),
            key=lambda i: (math.isnan(row[i]), 0.0 if math.isnan(row[i]) else -row[i], i),
        )[:k]
        for j, i in enumerate(order):
            out_values[n, j] = values[n, i]
            out_indices[n, j] = i
    return out_values, out_indices


@pytest.mark.parametrize("shape,k", [((1, 1), 1), ((13, 100), 6), ((4, 4096), 512),
                                     ((3, 777), 1000), ((64, 300), 8)])
@pytest.mark.parametrize("lengths_dtype", [None, torch.int32, torch.int64])
def test_topk(device, shape, k, lengths_dtype):
    g = generator(shape[0] * shape[1] + k)
    values = torch.randn(shape, generator=g)
    values[:, ::7] = (values[:, ::7] * 2).round() / 2  # ties
    values.view(-1)[::97] = float("nan")
    values.view(-1)[5::101] = float("-inf")
    values.view(-1)[3::89] = -0.0
    lengths = None
    if lengths_dtype is not None:
        lengths = torch.randint(-2, shape[1] + 3, (shape[0],), generator=g).to(lengths_dtype)
    got_values, got_indices = hdk.topk(
        values.to(device), k, None if lengths is None else lengths.to(device)
    )
    want_values, want_indices = topk_reference(values, k, lengths)
    assert torch.equal(got_indices.cpu(), want_indices)
    assert torch.equal(
        got_values.cpu().view(torch.int32), want_values.view(torch.int32)
    ), "values must be the input's bits"


def test_topk_errors():
    values = torch.randn(2, 10)
    with pytest.raises(hdk.HdkError, match=r"argument 'k' must be in 0\.\.2048, got 4096"):
        hdk.topk(values, 4096)
    with pytest.raises(hdk.HdkError, match=r"argument 'values' must have dtype float32, got float16"):
        hdk.topk(values.half(), 3)
    with pytest.raises(hdk.HdkError, match=r"argument 'row_lengths' must have shape \[N\] = \[2\]"):
        hdk.topk(values, 3, torch.zeros(3, dtype=torch.int32))


# ------------------------------------------------------------------------------------------
# CUDA graphs


@needs_cuda
@pytest.mark.parametrize("rows", [4, 40])  # the CUDA-core and the split gate kernel
def test_cuda_graph_capture(rows):
    g = generator(5)
    hidden = torch.randn(rows, 512, generator=g).to(torch.bfloat16).cuda()
    gate = (torch.randn(256, 512, generator=g) / 20).to(torch.bfloat16).cuda()
    bias = (torch.rand(256, generator=g) - 0.5).cuda()
    values = torch.randn(8, 5000, generator=g).cuda()
    ids = torch.empty(rows, 6, dtype=torch.int32, device="cuda")
    weights = torch.empty(rows, 6, device="cuda")
    workspace = torch.empty(hdk.dsv4.route_workspace_slabs(rows), rows, 256, device="cuda")
    top_values = torch.empty(8, 100, device="cuda")
    top_indices = torch.empty(8, 100, dtype=torch.int32, device="cuda")

    def step():
        hdk.dsv4.route(hidden=hidden, gate_weight=gate, bias=bias, topk_ids=ids,
                       topk_weights=weights, logits_workspace=workspace)
        hdk.topk(values, 100, out_values=top_values, out_indices=top_indices)

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    hidden.copy_(torch.randn(rows, 512, generator=g).to(torch.bfloat16))
    values.copy_(torch.randn(8, 5000, generator=g))
    graph.replay()
    torch.cuda.synchronize()
    logits64 = hidden.cpu().double() @ gate.cpu().double().T
    tol = 1e-5 * (hidden.cpu().double().abs() @ gate.cpu().double().abs().T).max().item()
    check_route(ids, weights, logits64, bias.cpu(), 6, 1.0, tol_key=tol, tol_weight=1e-5 + 2 * tol)
    want_values, want_indices = topk_reference(values.cpu(), 100)
    assert torch.equal(top_indices.cpu(), want_indices)
