"""The package surface: versions, the registered op and its schema, the compat modules."""

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import hdk

PYTHON_DOCS = Path(__file__).resolve().parents[2] / "docs" / "python.md"


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


def test_public_functions_are_callable_where_documented():
    for name in hdk.__all__:
        assert hasattr(hdk, name), name
    assert hdk.route is hdk.dsv4.route
    values, indices = hdk.topk(torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0, 0.0]]), 5)
    assert indices.tolist() == [[1, 3, 2, 4, 0]]
    assert values.tolist() == [[5.0, 4.0, 3.0, 2.0, 1.0]]
    ids, weights = hdk.route(torch.tensor([[0.0, 3.0, 1.0, 2.0]]), top_k=2)
    assert ids.tolist() == [[1, 3]]
    assert weights.sum().item() == pytest.approx(1.0)


def test_every_operation_has_a_section_in_the_python_docs():
    text = PYTHON_DOCS.read_text()
    headings = [line for line in text.splitlines() if line.startswith("#")]
    for function in ("hdk.gdn_decode", "hdk.route", "hdk.topk"):
        assert any(f"`{function}`" in heading for heading in headings), (
            f"docs/python.md has no section for {function}"
        )
    for name in hdk.dsv4.__all__:
        value = getattr(hdk.dsv4, name)
        if inspect.isfunction(value) or inspect.isclass(value):
            assert name in text, f"docs/python.md does not mention hdk.dsv4.{name}"


def hdk_modules():
    """Every module of the installed package, by name (hdk.bench.__main__ runs the CLI)."""
    root = Path(hdk.__file__).parent
    names = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return root, names


@pytest.mark.parametrize("module", hdk_modules()[1])
def test_each_module_imports_alone_in_a_fresh_interpreter(module):
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def imported_modules(path, package, known, extensions):
    """The modules of `known` that the source at `path` (module of `package`) imports;
    `extensions` names the compiled modules, which import nothing of hdk."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                found.add(submodule if submodule in known | extensions else base)
    return found & known


def test_no_import_cycles_among_the_modules():
    # A package's __init__ importing its children is how packages work and is not counted; an
    # edge is an explicit import. A cycle makes the outcome depend on which module is imported
    # first, and usually ends in a partially initialized module.
    root, names = hdk_modules()
    known = set(names)
    extensions = {
        ".".join(path.relative_to(root.parent).parts[:-1] + (path.name.split(".")[0],))
        for path in root.rglob("*.so")
    }
    graph = {}
    for name in names:
        relative = Path(*name.split("."))
        path = root.parent / relative.with_suffix(".py")
        is_package = not path.exists()
        if is_package:
            path = root.parent / relative / "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        graph[name] = imported_modules(path, package, known, extensions) - {name}

    def cycle_from(start, node, trail):
        for successor in sorted(graph[node]):
            if successor == start:
                return trail + [successor]
            if successor not in trail:
                found = cycle_from(start, successor, trail + [successor])
                if found:
                    return found
        return None

    for name in names:
        cycle = cycle_from(name, name, [name])
        assert cycle is None, "import cycle: " + " -> ".join(cycle)
