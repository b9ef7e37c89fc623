"""hdk.integrations.transformers on tiny random models: decode on hdk against transformers' own.

Skipped where transformers (with its qwen3_next and deepseek_v4 models) is not installed. On a
CUDA machine the models run on the GPU at the sizes of docs/integrations.md (300-token prompts,
100 decode steps); without one, hdk's CPU backend runs shorter sequences.
"""

import contextlib

import pytest
import torch

import hdk

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.deepseek_v4")
pytest.importorskip("transformers.models.qwen3_next")

from hdk.integrations import _gated_deltanet  # noqa: E402
from hdk.integrations import transformers as hdk_tf  # noqa: E402
from hdk.integrations import tiny_models  # noqa: E402

ON_CUDA = torch.cuda.is_available() and hdk.built_with_cuda() and hdk.extension_has_cuda()
DEVICE = "cuda" if ON_CUDA else "cpu"
OPTIONS = {} if ON_CUDA else {"allow_cpu": True}
# (prompt, decode steps): the GPU crosses an HCA window (383) in decode; the CPU crosses 127.
PROMPT, STEPS = (300, 100) if ON_CUDA else (120, 12)


def _logit_gaps(reference, logits):
    """Mean and max |difference| over the reference's std, and the argmax agreement."""
    std = reference.float().std().item()
    gap = (reference.float() - logits.float()).abs()
    agree = (reference.argmax(-1) == logits.argmax(-1)).float().mean().item()
    return gap.mean().item() / std, gap.max().item() / std, agree


@contextlib.contextmanager
def _enabled(model, **options):
    """hdk enabled on `model` for a block (the CPU backend where there is no GPU); the runtime."""
    hdk_tf.enable(model, **options, **OPTIONS)
    try:
        yield hdk_tf.runtime(model)
    finally:
        hdk_tf.disable(model)


# -- Qwen3-Next ------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"])
def qwen3_next(request):
    """The fp32 Gated DeltaNet models: Qwen3-Next, Qwen3.5 and Qwen3.5-MoE (text)."""
    if request.param == "qwen3_next":
        return tiny_models.qwen3_next(device=DEVICE, dtype=torch.float32)
    moe = request.param == "qwen3_5_moe_text"
    return tiny_models.qwen3_5(moe=moe, device=DEVICE, dtype=torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_qwen3_next_step_matches_the_transformers_function(dtype):
    """hdk's step against transformers' own torch_recurrent_gated_delta_rule on the same
    tensors: the fp32 state to fp32 rounding, the output to one rounding of its dtype."""
    module = __import__(_gated_deltanet.MODEL_MODULES["qwen3_next"], fromlist=["_"])
    reference = getattr(
        module.torch_recurrent_gated_delta_rule,
        "hdk_original",
        module.torch_recurrent_gated_delta_rule,
    )
    generator = torch.Generator().manual_seed(11)
    batch, heads, dim = 3, 8, 128

    def draw(*shape, scale=1.0):
        return (torch.randn(shape, generator=generator) * scale).to(DEVICE)

    q, k, v = (draw(batch, 1, heads, dim).to(dtype) for _ in range(3))
    g = -draw(batch, 1, heads).abs()
    beta = draw(batch, 1, heads).sigmoid().to(dtype)
    state = draw(batch, heads, dim, dim, scale=0.1)
    out, expected_state = reference(
        q,
        k,
        v,
        g,
        beta,
        initial_state=state.clone(),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    hdk_out, hdk_state = _gated_deltanet._hdk_step(q, k, v, g, beta, state, True)
    assert hdk_state is state  # updated in place, handed back as the cache's tensor
    assert (
        hdk_state - expected_state
    ).abs().max().item() <= 1e-6 * expected_state.abs().max().item() + 1e-7
    ulp = 2.0**-8 if dtype == torch.bfloat16 else 2.0**-21
    assert ((hdk_out.float() - out.float()).abs() <= ulp * out.float().abs() + 1e-7).all()


def _generate(model, ids, steps):
    with torch.no_grad():
        result = model.generate(
            ids,
            max_new_tokens=steps,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    return result.sequences, torch.stack(result.logits, 1)


def test_qwen3_next_decodes_on_hdk_with_transformers_tokens(qwen3_next, monkeypatch):
    calls = []
    original = _gated_deltanet.gdn_decode
    monkeypatch.setattr(
        _gated_deltanet, "gdn_decode", lambda *a, **k: (calls.append(1), original(*a, **k))[1]
    )
    ids = torch.randint(0, 1024, (3, 40), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    tokens, logits = _generate(qwen3_next, ids, 24)
    assert not calls
    with _enabled(qwen3_next):
        assert hdk_tf.is_enabled(qwen3_next)
        hdk_tokens, hdk_logits = _generate(qwen3_next, ids, 24)
    # 23 decode steps (the first token comes from the prefill) x 3 GatedDeltaNet layers.
    assert len(calls) == 23 * 3
    assert torch.equal(tokens, hdk_tokens)
    # The same fp32 recurrence in another summation order (an fp32 model).
    assert (logits - hdk_logits).abs().max().item() <= 2e-5 * max(1.0, logits.abs().max().item())
    # disable() restores transformers' function and arithmetic.
    model_type = qwen3_next.config.model_type
    module = __import__(_gated_deltanet.MODEL_MODULES[model_type], fromlist=["_"])
    assert not hasattr(module.torch_recurrent_gated_delta_rule, "hdk_original")
    again_tokens, again_logits = _generate(qwen3_next, ids, 24)
    assert torch.equal(again_tokens, tokens) and torch.equal(again_logits, logits)
    assert len(calls) == 23 * 3


def test_qwen3_next_bf16_teacher_forced_against_transformers():
    """A bf16 model: each step's output is within one bf16 rounding of transformers' (above),
    and a rounding flips a near tie of the tiny model's flat logits now and then (or an
    expert choice), so the logits are compared under teacher forcing."""
    model = tiny_models.qwen3_next(device=DEVICE, dtype=torch.bfloat16)
    ids = torch.randint(0, 1024, (3, 40), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    tokens, reference = _generate(model, ids, 24)
    with _enabled(model):
        logits = _teacher_forced(model, tokens, 40)
    mean, worst, agree = _logit_gaps(reference[:, 1:], logits[:, 1:])
    print(f"qwen3_next bf16: mean {mean:.4f} max {worst:.4f} x std, argmax {agree:.3f}")
    assert mean <= 0.04 and agree >= 0.85


def test_qwen3_next_refusal_leaves_the_model_as_it_was():
    model = tiny_models.qwen3_next(device="cpu", dtype=torch.float32, layers=4)
    with pytest.raises(hdk.HdkError, match="hdk serves CUDA tensors"):
        hdk_tf.enable(model)
    assert not hdk_tf.is_enabled(model)
    assert not any(m._forward_pre_hooks for m in model.modules())
    module = __import__(_gated_deltanet.MODEL_MODULES["qwen3_next"], fromlist=["_"])
    assert not hasattr(module.torch_recurrent_gated_delta_rule, "hdk_original")
    with pytest.raises(hdk.HdkError, match="not enabled"):
        hdk_tf.disable(model)


# -- DeepSeek-V4 -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deepseek_v4():
    return tiny_models.deepseek_v4(device=DEVICE)


class _IndexerRecorder:
    """Records transformers' indexer top-k (entry ordinals) per call, and hdk's."""

    def __init__(self, model):
        module = __import__(type(model).__module__, fromlist=["_"])
        self.handles = [
            m.register_forward_hook(self._record)
            for m in model.modules()
            if isinstance(m, module.DeepseekV4Indexer)
        ]
        self.calls = []

    def _record(self, module, args, output):
        self.calls.append(output[:, -1].detach().cpu())

    def close(self):
        for handle in self.handles:
            handle.remove()


def _overlap(reference_calls, hdk_calls):
    """Mean fraction of each reference top-k set (valid entries) that hdk selected too."""
    shares = []
    for ref, new in zip(reference_calls, hdk_calls):
        for a, b in zip(ref.tolist(), new.tolist()):
            a = {x for x in a if x >= 0}
            b = {x for x in b if x >= 0}
            if a:
                shares.append(len(a & b) / len(a))
    return sum(shares) / len(shares)


def _teacher_forced(model, tokens, prompt):
    """Logits of the next token after each of the prompt's last token and the decode tokens,
    decoding ``tokens[:, prompt:]`` one at a time after a prefill of ``tokens[:, :prompt]``."""
    with torch.no_grad():
        out = model(input_ids=tokens[:, :prompt], use_cache=True)
        cache = out.past_key_values
        logits = [out.logits[:, -1]]
        for i in range(prompt, tokens.shape[1] - 1):
            out = model(input_ids=tokens[:, i : i + 1], past_key_values=cache, use_cache=True)
            logits.append(out.logits[:, -1])
    return torch.stack(logits, 1)


def _recording_index_topk(runtime, calls):
    original = runtime.manager.index_topk

    def index_topk(*args, **kwargs):
        result = original(*args, **kwargs)
        if not (ON_CUDA and torch.cuda.is_current_stream_capturing()):
            calls.append(result[0].detach().cpu())
        return result

    runtime.manager.index_topk = index_topk


@pytest.mark.parametrize("cuda_graph", [False, True] if ON_CUDA else [False])
def test_deepseek_v4_prefill_handoff_then_decode_against_transformers(deepseek_v4, cuda_graph):
    model = deepseek_v4
    ids = torch.randint(0, 1024, (2, PROMPT), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    recorder = _IndexerRecorder(model)
    try:
        tokens, reference = _generate(model, ids, STEPS)
    finally:
        recorder.close()
    # The prefill's calls (one per CSA layer) come first; the decode's follow.
    csa_layers = model.config.layer_types.count("compressed_sparse_attention")
    reference_index = recorder.calls[csa_layers:]
    hdk_index = []
    with _enabled(model, max_requests=2, max_context=1024, cuda_graph=cuda_graph) as runtime:
        _recording_index_topk(runtime, hdk_index)
        logits = _teacher_forced(model, tokens, PROMPT)
        assert int(runtime.router_invalid.item()) == 0
        if cuda_graph:
            assert list(runtime._graphs) == [2]
    if cuda_graph:
        # Replays run no Python: the first decode step (eager, before the recording) is compared.
        reference_index, hdk_index = reference_index[:csa_layers], hdk_index[:csa_layers]
    else:
        assert len(hdk_index) == len(reference_index) == (STEPS - 1) * csa_layers
    assert torch.equal(logits[:, 0], reference[:, 0])  # the prefill is transformers' own
    mean, worst, agree = _logit_gaps(reference[:, 1:], logits[:, 1:])
    overlap = _overlap(reference_index, hdk_index)
    print(
        f"handoff (graph {cuda_graph}): mean {mean:.4f} max {worst:.4f} x std, argmax {agree:.3f}, top-k overlap {overlap:.3f}"
    )
    assert mean <= 0.06 and worst <= 0.35
    assert agree >= 0.80 and overlap >= 0.80


class _StorageEmulation:
    """transformers' DeepSeek-V4 with hdk's storage rounding, in PyTorch: whatever its cache
    keeps for later steps is rounded as hdk stores it (window and compressed entries: MODEL1,
    448 FP8 E4M3 values with a UE8M0 scale per 64 and 64 bf16 RoPE values; indexer keys:
    Hadamard-rotated, MXFP4, rotated back), and a decode step's own kv row too (hdk writes the
    ring before attention). A prefill's own attention sees its values unrounded, as with hdk,
    whose handoff stores what transformers' prefill computed."""

    def __init__(self, model, monkeypatch):
        from hdk.bench import dsv4_kv_torch as kv_torch

        self.kv_torch = kv_torch
        self.prefill = False
        self.hadamard = hdk.dsv4.hadamard_matrix(128, DEVICE)
        module = __import__(type(model).__module__, fromlist=["_"])
        cache_class = __import__("transformers.cache_utils", fromlist=["_"]).Cache
        update, states = cache_class.update, module.DeepseekV4HCACache.update_compressor_states
        monkeypatch.setattr(cache_class, "update", self._wrap_update(update))
        monkeypatch.setattr(
            module.DeepseekV4HCACache, "update_compressor_states", self._wrap_states(states)
        )
        self.hook = model.model.register_forward_pre_hook(self._mark, with_kwargs=True)

    def _mark(self, module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        self.prefill = ids.shape[1] > 1

    def entries(self, x):
        rows = x.reshape(-1, 512)
        if rows.shape[0] == 0:
            return x
        data, scales = self.kv_torch.encode_entries(rows)
        cache = torch.cat([data.reshape(1, -1), scales.reshape(1, -1)], 1)  # one page: data, tails
        slots = torch.arange(rows.shape[0], device=x.device)
        return (
            self.kv_torch.gather_entries(cache, rows.shape[0], slots).to(x.dtype).reshape(x.shape)
        )

    def keys(self, x):
        if x.numel() == 0:
            return x
        rotated = x.reshape(-1, 128).float() @ self.hadamard
        packed, scales = self.kv_torch.encode_mxfp4_keys(rotated)
        codes = torch.stack([packed & 15, packed >> 4], -1).reshape(-1, 4, 32).long()
        magnitude = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], device=x.device)[codes & 7]
        values = (
            torch.where(codes >= 8, -magnitude, magnitude)
            * torch.exp2(scales.float() - 127)[..., None]
        )
        return (values.reshape(-1, 128) @ self.hadamard).to(x.dtype).reshape(x.shape)

    def _wrap_update(self, update):
        def wrapped(cache, key_states, value_states, layer_idx, *args, **kwargs):
            rounded = self.entries(key_states)
            full, _ = update(cache, rounded, rounded, layer_idx, *args, **kwargs)
            if self.prefill:
                full = torch.cat([full[:, :, : full.shape[2] - key_states.shape[2]], key_states], 2)
            return full, full

        return wrapped

    def _wrap_states(self, update_states):
        def wrapped(layer, name, compressed):
            before = layer.compressed_kv[name]
            rounded = (self.entries if name == "compressor" else self.keys)(compressed)
            stored = update_states(layer, name, rounded)
            if self.prefill and compressed.shape[1]:
                kept = stored[:, : stored.shape[1] - compressed.shape[1]]
                return torch.cat([kept, compressed], 1) if before is not None else compressed
            return stored

        return wrapped

    def close(self):
        self.hook.remove()


def test_deepseek_v4_against_transformers_with_hdk_storage(deepseek_v4, monkeypatch):
    """With the storage rounding emulated in transformers, what remains is arithmetic: fp32
    where transformers rounds to bf16 (the compressor's gate, softmax and sum, the router's
    scores, the attention logits), each of which can move a stored FP8 / E2M1 code by one step
    or flip a near tie between experts or selected entries."""
    model = deepseek_v4
    ids = torch.randint(0, 1024, (2, PROMPT), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    tokens, _ = _generate(model, ids, STEPS)
    with monkeypatch.context() as patch:
        emulation = _StorageEmulation(model, patch)
        try:
            emulated = _teacher_forced(model, tokens, PROMPT)
        finally:
            emulation.close()
    pure = _teacher_forced(model, tokens, PROMPT)
    with _enabled(model, max_requests=2, max_context=1024):
        logits = _teacher_forced(model, tokens, PROMPT)
    to_emulated = _logit_gaps(emulated[:, 1:], logits[:, 1:])
    to_pure = _logit_gaps(pure[:, 1:], logits[:, 1:])
    storage = _logit_gaps(pure[:, 1:], emulated[:, 1:])
    for name, (mean, worst, agree) in (
        ("hdk - emulated", to_emulated),
        ("hdk - transformers", to_pure),
        ("emulated - transformers", storage),
    ):
        print(f"{name}: mean {mean:.4f} max {worst:.4f} x std, argmax {agree:.3f}")
    # hdk is closer to the emulation than to transformers: the storage rounding is the larger
    # part of hdk's difference, and the emulation reproduces it.
    assert to_emulated[0] <= 0.75 * to_pure[0]
    assert to_emulated[0] <= 0.02 and to_emulated[1] <= 0.2 and to_emulated[2] >= 0.85


def test_deepseek_v4_token_by_token_prefill_against_transformers(deepseek_v4):
    """Every position decoded by hdk from position 0: the prompt's logits against
    transformers' full forward, then the decode against transformers' decode."""
    model = deepseek_v4
    prompt = PROMPT if ON_CUDA else 40
    steps = STEPS if ON_CUDA else 8
    ids = torch.randint(0, 1024, (2, prompt), generator=torch.Generator().manual_seed(6)).to(DEVICE)
    tokens, reference = _generate(model, ids, steps)
    with torch.no_grad():
        full = model(input_ids=tokens[:, :prompt]).logits
    with _enabled(model, max_requests=2, max_context=1024):
        logits = []
        with torch.no_grad():
            cache = None
            for i in range(tokens.shape[1] - 1):
                out = model(input_ids=tokens[:, i : i + 1], past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits.append(out.logits[:, -1])
        logits = torch.stack(logits, 1)
    for name, ref, new in (
        ("prompt", full, logits[:, :prompt]),
        ("decode", reference[:, 1:], logits[:, prompt:]),
    ):
        mean, worst, agree = _logit_gaps(ref, new)
        print(f"{name}: mean {mean:.4f} max {worst:.4f} x std, argmax {agree:.3f}")
        assert mean <= 0.06 and worst <= 0.35, name
    # Agreement over every position hdk decoded (the short CPU decode alone is a few tokens).
    _, _, agree = _logit_gaps(torch.cat([full, reference[:, 1:]], 1), logits)
    assert agree >= 0.80


def test_deepseek_v4_refuses_what_it_cannot_serve():
    model = tiny_models.deepseek_v4(device="cpu", index_topk=16)
    forwards = {id(m): m.__dict__.get("forward") for m in model.modules()}
    with pytest.raises(hdk.HdkError, match="hdk serves CUDA tensors"):
        hdk_tf.enable(model)
    model.config.index_topk = 4096
    with pytest.raises(hdk.HdkError, match="index_topk must be 1 .. 2048, got 4096"):
        hdk_tf.enable(model, allow_cpu=True)
    model.config.index_topk = 16
    model.config.sliding_window = 64
    with pytest.raises(hdk.HdkError, match="sliding_window must be 128, got 64"):
        hdk_tf.enable(model, allow_cpu=True)
    model.config.sliding_window = 128
    with pytest.raises(hdk.HdkError, match="model type 'llama' is not served"):
        hdk_tf.enable(type("Llama", (), {"config": type("C", (), {"model_type": "llama"})()})())
    assert not hdk_tf.is_enabled(model)
    assert {id(m): m.__dict__.get("forward") for m in model.modules()} == forwards
    assert not any(m._forward_pre_hooks for m in model.modules())


def test_deepseek_v4_invalid_router_row_is_an_error(deepseek_v4):
    model = deepseek_v4
    ids = torch.randint(0, 1024, (1, 8), generator=torch.Generator().manual_seed(7)).to(DEVICE)
    module = __import__(type(model).__module__, fromlist=["_"])
    router = next(m for m in model.modules() if isinstance(m, module.DeepseekV4TopKRouter))
    saved = router.weight.detach().clone()
    hdk_tf.enable(model, max_requests=1, max_context=256, **OPTIONS)
    try:
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            router.weight[:] = float("nan")
            with pytest.raises(hdk.HdkError, match="refused 1 router rows"):
                model(input_ids=ids[:, -1:], past_key_values=out.past_key_values, use_cache=True)
    finally:
        with torch.no_grad():
            router.weight.copy_(saved)
        hdk_tf.disable(model)


def test_deepseek_v4_a_sequence_beyond_the_cache_is_an_error_naming_the_option(deepseek_v4):
    model = deepseek_v4
    ids = torch.randint(0, 1024, (1, 40), generator=torch.Generator().manual_seed(9)).to(DEVICE)
    with _enabled(model, max_requests=1, max_context=32):
        with torch.no_grad():
            with pytest.raises(
                hdk.HdkError, match="beyond max_context = 32.*pass larger max_context="
            ):
                model(input_ids=ids, use_cache=True)
            out = model(input_ids=ids[:, :32], use_cache=True)
            with pytest.raises(hdk.HdkError, match="would reach 33 tokens.*pass larger"):
                model(input_ids=ids[:, 32:33], past_key_values=out.past_key_values, use_cache=True)


def test_deepseek_v4_position_mismatch_is_an_error(deepseek_v4):
    model = deepseek_v4
    ids = torch.randint(0, 1024, (1, 6), generator=torch.Generator().manual_seed(8)).to(DEVICE)
    with _enabled(model, max_requests=1, max_context=256):
        with torch.no_grad():
            with pytest.raises(hdk.HdkError, match="at position 5 but hdk's cache holds 0 tokens"):
                model(input_ids=ids[:, :1], position_ids=torch.tensor([[5]], device=DEVICE))
            with pytest.raises(hdk.HdkError, match="must start at position 0"):
                model(input_ids=ids, position_ids=torch.arange(3, 9, device=DEVICE)[None])
