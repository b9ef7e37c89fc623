"""Tiny random transformers models with the real structure, for tests and examples.

``_init_weights`` zeros what a checkpoint fills (DeepSeek-V4's sinks, compressor position biases,
router bias and hash table), which would hide most of the arithmetic a test must check; these
builders randomize them, in fp32 where a checkpoint keeps them fp32.
"""

import sys

import torch


def _gated_deltanet_sizes(layers, moe):
    """The tiny Qwen3-Next / Qwen3.5 sizes: 3 of every 4 layers Gated DeltaNet (8 value heads
    over 4 key heads of 128 dims, the real models' head size), hidden 256; MoE: 8 experts top-2."""
    sizes = dict(
        vocab_size=1024,
        hidden_size=256,
        num_hidden_layers=layers,
        intermediate_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_value_heads=8,
        linear_num_key_heads=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        layer_types=["full_attention" if i % 4 == 3 else "linear_attention" for i in range(layers)],
        eos_token_id=None,
        pad_token_id=0,
    )
    if moe:
        sizes.update(
            moe_intermediate_size=128,
            shared_expert_intermediate_size=128,
            num_experts=8,
            num_experts_per_tok=2,
        )
    return sizes


def qwen3_next(*, dtype=torch.bfloat16, device="cuda", seed=0, layers=4):
    """A Qwen3-Next model with the tiny sizes of _gated_deltanet_sizes (MoE)."""
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(**_gated_deltanet_sizes(layers, moe=True))
    return Qwen3NextForCausalLM._from_config(config, dtype=dtype).to(device).eval()


def qwen3_5(*, moe=False, dtype=torch.bfloat16, device="cuda", seed=0, layers=4):
    """A Qwen3.5 text model (``moe``: Qwen3.5-MoE) with the same tiny sizes."""
    torch.manual_seed(seed)
    sizes = _gated_deltanet_sizes(layers, moe)
    if moe:
        from transformers.models.qwen3_5_moe import configuration_qwen3_5_moe as config_module
        from transformers.models.qwen3_5_moe import modeling_qwen3_5_moe as model_module

        config = config_module.Qwen3_5MoeTextConfig(**sizes)
        model_class = model_module.Qwen3_5MoeForCausalLM
    else:
        from transformers.models.qwen3_5 import configuration_qwen3_5 as config_module
        from transformers.models.qwen3_5 import modeling_qwen3_5 as model_module

        config = config_module.Qwen3_5TextConfig(**sizes)
        model_class = model_module.Qwen3_5ForCausalLM
    return model_class._from_config(config, dtype=dtype).to(device).eval()


def deepseek_v4(*, dtype=torch.bfloat16, device="cuda", seed=0, index_topk=16):
    """A DeepSeek-V4 model with Flash's structure: 6 layers [SWA, SWA, CSA, HCA, CSA, HCA],
    64 heads of 512, 64 indexer heads of 128, 16 experts top-6 (3 hash layers), window 128;
    sinks, position biases and the router bias random in fp32, a random hash table.

    Build with ``_from_config(dtype=...)``, never ``.to(bfloat16)``, which would round the
    rotary frequencies."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    torch.manual_seed(seed)
    config = DeepseekV4Config(
        vocab_size=1024,
        hidden_size=256,
        num_hidden_layers=6,
        layer_types=["sliding_attention"] * 2
        + ["compressed_sparse_attention", "heavily_compressed_attention"] * 2,
        mlp_layer_types=["hash_moe"] * 3 + ["moe"] * 3,
        num_attention_heads=64,
        num_key_value_heads=1,
        head_dim=512,
        q_lora_rank=128,
        o_groups=8,
        o_lora_rank=64,
        index_n_heads=64,
        index_head_dim=128,
        index_topk=index_topk,
        sliding_window=128,
        rope_theta=10000.0,
        compress_rope_theta=160000.0,
        rope_parameters={
            "rope_type": "yarn",
            "factor": 16,
            "original_max_position_embeddings": 65536,
        },
        n_routed_experts=16,
        num_experts_per_tok=6,
        n_shared_experts=1,
        moe_intermediate_size=128,
        routed_scaling_factor=1.5,
        scoring_func="sqrtsoftplus",
        swiglu_limit=10.0,
        hc_mult=4,
        hc_sinkhorn_iters=20,
        eos_token_id=None,
    )
    model = DeepseekV4ForCausalLM._from_config(config, dtype=dtype).to(device).eval()
    module = sys.modules[type(model).__module__]
    experts = config.n_routed_experts
    generator = torch.Generator().manual_seed(seed + 1)

    def normal(shape, std):
        return (torch.randn(shape, generator=generator) * std).to(device)

    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, module.DeepseekV4Attention):
                m.sinks.data = normal(m.sinks.shape, 1.0)
            compressors = (
                module.DeepseekV4HCACompressor,
                module.DeepseekV4CSACompressor,
                module.DeepseekV4Indexer,
            )
            if isinstance(m, compressors):
                m.position_bias.data = normal(m.position_bias.shape, 0.5)
            if isinstance(m, module.DeepseekV4TopKRouter):
                m.e_score_correction_bias = normal(m.e_score_correction_bias.shape, 0.05)
            if isinstance(m, module.DeepseekV4HashRouter):
                rows = [
                    torch.randperm(experts, generator=generator)[: m.top_k]
                    for _ in range(config.vocab_size)
                ]
                m.tid2eid = torch.stack(rows).to(device)
    return model
