"""python -m hdk.bench dsv4-step against a stand-in hdk-bench that records its arguments and
writes a JSON report in the real one's layout: options are passed on, --json is added (or kept),
the step rows come out as one table with their calls' times, and the exit status is the
binary's."""

import json
import os
import stat
import sys
import textwrap

from hdk.bench import __main__ as bench_main
from hdk.bench import dsv4_step

STAND_IN = """
import json, sys
args = sys.argv[1:]
path = args[args.index("--json") + 1]
def row(layer, kernel, us, check="-"):
    return {"preset": "flash", "context": 8192, "N": 2, "layer": layer, "kernel": kernel,
            "time_us": us, "MB": 1.0, "floor_us": 4.0, "x_floor": us / 4.0, "ws_MiB": 0.5,
            "check": check}
results = [row("csa", "store_entries", 5.0), row("csa", "index_topk", 30.0),
           row("csa", "step", 60.0, "ok"),
           dict(row("moe", "route", 9.0, "ok"), context="-")]
with open(path, "w") as file:
    json.dump({"command": " ".join(args), "device": "stand-in GPU", "timing": "cold (flushed)",
               "results": results}, file)
print("binary table")
sys.exit(int("--fail" in args))
"""


def stand_in(tmp_path):
    path = tmp_path / "hdk-bench"
    path.write_text(f"#!{sys.executable}\n" + textwrap.dedent(STAND_IN))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_runs_the_binary_and_prints_the_steps(tmp_path, capfd):
    binary = stand_in(tmp_path)
    report = tmp_path / "step.json"
    status = bench_main.main(
        ["dsv4-step", "--hdk-bench", binary, "--N", "2", "--json", str(report), "--hot"]
    )
    assert status == 0
    out = capfd.readouterr().out
    assert "binary table" in out
    lines = out.splitlines()
    csa = next(line for line in lines if " csa " in line)
    assert "60.0" in csa and "4.0" in csa and "15.0" in csa
    assert "store_entries 5.0, index_topk 30.0" in csa
    assert any(" moe " in line and "9.0" in line for line in lines)
    command = json.loads(report.read_text())["command"]
    assert command.startswith("dsv4-step --N 2 --hot --json")


def test_exit_status_and_missing_binary(tmp_path, monkeypatch, capfd):
    binary = stand_in(tmp_path)
    monkeypatch.setenv("HDK_BENCH", binary)
    assert dsv4_step.main(["--fail"]) == 1
    assert "stand-in GPU" in capfd.readouterr().out
    assert dsv4_step.main(["--hdk-bench", str(tmp_path / "missing")]) == 2
    assert "no hdk-bench binary" in capfd.readouterr().err
    assert os.path.exists(binary)
