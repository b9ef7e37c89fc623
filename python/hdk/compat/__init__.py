"""Drop-in replacements for the decode functions serving engines call today.

=========================  ==============================================================
``hdk.compat.flashinfer``  ``gated_delta_rule_decode_pretranspose``,
                           ``gated_delta_rule_decode``, ``gated_delta_rule_mtp``
``hdk.compat.flashmla``    ``flash_mla_with_kvcache`` (sparse MODEL1 decode),
                           ``get_mla_metadata``
``hdk.compat.sglang``      ``fused_sigmoid_gating_delta_rule_update``
``hdk.compat.vllm``        ``fused_recurrent_gated_delta_rule``,
                           ``fused_sigmoid_gating_delta_rule_update``
=========================  ==============================================================

Each keeps the peer's name, parameter order, defaults and return value; where the peer has a
known defect (padding that writes slot 0, reads before an index row, int32 offsets) hdk keeps
its own semantics. Every difference is listed in the module's docstring and docs/python.md.
"""

from hdk.compat import flashinfer, flashmla, sglang, vllm

__all__ = ["flashinfer", "flashmla", "sglang", "vllm"]
