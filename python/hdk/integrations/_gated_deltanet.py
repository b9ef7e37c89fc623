"""Qwen3-Next and Qwen3.5 in transformers: the gated delta rule's one-token step on hdk.

transformers runs a decode step's recurrence through a module-level function,
``torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state, ...)``, with the layer's
cached state as ``initial_state`` and copies the state it returns back into the cache. hdk
updates that cached state in place and returns it, so the copy is a self-copy (which torch
skips). Prefill (the chunked rule) stays on transformers' path; its final state is where the
first decode step starts.

The function is shared by every model of the module, so it is replaced by a dispatcher once
(while any model is enabled) and each enabled layer marks itself current around its own
forward: layers of models that are not enabled keep transformers' arithmetic.
"""

import contextvars
import importlib

import torch

from hdk._ops import HdkError
from hdk.gdn import gdn_decode

# The transformers modules whose GatedDeltaNet layers run the recurrent step through the
# module-level function, by model type.
MODEL_MODULES = {
    "qwen3_next": "transformers.models.qwen3_next.modeling_qwen3_next",
    "qwen3_5": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_moe": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
    "qwen3_5_text": "transformers.models.qwen3_5.modeling_qwen3_5",
    "qwen3_5_moe_text": "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
}
_FUNCTION = "torch_recurrent_gated_delta_rule"

_current_layer = contextvars.ContextVar("hdk_gated_deltanet_layer", default=None)
# module name -> [the original function, number of enabled models using the dispatcher]
_installed = {}


def _layer_class(module):
    """The module's GatedDeltaNet class (the one layer class that calls the function)."""
    for name in dir(module):
        if name.endswith("GatedDeltaNet"):
            return getattr(module, name)
    raise HdkError(f"hdk.integrations.transformers: {module.__name__} has no GatedDeltaNet layer")


def _hdk_step(query, key, value, g, beta, initial_state, output_final_state):
    """The recurrent step on hdk, or None where hdk cannot take these tensors as they are."""
    if initial_state is None or query.shape[1] != 1:
        return None
    tensors = (query, key, value, g, beta, initial_state)
    if any(t.device != initial_state.device for t in tensors):
        return None
    if (
        initial_state.dtype not in (torch.float32, torch.bfloat16)
        or not initial_state.is_contiguous()
    ):
        return None
    batch, _, heads, k_dim = key.shape
    v_heads, v_dim = value.shape[-2:]
    if tuple(initial_state.shape) != (batch, v_heads, k_dim, v_dim):
        return None
    out = gdn_decode(
        query,
        key,
        value,
        initial_state,
        g=g.float(),
        beta=beta.float(),
        layout="kv",  # transformers keeps the state as [B, HV, K, V]
        max_tokens_per_request=1,
        out_dtype=query.dtype,
    )
    return out, (initial_state if output_final_state else None)


def _dispatcher(original):
    def torch_recurrent_gated_delta_rule(
        query,
        key,
        value,
        g,
        beta,
        initial_state=None,
        output_final_state=False,
        use_qk_l2norm_in_kernel=False,
        **kwargs,
    ):
        # hdk's decode normalizes q and k in the kernel; a caller that did not ask for that
        # (or passes variable-length batches) keeps transformers' function.
        if (
            _current_layer.get() is not None
            and use_qk_l2norm_in_kernel
            and kwargs.get("cu_seqlens") is None
        ):
            result = _hdk_step(query, key, value, g, beta, initial_state, output_final_state)
            if result is not None:
                return result
        return original(
            query,
            key,
            value,
            g,
            beta,
            initial_state=initial_state,
            output_final_state=output_final_state,
            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
            **kwargs,
        )

    torch_recurrent_gated_delta_rule.hdk_original = original
    return torch_recurrent_gated_delta_rule


def _install(module_name):
    module = importlib.import_module(module_name)
    if module_name not in _installed:
        original = getattr(module, _FUNCTION)
        setattr(module, _FUNCTION, _dispatcher(original))
        _installed[module_name] = [original, 0]
    _installed[module_name][1] += 1
    return module


def _uninstall(module_name):
    entry = _installed.get(module_name)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] == 0:
        setattr(importlib.import_module(module_name), _FUNCTION, entry[0])
        del _installed[module_name]


class GatedDeltaNetRuntime:
    """What enable() attached to a Qwen3-Next / Qwen3.5 model: the hooks that mark its layers
    current, and the dispatcher's reference."""

    def __init__(self, model, model_type, allow_cpu):
        self.module_name = MODEL_MODULES[model_type]
        module = importlib.import_module(self.module_name)
        layers = [m for m in model.modules() if isinstance(m, _layer_class(module))]
        if not layers:
            raise HdkError(
                f"hdk.integrations.transformers.enable: the {model_type} model has no "
                "GatedDeltaNet layer"
            )
        for layer in layers:
            self._check_layer(layer, allow_cpu)
        _install(self.module_name)
        self.handles = []
        for layer in layers:
            self.handles.append(layer.register_forward_pre_hook(self._enter))
            self.handles.append(layer.register_forward_hook(self._leave, always_call=True))
        self.layers = layers
        self._tokens = {}

    @staticmethod
    def _check_layer(layer, allow_cpu):
        weight = layer.in_proj_ba.weight if hasattr(layer, "in_proj_ba") else None
        device = weight.device if weight is not None else next(layer.parameters()).device
        if device.type != "cuda" and not (allow_cpu and device.type == "cpu"):
            raise HdkError(
                "hdk.integrations.transformers.enable: the model's GatedDeltaNet layers are on "
                f"{device}; hdk serves CUDA tensors (allow_cpu=True runs hdk's CPU backend)"
            )
        if layer.num_v_heads % layer.num_k_heads:
            raise HdkError(
                "hdk.integrations.transformers.enable: linear_num_value_heads "
                f"({layer.num_v_heads}) must be a multiple of linear_num_key_heads "
                f"({layer.num_k_heads})"
            )

    def _enter(self, layer, args):
        self._tokens[id(layer)] = _current_layer.set(layer)

    def _leave(self, layer, args, output):
        token = self._tokens.pop(id(layer), None)
        if token is not None:
            _current_layer.reset(token)

    def close(self):
        for handle in self.handles:
            handle.remove()
        self.handles = []
        _uninstall(self.module_name)
