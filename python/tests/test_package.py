"""The package surface: versions, the registered op and its schema, the compat modules."""

import inspect

import torch

import hdk


def test_versions_and_build_flags():
    assert hdk.__version__ == hdk.library_version()
    assert isinstance(hdk.built_with_cuda(), bool)
    assert isinstance(hdk.extension_has_cuda(), bool)


def test_op_schema_declares_every_mutation():
    schema = str(torch.ops.hdk.gdn_decode.default._schema)
    for mutated in (
        "Tensor(a!) state",
        "Tensor(b!)? intermediate_states",
        "Tensor(c!) out",
        "Tensor(d!)? invalid_index_count",
        "Tensor(e!)? nonfinite_head_count",
    ):
        assert mutated in schema
    assert schema.endswith("-> ()")


def test_functional_api_keyword_names_match_the_cpp_fields():
    parameters = inspect.signature(hdk.gdn_decode).parameters
    expected = [
        "q",
        "k",
        "v",
        "state",
        "A_log",
        "a",
        "dt_bias",
        "b",
        "g",
        "beta",
        "state_indices",
        "output_state_indices",
        "num_accepted_tokens",
        "cu_seqlens",
        "intermediate_states",
        "out",
        "invalid_index_count",
        "nonfinite_head_count",
        "layout",
        "scale",
        "use_qk_l2norm",
        "l2norm_eps",
        "softplus_beta",
        "softplus_threshold",
        "update_state",
        "max_tokens_per_request",
        "check_indices",
        "out_dtype",
    ]
    assert list(parameters) == expected
    assert all(parameters[name].kind is inspect.Parameter.KEYWORD_ONLY for name in expected[4:])


def test_compat_signatures_follow_the_peers():
    from hdk.compat import flashinfer, sglang, vllm

    def names(function):
        return list(inspect.signature(function).parameters)

    assert names(flashinfer.gated_delta_rule_decode_pretranspose)[:14] == [
        "q",
        "k",
        "v",
        "state",
        "A_log",
        "a",
        "dt_bias",
        "b",
        "scale",
        "output",
        "use_qk_l2norm",
        "initial_state",
        "initial_state_indices",
        "output_state_indices",
    ]
    assert names(flashinfer.gated_delta_rule_mtp) == [
        "q",
        "k",
        "v",
        "initial_state",
        "initial_state_indices",
        "A_log",
        "a",
        "dt_bias",
        "b",
        "scale",
        "output",
        "intermediate_states_buffer",
        "ssm_state_indices",
        "disable_state_update",
        "use_qk_l2norm",
        "output_state_indices",
    ]
    assert names(sglang.fused_sigmoid_gating_delta_rule_update)[:15] == [
        "A_log",
        "a",
        "dt_bias",
        "softplus_beta",
        "softplus_threshold",
        "q",
        "k",
        "v",
        "b",
        "initial_state_source",
        "initial_state_indices",
        "scale",
        "use_qk_l2norm_in_kernel",
        "cu_seqlens",
        "is_kda",
    ]
    assert names(vllm.fused_recurrent_gated_delta_rule) == [
        "q",
        "k",
        "v",
        "g",
        "beta",
        "scale",
        "initial_state",
        "inplace_final_state",
        "cu_seqlens",
        "ssm_state_indices",
        "num_accepted_tokens",
        "use_qk_l2norm_in_kernel",
    ]
    assert names(vllm.fused_sigmoid_gating_delta_rule_update)[:17] == [
        "A_log",
        "a",
        "b",
        "dt_bias",
        "q",
        "k",
        "v",
        "beta",
        "threshold",
        "scale",
        "initial_state",
        "inplace_final_state",
        "cu_seqlens",
        "ssm_state_indices",
        "num_accepted_tokens",
        "use_qk_l2norm_in_kernel",
        "is_kda",
    ]
    defaults = inspect.signature(sglang.fused_sigmoid_gating_delta_rule_update).parameters
    assert defaults["use_qk_l2norm_in_kernel"].default is False
    defaults = inspect.signature(flashinfer.gated_delta_rule_decode).parameters
    assert defaults["use_qk_l2norm"].default is True


def test_optional_submodules_are_exported_only_when_present():
    for name in ("dsv4", "topk"):
        assert (name in hdk.__all__) == hasattr(hdk, name)
