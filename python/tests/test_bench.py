"""python -m hdk.bench gdn end to end on the CPU, with stand-in peers that have the real
peers' call signatures (the real ones are Triton kernels: the GPU run covers them)."""

import json
import textwrap

import pytest

from hdk.bench import gdn

SGLANG_STAND_IN = """
from hdk.compat.sglang import fused_sigmoid_gating_delta_rule_update
"""

FLA_STAND_IN = """
import torch
import hdk


def fused_recurrent_gated_delta_rule(q, k, v, g=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False,
                                     use_gate_in_kernel=False, A_log=None, dt_bias=None,
                                     use_beta_sigmoid_in_kernel=False, state_v_first=False):
    assert use_gate_in_kernel and use_beta_sigmoid_in_kernel and state_v_first
    final = initial_state.float().clone()
    o = hdk.gdn_decode(q, k, v, final, A_log=A_log, a=g, dt_bias=dt_bias, b=beta, scale=scale,
                       use_qk_l2norm=use_qk_l2norm_in_kernel)
    return o, final
"""


@pytest.fixture
def stand_in_peers(tmp_path):
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "fused_sigmoid_gating_recurrent.py").write_text(SGLANG_STAND_IN)
    package = tmp_path / "fla" / "ops" / "gated_delta_rule"
    package.mkdir(parents=True)
    (tmp_path / "fla" / "__init__.py").write_text("")
    (tmp_path / "fla" / "ops" / "__init__.py").write_text("")
    (package / "__init__.py").write_text(textwrap.dedent(FLA_STAND_IN))
    return tmp_path


def test_bench_gdn_with_stand_in_peers(stand_in_peers, tmp_path, monkeypatch, capsys):
    # A limit low enough that the SGLang skip for int32 cache offsets shows up at B=2, T=2.
    monkeypatch.setattr(gdn, "SGLANG_CACHE_LIMIT", 2 * 2 * 32 * 128 * 128)
    report = tmp_path / "bench.json"
    status = gdn.main(
        [
            "--device",
            "cpu",
            "--cpu-peers",
            "--peers-dir",
            str(stand_in_peers),
            "--preset",
            "qwen3-next",
            "--batch",
            "1,2",
            "--T",
            "1,2",
            "--state",
            "bf16,fp32",
            "--iters",
            "2",
            "--min-iters",
            "1",
            "--json",
            str(report),
        ]
    )
    printed = capsys.readouterr().out
    assert status == 0, printed
    document = json.loads(report.read_text())
    assert document["peers"] == {"sglang": "loaded", "fla": "loaded"}
    rows = document["rows"]
    kinds = {(row["state"], row["T"], row["B"], row["mode"], row["impl"]) for row in rows}
    for state in ("bf16", "fp32"):
        for batch in (1, 2):
            for impl in ("hdk", "sglang", "fla"):
                assert (state, 1, batch, "decode", impl) in kinds
            assert (state, 2, batch, "verify", "hdk") in kinds
            assert (state, 2, batch, "multi", "fla") in kinds
    for row in rows:
        if row["impl"] == "hdk":
            assert row["time_us"] > 0 and row["pct_copy"] > 0
        elif row["note"].startswith("skipped"):
            assert (row["impl"], row["T"], row["B"]) == ("sglang", 2, 2)
            assert "2^31" in row["note"]
        else:
            assert row["check"] == "ok", row
            assert row["err_out"] < 1e-6 and row["peer_over_hdk"] > 0
    assert "peer/hdk" in printed and "wrote" in printed
