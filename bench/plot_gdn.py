#!/usr/bin/env python3
"""Plot % of copy bandwidth against batch size from `hdk-bench gdn --json` output.

Usage: plot_gdn.py RESULTS.json [more.json ...] --out PLOT.png [--title TEXT]
One line per (state dtype, T); each JSON file's device and copy bandwidth go in the title.
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


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", nargs="+", help="JSON files written by hdk-bench gdn --json")
    parser.add_argument("--out", required=True, help="PNG file to write")
    parser.add_argument("--title", default="", help="extra title text")
    args = parser.parse_args()

    figure, axis = plt.subplots(figsize=(9, 5.5))
    titles = []
    for path in args.results:
        with open(path) as handle:
            run = json.load(handle)
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
    axis.set_ylabel("% of device-to-device copy bandwidth")
    axis.set_ylim(0, 105)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=7, ncol=2)
    axis.set_title(
        ("hdk GDN decode: " + args.title + "\n" if args.title else "hdk GDN decode\n")
        + "; ".join(sorted(set(titles))),
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
