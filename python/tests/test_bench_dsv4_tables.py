"""bench/dsv4_tables.py, which makes the bench/results tables of the DeepSeek-V4 read side: a
bundle of rounds (FILE.json:NAME) gives the same table as the rounds' files, the faster round
wins each cell, and a malformed bundle argument stops with a message."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "dsv4_tables.py"


def run_json(times):
    """An hdk-bench attention --json run with one index_topk cell per (N, time)."""
    results = [{"op": "index_topk", "preset": "flash", "list": "fp8", "N": n, "L": 2048, "Hq": 64,
                "top_k": 512, "kernel": "workspace", "cluster": "16/1 CTA", "time_us": t,
                "GB/s": 1.0, "%copy": 0.1, "floor_us": 2.0, "x_floor": t / 2.0, "target": "-",
                "check": "-"} for n, t in times]
    return {"command": "hdk-bench attention", "copy_bandwidth_gbs": 4200.0, "device": "test GPU",
            "launch_overhead_us": 2.5, "timing": "graph", "results": results}


def tables(*args):
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True)
    return done.returncode, done.stdout, done.stderr


def test_a_bundle_gives_the_table_of_its_files(tmp_path):
    files = {
        "new_1.json": run_json([(1, 20.0), (8, 31.0)]),
        "new_2.json": run_json([(1, 19.0), (8, 32.0)]),
        "base_1.json": run_json([(1, 21.0), (8, 35.0)]),
        "base_2.json": run_json([(1, 22.0), (8, 34.0)]),
    }
    for name, data in files.items():
        (tmp_path / name).write_text(json.dumps(data))
    p = {name: str(tmp_path / name) for name in files}
    bundle = str(tmp_path / "bundle.json")
    code, _, err = tables("bundle", bundle, f"new={p['new_1.json']},{p['new_2.json']}",
                          f"base={p['base_1.json']},{p['base_2.json']}")
    assert code == 0, err
    assert json.loads(Path(bundle).read_text())["new"][1] == files["new_2.json"]

    code, from_files, err = tables("attention", p["new_1.json"], p["new_2.json"], "--base",
                                   p["base_1.json"], p["base_2.json"])
    assert code == 0, err
    code, from_bundle, err = tables("attention", bundle + ":new", "--base", bundle + ":base")
    assert code == 0, err
    assert from_bundle == from_files
    rows = [line for line in from_bundle.splitlines() if line.startswith("| index_topk")]
    assert len(rows) == 2
    # The faster round of each binary: N = 1 19.0 against 21.0, N = 8 31.0 against 34.0.
    assert "| 19.0 | 21.0 | 1.11 |" in rows[0]
    assert "| 31.0 | 34.0 | 1.10 |" in rows[1]


def test_a_malformed_bundle_argument_is_refused(tmp_path):
    code, _, err = tables("bundle", str(tmp_path / "out.json"), "new")
    assert code != 0
    assert "expected NAME=RUN.json" in err
    assert not (tmp_path / "out.json").exists()


def peers_json(cells):
    """A bench/dsv4_vs_peers.py --ops index --json run; each cell (N, entries, hdk kernels, peer
    kernels, hdk fp8 us) with kernels as (start, end) pairs, or without timelines when both are
    None."""
    results = []
    for n, entries, hdk, peer, hdk_us in cells:
        row = {"op": "index_topk", "N": n, "entries": entries, "peer_topk": "hdk.topk",
               "hdk_fp8_us": hdk_us, "hdk_mxfp4_us": "error", "bytes_fp8": n * entries * 132,
               "bytes_mxfp4": n * entries * 68, "check": "ok"}
        if hdk is not None:
            line = lambda kernels: ([[i, f"kernel{i}", a, b] for i, (a, b) in enumerate(kernels)] +
                                    [["end", "", 0.0, kernels[-1][1]]])
            row["timelines"] = {"hdk_fp8": line(hdk), "deepgemm_hdk_topk": line(peer)}
        results.append(row)
    return {"index_peer": "deepgemm", "copy_bandwidth_gbs": 4000.0, "results": results}


def test_index_timeline_gives_each_kernel_and_the_differences(tmp_path):
    path = tmp_path / "timeline.json"
    path.write_text(json.dumps(peers_json([
        (1, 2048, [(1.5, 6.5), (7.0, 16.0)], [(1.5, 5.5), (6.0, 20.0)], 16.0),
        (64, 2048, [(1.0, 30.0)], [(1.0, 20.0), (21.0, 32.0)], 30.0),  # one launch
    ])))
    code, out, err = tables("index-timeline", str(path))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].startswith("| keys | N | hdk scoring | hdk select ends | DeepGEMM logits |")
    # Scoring 5.0 against logits 4.0 (+1.0); select 9.5 after its scores against 14.5 (-5.0).
    assert lines[2] == ("| 2048 | 1 | 1.5 -> 6.5 us (5.0) | 16.0 (9.5 after) | 1.5 -> 5.5 (4.0) | "
                        "20.0 (14.5 after) | +1.0 | -5.0 |")
    assert lines[3] == "| 2048 | 64 | 1 kernels | - | 2 kernels | - | - | - |"


def test_index_timeline_without_timelines_is_refused(tmp_path):
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(peers_json([(1, 2048, None, None, 16.0)])))
    code, _, err = tables("index-timeline", str(path))
    assert code != 0
    assert "--timeline" in err


def test_index_copy_share_is_bytes_over_time_over_the_run_bandwidth(tmp_path):
    path = tmp_path / "peers.json"
    # 8 x 65536 x 132 bytes in 43.26 us: 2000 GB/s, half of the run's 4000.
    path.write_text(json.dumps(peers_json([(8, 65536, None, None, 8 * 65536 * 132 / 2000e3)])))
    code, out, err = tables("index-copy-share", str(path))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "| index_topk, hdk | N=8 |"
    assert lines[2] == "| 65536 keys, fp8 | 50.0% |"
    assert lines[3] == "| 65536 keys, mxfp4 | - |"  # a cell that did not run
