#!/usr/bin/env python3
"""Plot % of copy bandwidth against batch size from `hdk-bench gdn --json` output.

Usage: plot_gdn.py RESULTS.json [more.json ...] --out PLOT.png [--title TEXT]
One line per (state dtype, T); each JSON file's device and copy bandwidth go in the title. The
y axis spans every point (a CPU point can read a little above 100%) and names the bandwidth the
device's runs were judged against. matplotlib: `scripts/setup.sh --python` installs it.
"""
import argparse
import json
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_gdn.py needs matplotlib (Debian: apt-get install python3-matplotlib)")


def is_cpu_run(run):
    # hdk-bench writes the CPU as "CPU: <model>, N threads" and a GPU by its name.
    return run["device"].startswith("CPU")


def y_label(runs):
    kinds = {is_cpu_run(run) for run in runs}
    if kinds == {True}:
        return "% of the CPU's copy bandwidth (best of copies and in-place read-modify-write)"
    if kinds == {False}:
        return "% of device-to-device copy bandwidth"
    return "% of each run's copy bandwidth (GPU: device to device; CPU: best method)"


def y_limits(values):
    """0 to a little above the highest point, and at least to 105 so 100% shows as a line."""
    return 0.0, max([105.0] + [1.05 * value for value in values])


def plot(runs, title=""):
    """The figure for `runs` (parsed JSON files), and the axis it drew on."""
    figure, axis = plt.subplots(figsize=(9, 5.5))
    titles, values = [], []
    for run in runs:
        titles.append(
            f"{run['device'].split(' (')[0]}, copy {float(run['copy_bandwidth_gbs']):.0f} GB/s,"
            f" {run.get('timing', '')}"
        )
        lines = {}
        for row in run["results"]:
            if not isinstance(row.get("%copy"), (int, float)):
                continue  # a point that failed
            key = (row["state"], row["T"], row["mode"], row["preset"])
            lines.setdefault(key, []).append((row["B"], row["%copy"]))
            values.append(row["%copy"])
        for (state, tokens, mode, preset), points in sorted(lines.items()):
            points.sort()
            style = "-" if state == "bf16" else "--"
            axis.plot(
                [b for b, _ in points],
                [c for _, c in points],
                style,
                marker="o",
                markersize=3,
                label=f"{preset} {state} T={tokens} ({mode})",
            )
    axis.set_xscale("log", base=2)
    axis.set_xlabel("batch size B (requests)")
    axis.set_ylabel(y_label(runs))
    axis.set_ylim(*y_limits(values))
    axis.axhline(100.0, color="grey", linewidth=0.8)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, ncol=2)
    axis.set_title(
        ("hdk GDN decode: " + title + "\n" if title else "hdk GDN decode\n")
        + "; ".join(sorted(set(titles))),
        fontsize=9,
    )
    figure.tight_layout()
    return figure, axis


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", nargs="+", help="JSON files written by hdk-bench gdn --json")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--title", default="", help="extra title text")
    args = parser.parse_args()
    runs = []
    for path in args.results:
        with open(path) as handle:
            runs.append(json.load(handle))
    figure, _ = plot(runs, args.title)
    figure.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
