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
    kinds = {
        (row["state"], row["T"], row["B"], row["mode"], row["impl"], row["call_form"])
        for row in rows
    }
    for state in ("bf16", "fp32"):
        for batch in (1, 2):
            for impl, form in (("hdk", "pool"), ("sglang", "pool"), ("hdk", "dense")):
                assert (state, 1, batch, "decode", impl, form) in kinds
            assert (state, 1, batch, "decode", "fla", "dense") in kinds
            assert (state, 2, batch, "verify", "hdk", "pool") in kinds
            # verify has no FLA, so hdk runs on the pool only
            assert (state, 2, batch, "verify", "hdk", "dense") not in kinds
            assert (state, 2, batch, "multi", "fla", "dense") in kinds
            assert (state, 2, batch, "multi", "hdk", "dense") in kinds
    for row in rows:
        if row["impl"] == "hdk":
            assert row["time_us"] > 0 and row["pct_copy"] > 0
            if row["call_form"] == "dense":  # checked against the pool form like a peer
                assert row["check"] == "ok" and row["err_out"] < 1e-6, row
                assert row["err_state"] < 1e-6, row
        elif row["note"].startswith("skipped"):
            assert (row["impl"], row["T"], row["B"]) == ("sglang", 2, 2)
            assert "2^31" in row["note"]
        else:
            assert row["check"] == "ok", row
            assert row["err_out"] < 1e-6 and row["peer_over_hdk"] > 0
    assert "peer/hdk" in printed and "wrote" in printed
    # Each peer's ratio is against hdk in the peer's call form.
    hdk_time = {
        (row["state"], row["T"], row["B"], row["mode"], row["call_form"]): row["time_us"]
        for row in rows
        if row["impl"] == "hdk"
    }
    for row in rows:
        if row["impl"] != "hdk" and row["peer_over_hdk"] is not None:
            key = (row["state"], row["T"], row["B"], row["mode"], row["call_form"])
            assert row["peer_over_hdk"] == pytest.approx(row["time_us"] / hdk_time[key])


def load_peer_table():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "gdn_peer_table.py"
    spec = importlib.util.spec_from_file_location("gdn_peer_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_peer_table_compares_each_peer_with_hdk_in_its_call_form():
    table = load_peer_table()

    def row(impl, time_us, call_form="pool"):
        return dict(
            preset="p", state="fp32", mode="decode", T=1, B=4, impl=impl, call_form=call_form,
            time_us=time_us, check=None if impl == "hdk" and call_form == "pool" else "ok",
        )  # fmt: skip

    rows = [
        row("hdk", 10.0),
        row("hdk", 8.0, "dense"),
        row("sglang", 11.0),
        row("fla", 9.0, "dense"),
    ]
    implementations = table.cells(rows)[("p", "fp32", "decode", 1, 4)]
    text, ratio = table.cell(implementations)
    # FLA against hdk's dense run (9 / 8 = 1.125), not the pool run: SGLang's 1.10 is the lowest
    assert ratio == pytest.approx(1.10) and text == "10.0 us, 1.10 sglang"
    rows[1]["time_us"] = 9.5  # now FLA's 9 / 9.5 is the lowest
    assert table.cell(table.cells(rows)[("p", "fp32", "decode", 1, 4)])[1] == pytest.approx(9 / 9.5)
    assert table.cell(implementations, same_form=False)[1] == pytest.approx(0.9)
    # JSON from before call forms: every row is the pool form
    old = [
        {key: value for key, value in r.items() if key != "call_form"}
        for r in rows + [row("fla", 9.0)]
        if r["call_form"] == "pool"
    ]
    assert table.cell(table.cells(old)[("p", "fp32", "decode", 1, 4)])[1] == pytest.approx(0.9)


def test_bench_gdn_rejects_zero_timing_rounds(capsys):
    with pytest.raises(SystemExit):
        gdn.parse_args(["--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
