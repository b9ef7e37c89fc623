"""hdk in Hugging Face transformers: ``enable(model)`` runs the model's decode on hdk.

* Qwen3-Next and Qwen3.5 (``qwen3_next``, ``qwen3_5``, ``qwen3_5_moe``): the gated delta rule's
  one-token step updates the layer's cached state in place with :func:`hdk.gdn_decode`.
  Prefill stays on transformers' path; its final state is the decode's start.
* DeepSeek-V4 (``deepseek_v4``): each decode step's attention runs through an
  :class:`hdk.dsv4.KVCacheManager` sized from the config (the SWA ring, both compressors,
  ``index_topk`` over rotated MXFP4 keys, ``sparse_decode`` with the sinks) and the routers
  through :func:`hdk.dsv4.route`. A prompt prefilled by transformers is handed to hdk's cache:
  the last 128 kv rows into the ring and every compressor window through ``compress``.

``enable`` checks the whole model first and changes nothing when it refuses one; ``disable``
restores the model as it was. docs/integrations.md has the details and the call order an engine
uses instead.
"""

from hdk._ops import HdkError

from hdk.integrations import _gated_deltanet

_ATTRIBUTE = "_hdk_runtime"


def _model_type(model):
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type is None:
        raise HdkError(
            "hdk.integrations.transformers.enable: argument 'model' must be a transformers "
            f"model with a config, got {type(model).__name__}"
        )
    return model_type


def enable(model, *, allow_cpu=False, **options):
    """Runs ``model``'s decode on hdk until :func:`disable`. Returns the model.

    Args:
        model: a loaded transformers model (``...ForCausalLM`` or its base model) of type
            qwen3_next, qwen3_5, qwen3_5_moe or deepseek_v4, on a CUDA device.

    Keyword Args:
        allow_cpu: also serve a model on the CPU with hdk's CPU backend (slow; for tests).
        max_requests, max_context, csa_blocks, hca_blocks, key_format (DeepSeek-V4 only): the
            :class:`hdk.dsv4.KVCacheManager`'s sizes; defaults: 8 requests (batch rows) of up
            to 8192 tokens, pools for all of them, MXFP4 indexer keys.
        cuda_graph (DeepSeek-V4 only; default: True on CUDA): replay each decode step of a
            batch size from a CUDA graph recorded at its first step, as engines run decode (the
            decode's experts then run transformers' "batched_mm" implementation, which a graph
            can hold). False runs every step eagerly.

    Raises:
        HdkError: a model hdk cannot serve (its message says why); the model is unchanged.
    """
    model_type = _model_type(model)
    if getattr(model, _ATTRIBUTE, None) is not None:
        raise HdkError("hdk.integrations.transformers.enable: hdk is already enabled on this model")
    if model_type in _gated_deltanet.MODEL_MODULES:
        if options:
            raise HdkError(
                f"hdk.integrations.transformers.enable: {model_type} takes no options, got "
                f"{sorted(options)}"
            )
        runtime = _gated_deltanet.GatedDeltaNetRuntime(model, model_type, allow_cpu)
    elif model_type == "deepseek_v4":
        from hdk.integrations import _deepseek_v4

        runtime = _deepseek_v4.DeepseekV4Runtime(model, allow_cpu=allow_cpu, **options)
    else:
        supported = sorted(set(_gated_deltanet.MODEL_MODULES) | {"deepseek_v4"})
        raise HdkError(
            f"hdk.integrations.transformers.enable: model type {model_type!r} is not served; "
            f"hdk serves {', '.join(supported)}"
        )
    object.__setattr__(model, _ATTRIBUTE, runtime)
    return model


def disable(model):
    """Restores ``model`` to transformers' own decode. Returns the model."""
    runtime = getattr(model, _ATTRIBUTE, None)
    if runtime is None:
        raise HdkError("hdk.integrations.transformers.disable: hdk is not enabled on this model")
    runtime.close()
    object.__delattr__(model, _ATTRIBUTE)
    return model


def is_enabled(model):
    """True while :func:`enable` is in effect on ``model``."""
    return getattr(model, _ATTRIBUTE, None) is not None


def runtime(model):
    """What :func:`enable` attached (for DeepSeek-V4: ``.manager``, the KVCacheManager), or
    None."""
    return getattr(model, _ATTRIBUTE, None)
