"""bench/plot_gdn.py: the y axis holds every point and names the device's bandwidth."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

PLOT_GDN = Path(__file__).resolve().parents[2] / "bench" / "plot_gdn.py"


def run_json(device, percents):
    rows = [
        {"preset": "qwen3.5-397b", "B": b, "T": 1, "state": "bf16", "mode": "decode", "%copy": p}
        for b, p in zip((1, 8, 32), percents)
    ]
    return {"device": device, "copy_bandwidth_gbs": 40.0, "timing": "cold", "results": rows}


def plotted_axis(tmp_path, monkeypatch, runs):
    """Runs plot_gdn.py's main on `runs` and returns the axis of the figure it saved."""
    paths = []
    for i, run in enumerate(runs):
        paths.append(tmp_path / f"run{i}.json")
        paths[-1].write_text(json.dumps(run))
    saved = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, *args, **kwargs: saved.append(figure))
    argv = ["plot_gdn.py", *map(str, paths), "--out", str(tmp_path / "plot.png")]
    monkeypatch.setattr(sys, "argv", argv)
    spec = importlib.util.spec_from_file_location("plot_gdn", PLOT_GDN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    assert len(saved) == 1
    return saved[0].axes[0]


def test_cpu_points_above_100_percent_stay_on_the_plot(tmp_path, monkeypatch):
    axis = plotted_axis(tmp_path, monkeypatch, [run_json("CPU: Xeon, 2 threads", [95, 112, 118])])
    low, high = axis.get_ylim()
    assert low <= 0 and high >= 118
    assert "device-to-device" not in axis.get_ylabel()
    assert "CPU" in axis.get_ylabel()


def test_gpu_runs_are_labelled_device_to_device(tmp_path, monkeypatch):
    gpu_run = run_json("NVIDIA H100 80GB HBM3 (132 SMs)", [40, 80, 92])
    axis = plotted_axis(tmp_path, monkeypatch, [gpu_run])
    assert "device-to-device" in axis.get_ylabel()
    assert axis.get_ylim()[1] >= 100
