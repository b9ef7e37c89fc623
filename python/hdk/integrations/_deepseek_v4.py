"""DeepSeek-V4 in transformers: decode attention and routers on hdk, with a prefill handoff.

transformers keeps bf16 caches that grow by concatenation and recomputes each compressor window
in PyTorch. With hdk enabled, a decode step (one token a row) runs, per layer:

1. q and kv as transformers computes them (projections, norms, RoPE);
2. ``store_entries`` of kv into the request's SWA ring (MODEL1 FP8);
3. CSA / HCA layers: ``compress`` (main, and the indexer's for CSA) into the paged pools;
4. CSA layers: ``index_topk`` with the indexer's q rotated by the Hadamard matrix (hdk's keys are
   rotated) and transformers' two scale factors folded into the weights;
5. ``sparse_decode`` over the ring plus the selected (CSA) or every (HCA) compressed entry, with
   the layer's sinks; then transformers' inverse RoPE and grouped output projection;

and the routers through :func:`hdk.dsv4.route`. Batch row r is request r of the
:class:`~hdk.dsv4.KVCacheManager`; a row at position 0 starts a new request. A prompt prefilled
by transformers (more than one token, from position 0) is handed to hdk's cache layer by layer:
the last 128 kv rows into the ring and the prompt's compressor windows through ``compress``, so
the decode continues exactly where an engine that had decoded the prompt would be.
"""

import dataclasses
import importlib

import torch

from hdk._ops import HdkError
from hdk.dsv4 import ops
from hdk.dsv4.kv_cache_manager import CSA_RATIO, HCA_RATIO, SWA_WINDOW, KVCacheManager

_MODULE = "transformers.models.deepseek_v4.modeling_deepseek_v4"
_KINDS = {
    "sliding_attention": "swa",
    "compressed_sparse_attention": "csa",
    "heavily_compressed_attention": "hca",
}
_HEAD_DIM = 512
_ROPE_DIM = 64
_INDEX_DIM = 128
_PREFIX = "hdk.integrations.transformers.enable"


def _refuse(message):
    raise HdkError(f"{_PREFIX}: {message}; the model is unchanged")


def _check_config(config):
    if config.head_dim != _HEAD_DIM or int(config.qk_rope_head_dim) != _ROPE_DIM:
        _refuse(
            f"head_dim must be {_HEAD_DIM} = {_HEAD_DIM - _ROPE_DIM} + {_ROPE_DIM} (RoPE), got "
            f"{config.head_dim} with {config.qk_rope_head_dim} RoPE dims"
        )
    if config.index_head_dim != _INDEX_DIM:
        _refuse(f"index_head_dim must be {_INDEX_DIM}, got {config.index_head_dim}")
    if config.num_key_value_heads != 1:
        _refuse(f"num_key_value_heads must be 1, got {config.num_key_value_heads}")
    if config.sliding_window != SWA_WINDOW:
        _refuse(f"sliding_window must be {SWA_WINDOW}, got {config.sliding_window}")
    rates = config.compress_rates
    expected = {"compressed_sparse_attention": CSA_RATIO, "heavily_compressed_attention": HCA_RATIO}
    for kind, ratio in expected.items():
        if kind in config.layer_types and rates.get(kind) != ratio:
            _refuse(f"compress_rates[{kind!r}] must be {ratio}, got {rates.get(kind)}")
    bad = sorted(set(config.layer_types) - set(_KINDS))
    if bad:
        _refuse(f"layer types {bad} are not served (hdk serves {sorted(_KINDS)})")
    if not 1 <= config.index_topk <= 2048:
        _refuse(f"index_topk must be 1 .. 2048, got {config.index_topk}")


def _base_model(model, module):
    if isinstance(model, module.DeepseekV4Model):
        return model
    base = getattr(model, "model", None)
    if isinstance(base, module.DeepseekV4Model):
        return base
    _refuse(
        f"argument 'model' must be a DeepseekV4Model or hold one as .model, got {type(model).__name__}"
    )


class DeepseekV4Runtime:
    """What enable() attached to a DeepSeek-V4 model: the cache manager, the per-layer constants
    hdk's calls take in fp32, and the patched forwards.

    ``manager`` is the :class:`~hdk.dsv4.KVCacheManager`; ``router_invalid`` the routers' count
    of refused rows (an invalid row raises at the end of its step). The compressors'
    position biases and norm weights, the sinks and the hash tables are copied at enable():
    enable again after changing the weights."""

    def __init__(
        self,
        model,
        *,
        allow_cpu=False,
        max_requests=8,
        max_context=8192,
        csa_blocks=None,
        hca_blocks=None,
        block_size=64,
        key_format="mxfp4",
        cuda_graph=None,
    ):
        module = importlib.import_module(_MODULE)
        self.module = module
        base = _base_model(model, module)
        config = base.config
        _check_config(config)
        device = base.embed_tokens.weight.device
        if device.type != "cuda" and not (allow_cpu and device.type == "cpu"):
            _refuse(
                f"the model is on {device}; hdk serves CUDA tensors (allow_cpu=True runs hdk's "
                "CPU backend)"
            )
        if cuda_graph is None:
            cuda_graph = device.type == "cuda"
        if cuda_graph and device.type != "cuda":
            _refuse(f"cuda_graph=True needs the model on CUDA, it is on {device}")
        dtype = base.embed_tokens.weight.dtype
        if dtype not in (torch.bfloat16, torch.float32):
            _refuse(f"the model's dtype must be bfloat16 or float32, got {dtype}")
        kinds = [_KINDS[t] for t in config.layer_types]
        max_requests, max_context = int(max_requests), int(max_context)
        if csa_blocks is None:
            csa_blocks = max_requests * -(-(max_context // CSA_RATIO) // block_size)
        if hca_blocks is None:
            hca_blocks = max_requests * -(-(max_context // HCA_RATIO) // block_size)
        self.manager = KVCacheManager(
            kinds,
            max_requests=max_requests,
            csa_blocks=csa_blocks,
            hca_blocks=hca_blocks,
            block_size=block_size,
            hca_block_size=block_size,
            max_context=max_context,
            key_format=key_format,
            device=device,
        )
        self.config = config
        self.device = device
        # The compressors' RoPE rows, as transformers rounds them (through the model's dtype).
        positions = torch.arange(max_context, device=device)[None]
        probe = torch.zeros(1, dtype=dtype, device=device)
        cos, sin = base.rotary_emb(probe, positions, layer_type="compress")
        self.rope_cos = cos[0].float().contiguous()
        self.rope_sin = sin[0].float().contiguous()
        self.hadamard = ops.hadamard_matrix(_INDEX_DIM, device)
        self.router_invalid = torch.zeros(1, dtype=torch.int32, device=device)
        self.step = None  # the running decode step's StepInputs
        self.rows = []  # request id of each batch row of the running call
        self.prefill = None  # (batch, length) while a prompt is handed off
        self.cuda_graph = bool(cuda_graph)
        self._graphs = {}  # batch size -> _DecodeGraph
        self._last_kv = {}  # layer index -> the step's kv rows [B, 1, 1, 512]
        self._attention, self._routers, self._model = [], [], None
        try:
            for layer in base.layers:
                self._attention.append(self._patch_attention(layer.self_attn))
                self._routers.append(self._patch_router(layer.mlp.gate))
            self._model = self._patch_model(base)
        except Exception:
            self.close()  # a model whose modules are not as expected stays as it was
            raise

    # -- patching --------------------------------------------------------------------------

    @staticmethod
    def _replace_forward(module, forward):
        saved = module.__dict__.get("forward")
        module.forward = forward
        return module, saved

    @staticmethod
    def _restore_forward(module, saved):
        if saved is None:
            del module.forward
        else:
            module.forward = saved

    def _patch_attention(self, attention):
        layer = self.manager.layers[attention.layer_idx]
        constants = {"sink": attention.sinks.detach().float().contiguous()}
        compressor = attention.compressor
        if compressor is not None:
            constants["ape"] = compressor.position_bias.detach().float().contiguous()
            constants["norm"] = compressor.kv_norm.weight.detach().float().contiguous()
            if layer.kind == "csa":
                indexer = compressor.indexer
                constants["index_ape"] = indexer.position_bias.detach().float().contiguous()
                constants["index_norm"] = indexer.kv_norm.weight.detach().float().contiguous()
        original = attention.forward

        def forward(
            hidden_states,
            position_embeddings,
            position_ids,
            attention_mask,
            past_key_values=None,
            **kwargs,
        ):
            if self.step is not None:
                return self._decode(
                    attention, layer, constants, hidden_states, position_embeddings, past_key_values
                )
            result = original(
                hidden_states,
                position_embeddings,
                position_ids,
                attention_mask,
                past_key_values,
                **kwargs,
            )
            if self.prefill is not None:
                self._hand_off(attention, layer, constants, hidden_states, position_embeddings)
            return result

        return self._replace_forward(attention, forward)

    def _patch_router(self, router):
        bias = getattr(router, "e_score_correction_bias", None)
        bias = None if bias is None else bias.detach().float().contiguous()
        table = getattr(router, "tid2eid", None)
        table = None if table is None else table.detach().to(torch.int32).contiguous()
        original = router.forward

        def forward(hidden_states, input_ids=None):
            if self.step is None:
                return (
                    original(hidden_states) if table is None else original(hidden_states, input_ids)
                )
            return self._route(router, bias, table, hidden_states, input_ids)

        return self._replace_forward(router, forward)

    def _patch_model(self, base):
        original = base.forward

        def forward(*args, **kwargs):
            decode = self._begin(args, kwargs)
            try:
                if decode and self.cuda_graph:
                    output = self._decode_graph(original, args, kwargs)
                else:
                    output = original(*args, **kwargs)
                if decode:
                    self._finish_step()
            finally:
                self.step, self.prefill = None, None
            return output

        return self._replace_forward(base, forward)

    def close(self):
        patched = self._attention + self._routers + ([self._model] if self._model else [])
        for module, saved in patched:
            self._restore_forward(module, saved)
        self._attention, self._routers, self._model = [], [], None
        self._graphs.clear()
        for request in self.manager.requests():
            self.manager.release_request(request)

    # -- a forward call --------------------------------------------------------------------

    def _positions(self, batch, length, kwargs):
        position_ids = kwargs.get("position_ids")
        if position_ids is not None:
            return position_ids.reshape(position_ids.shape[0], -1)[:, 0].expand(batch).tolist()
        cache = kwargs.get("past_key_values")
        start = cache.get_seq_length() if cache is not None else 0
        return [int(start)] * batch

    def _begin(self, args, kwargs):
        """Host work before a forward call: requests and pages. True for a decode step."""
        inputs = kwargs.get("input_ids", args[0] if args else None)
        if inputs is None:
            inputs = kwargs.get("inputs_embeds")
        batch, length = inputs.shape[0], inputs.shape[1]
        if batch > self.manager.max_requests:
            raise HdkError(
                f"hdk.integrations.transformers: batch {batch} is larger than max_requests = "
                f"{self.manager.max_requests} given to enable()"
            )
        positions = self._positions(batch, length, kwargs)
        self.rows = list(range(batch))
        if length > 1:
            if any(p != 0 for p in positions):
                raise HdkError(
                    "hdk.integrations.transformers: a prompt of more than one token must start at "
                    f"position 0 (hdk takes over the cache after a whole prefill), got positions "
                    f"{sorted(set(positions))}"
                )
            for row in self.rows:
                self._restart(row, length)
            self.prefill = (batch, length)
            return False
        for row, position in zip(self.rows, positions):
            if position == 0:
                self._restart(row, 0)
            elif row not in self.manager.requests() or self.manager.position(row) != position:
                held = self.manager.position(row) if row in self.manager.requests() else 0
                raise HdkError(
                    f"hdk.integrations.transformers: batch row {row} is at position {position} "
                    f"but hdk's cache holds {held} tokens for it (start a sequence at position "
                    "0, or prefill it with hdk enabled)"
                )
        with _sized_by_enable():
            self.manager.reserve_for_step(self.rows)
        self.step = self.manager.step_inputs(self.rows)
        self.router_invalid.zero_()
        return True

    def _restart(self, row, prompt_length):
        if row in self.manager.requests():
            self.manager.release_request(row)
        with _sized_by_enable():
            self.manager.admit_request(row, prompt_length)

    def _finish_step(self):
        refused = int(self.router_invalid.item())
        if refused:
            raise HdkError(
                f"hdk.integrations.transformers: hdk.dsv4.route refused {refused} router rows (a "
                "NaN logit, or selected scores summing to 0 or infinity); their tokens ran without "
                "routed experts"
            )
        self.manager.advance(self.rows)

    # -- decode ----------------------------------------------------------------------------

    def _compress(
        self,
        layer,
        constants,
        compressor,
        flat,
        *,
        positions=None,
        state_slots=None,
        table=None,
        swa_rows=None,
    ):
        """Both compressors of a layer for rows ``flat`` ([N, D] or [N, T, D]); the step's
        positions, slots and table unless given (the prefill handoff's chunks). ``swa_rows``: the
        step's kv rows for the layer's SWA ring, stored in the compressors' launch."""
        step = self.step
        calls = [(compressor, "ape", "norm", layer.state, layer.cache)]
        if layer.kind == "csa":
            calls.append(
                (
                    compressor.indexer,
                    "index_ape",
                    "index_norm",
                    layer.index_state,
                    layer.index_cache,
                )
            )
        arguments = [
            dict(
                kv=part.kv_proj(flat),
                score=part.gate_proj(flat),
                ape=constants[ape],
                positions=step.positions if positions is None else positions,
                state_slots=step.state_slots if state_slots is None else state_slots,
                state=state,
                norm_weight=constants[norm],
                rope_cos=self.rope_cos,
                rope_sin=self.rope_sin,
                block_table=(
                    (step.csa_block_table if layer.kind == "csa" else step.hca_block_table)
                    if table is None
                    else table
                ),
                cache=cache,
                block_size=self.manager.block_size[layer.ratio],
                ratio=layer.ratio,
                key_format=self.manager.key_format,
            )
            for part, ape, norm, state, cache in calls
        ]
        if swa_rows is not None:  # the ring's store and the compressors in one launch
            store = dict(
                values=swa_rows,
                slots=step.swa_slots.reshape(-1),
                cache=layer.swa,
                block_size=SWA_WINDOW,
            )
            ops.store_and_compress(store, *arguments)
        elif len(arguments) == 2:  # a CSA layer: both compressors in one launch
            ops.compress_pair(*arguments)
        else:
            ops.compress(**arguments[0])

    def _decode(
        self, attention, layer, constants, hidden_states, position_embeddings, past_key_values
    ):
        module = self.module
        batch = hidden_states.shape[0]
        heads = attention.num_heads
        cos, sin = position_embeddings[attention.rope_layer_type]
        q_residual = attention.q_a_norm(attention.q_a_proj(hidden_states))
        q = attention.q_b_proj(q_residual).view(batch, 1, heads, _HEAD_DIM).transpose(1, 2)
        q = module.apply_rotary_pos_emb(attention.q_b_norm(q), cos, sin)
        kv = (
            attention.kv_norm(attention.kv_proj(hidden_states))
            .view(batch, 1, 1, _HEAD_DIM)
            .transpose(1, 2)
        )
        kv = module.apply_rotary_pos_emb(kv, cos, sin)
        self._last_kv[attention.layer_idx] = kv
        if past_key_values is not None:
            # transformers' caches stay what its own decode would hold (the window's kv rows).
            past_key_values.update(kv, kv, attention.layer_idx)
        manager, step = self.manager, self.step
        flat = hidden_states.reshape(batch, -1)
        selected = None
        if layer.kind != "swa":
            self._compress(
                layer, constants, attention.compressor, flat, swa_rows=kv.reshape(batch, _HEAD_DIM)
            )
        else:
            manager.store_swa(layer, kv.reshape(batch, _HEAD_DIM), step)
        if layer.kind == "csa":
            indexer = attention.compressor.indexer
            index_q = indexer.q_b_proj(q_residual).view(batch, 1, -1, _INDEX_DIM).transpose(1, 2)
            index_q = module.apply_rotary_pos_emb(index_q, cos, sin).reshape(batch, -1, _INDEX_DIM)
            index_q = index_q.float() @ self.hadamard
            scorer = indexer.scorer
            weights = scorer.weights_proj(flat).float() * (
                scorer.softmax_scale * scorer.weights_scaling
            )
            _, _, selected = manager.index_topk(layer, step, index_q, weights, indexer.index_topk)
        out, _ = manager.attend(
            layer,
            step,
            q.reshape(batch, heads, _HEAD_DIM),
            sink=constants["sink"],
            selected=selected,
        )
        out = module.apply_rotary_pos_emb(
            out.view(batch, heads, 1, _HEAD_DIM), cos, -sin
        ).transpose(1, 2)
        grouped = attention.o_a_proj(out.reshape(batch, 1, self.config.o_groups, -1)).flatten(2)
        return attention.o_b_proj(grouped), None

    def _route(self, router, bias, table, hidden_states, input_ids):
        flat = hidden_states.reshape(-1, router.hidden_dim)
        hash_routing = table is not None
        ids, weights = ops.route(
            hidden=flat,
            gate_weight=router.weight,
            bias=None if hash_routing else bias,
            token_ids=input_ids.reshape(-1) if hash_routing else None,
            tid2eid=table,
            top_k=router.top_k,
            route_scale=router.routed_scaling_factor,
            invalid_count=self.router_invalid,
        )
        # A refused row has ids -1 and weights 0: its experts contribute nothing, and _end raises.
        return None, weights.to(flat.dtype), ids.clamp(min=0).long()

    # -- prefill handoff -------------------------------------------------------------------

    def _hand_off(self, attention, layer, constants, hidden_states, position_embeddings):
        """Writes what transformers' prefill of this layer leaves in hdk's cache: the last 128
        kv rows into the ring, and every compressor window of the prompt (whole windows
        flushed into the pools, the open one in the state)."""
        module, manager = self.module, self.manager
        batch, length = self.prefill
        cos, sin = position_embeddings[attention.rope_layer_type]
        first = max(0, length - SWA_WINDOW)
        recent = hidden_states[:, first:]
        kv = attention.kv_norm(attention.kv_proj(recent)).unsqueeze(1)
        kv = module.apply_rotary_pos_emb(kv, cos[:, first:], sin[:, first:]).squeeze(1)
        slots = torch.tensor(
            [manager.slot(r) for r in self.rows], dtype=torch.int64, device=self.device
        )
        ring = (
            slots[:, None] * SWA_WINDOW
            + torch.arange(first, length, device=self.device) % SWA_WINDOW
        )
        ops.store_entries(kv.reshape(-1, _HEAD_DIM), ring.reshape(-1), layer.swa, SWA_WINDOW)
        if layer.kind == "swa":
            return
        table = manager.block_table(layer.kind, self.rows)
        # compress takes at most `ratio` tokens a row and call; window-aligned chunks.
        for start in range(0, length, layer.ratio):
            chunk = hidden_states[:, start : start + layer.ratio]
            positions = torch.full((batch,), start, dtype=torch.int64, device=self.device)
            self._compress(
                layer,
                constants,
                attention.compressor,
                chunk,
                positions=positions,
                state_slots=slots,
                table=table,
            )

    # -- CUDA graphs -----------------------------------------------------------------------

    def _decode_graph(self, original, args, kwargs):
        """A decode step by graph replay; a batch size's first step runs eagerly (it is a real
        step) and the graph is recorded after it, with the step's inputs in static tensors."""
        input_ids = kwargs.get("input_ids", args[0] if args else None)
        if input_ids is None:
            raise HdkError("hdk.integrations.transformers: cuda_graph=True decodes from input_ids")
        cache = kwargs.get("past_key_values")
        batch = input_ids.shape[0]
        graph = self._graphs.get(batch)
        if graph is None:
            with _experts_implementation(self.config, "batched_mm"):
                output = original(*args, **kwargs)
            self._graphs[batch] = _DecodeGraph(self, original, input_ids, self.step)
            return output
        graph.replay(input_ids, self.step)
        if cache is not None:
            for index, kv in graph.kv.items():
                cache.update(kv, kv, index)
        return self.module.MoeModelOutputWithPast(
            last_hidden_state=graph.hidden.clone(), past_key_values=cache
        )


class _sized_by_enable:
    """Adds to the cache manager's errors where its sizes come from: admission and page
    reservation fail only for a sequence beyond max_context or pools too small, both set by
    enable()."""

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback):
        if isinstance(error, HdkError):
            raise HdkError(
                f"{error} (hdk.integrations.transformers.enable sized the cache: pass larger "
                "max_context=, csa_blocks= or hca_blocks= to it)"
            ) from error
        return False


class _experts_implementation:
    """Sets the config's experts implementation for a block: transformers' default loops over
    the experts a batch hits (a host synchronization), which a CUDA graph cannot hold."""

    def __init__(self, config, name):
        self.config, self.name = config, name

    def __enter__(self):
        self.saved = getattr(self.config, "_experts_implementation", None)
        self.config._experts_implementation = self.name

    def __exit__(self, *exc):
        self.config._experts_implementation = self.saved


class _DecodeGraph:
    """One batch size's decode step recorded in a CUDA graph: static token ids and step
    inputs in, the last hidden state and each layer's kv rows out."""

    def __init__(self, runtime, original, input_ids, step):
        self.input_ids = input_ids.clone()
        self.step = dataclasses.replace(
            step,
            **{f.name: getattr(step, f.name).clone() for f in _step_tensors(step)},
        )
        runtime.step = self.step
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with _experts_implementation(runtime.config, "batched_mm"), torch.cuda.graph(self.graph):
            output = original(
                input_ids=self.input_ids,
                position_ids=self.step.positions[:, None],
                attention_mask={"sliding_attention": None},
                use_cache=False,
            )
        self.hidden = output.last_hidden_state
        self.kv = dict(runtime._last_kv)
        runtime.step = step

    def replay(self, input_ids, step):
        self.input_ids.copy_(input_ids)
        for field in _step_tensors(step):
            getattr(self.step, field.name).copy_(getattr(step, field.name))
        self.graph.replay()


def _step_tensors(step):
    return [f for f in dataclasses.fields(step) if isinstance(getattr(step, f.name), torch.Tensor)]
