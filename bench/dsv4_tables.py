#!/usr/bin/env python3
"""Markdown tables of the DeepSeek-V4 read side from hdk-bench JSON, for bench/results READMEs.

  dsv4_tables.py attention NEW.json [NEW2.json ...] --base BASE.json [BASE2.json ...]
      sparse_decode and index_topk: per cell the faster of the rounds given, the base binary's
      time, new / base speed-up, what ran (kernel, cluster), floor, x floor and % of copy.
  dsv4_tables.py step STEP.json [STEP2.json ...] [--base BASE.json ...]
      hdk-bench dsv4-step: per cell the faster of the rounds given; the whole step per layer,
      preset, context and N (time, x floor), base / new where a base is given, and each call
      alone at N = 1.

A run is an hdk-bench --json file, or FILE.json:NAME for the rounds kept under NAME in a bundle
(`bundle` below: {"NAME": [run, run, ...], ...}), which keeps a folder of bench/results small.

  dsv4_tables.py bundle OUT.json NAME=RUN.json[,RUN2.json ...] [NAME2=...]
"""
import argparse
import json
import sys


def load(paths):
    runs = []
    for path in paths:
        file, _, name = path.partition(":")
        data = json.load(open(file))
        runs.extend(data[name] if name else [data])
    return runs


def bundle(args):
    out = {}
    for item in args.runs:
        name, _, files = item.partition("=")
        if not name or not files:
            sys.exit(f"bundle: expected NAME=RUN.json[,RUN2.json ...], got '{item}'")
        out[name] = [json.load(open(path)) for path in files.split(",")]
    with open(args.out, "w") as f:
        json.dump(out, f, separators=(",", ":"))


def best(runs, key_of):
    """The fastest time per key over the runs, and that run's row."""
    out = {}
    for run in runs:
        for row in run["results"]:
            key = key_of(row)
            if row.get("time_us") in (None, "error"):
                continue
            time = float(row["time_us"])
            if key not in out or time < float(out[key]["time_us"]):
                out[key] = row
    return out


def attention(args):
    new_runs, base_runs = load(args.new), load(args.base)
    key_of = lambda r: (r["op"], r["preset"], r["list"], int(r["N"]), str(r["L"]))
    new, base = best(new_runs, key_of), best(base_runs, key_of)
    first = new_runs[0]
    print(f"Copy bandwidth {first['copy_bandwidth_gbs']} GB/s, empty-kernel graph replay "
          f"{first['launch_overhead_us']} us ({first['device']}).\n")
    print("| op | preset | list | N | L | new, us | base, us | base / new | ran | floor, us | x floor "
          "| % of copy |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for key, row in new.items():
        base_row = base.get(key)
        base_us = float(base_row["time_us"]) if base_row else None
        new_us = float(row["time_us"])
        ratio = f"{base_us / new_us:.2f}" if base_us else "-"
        base_text = f"{base_us:.1f}" if base_us else "-"
        ran = f"{row.get('kernel', '-')} {row.get('cluster', '-')}"
        print(f"| {row['op']} | {row['preset']} | {row['list']} | {row['N']} | {row['L']} | "
              f"{new_us:.1f} | {base_text} | {ratio} | {ran} | {row.get('floor_us', '-')} | "
              f"{row.get('x_floor', '-')} | {row.get('%copy', '-')} |")


def step(args):
    runs = load(args.step)
    first = runs[0]
    print(f"Copy bandwidth {first['copy_bandwidth_gbs']} GB/s, empty-kernel graph replay "
          f"{first['launch_overhead_us']} us ({first['device']}).\n")
    key_of = lambda r: (r["preset"], r["layer"], str(r["context"]), int(r["N"]), r["kernel"])
    new = best(runs, key_of)
    base = best(load(args.base), key_of) if args.base else {}
    steps = [r for r in new.values() if r["kernel"] in ("step", "route")]
    layers = sorted({(r["preset"], r["layer"]) for r in steps}, key=lambda k: (k[0] != "flash", k))
    contexts = sorted({int(r["context"]) for r in steps if r["context"] not in ("-", "")})
    ns = sorted({int(r["N"]) for r in steps})

    def rows_of(layer):
        return [None] if layer == "moe" else contexts

    def cell(preset, layer, context, n, text):
        kernel = "route" if layer == "moe" else "step"
        key = (preset, layer, str(context) if context else "-", n, kernel)
        return text(new[key], base.get(key)) if key in new else "-"

    def table(title, text):
        print(title + "\n")
        print("| preset | layer | context | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---|---|---|" + "---|" * len(ns))
        for preset, layer in layers:
            for context in rows_of(layer):
                cells = [cell(preset, layer, context, n, text) for n in ns]
                print(f"| {preset} | {layer} | {context if context else '-'} | " +
                      " | ".join(cells) + " |")
        print()

    table("Whole step, time in us (x floor):",
          lambda r, b: f"{float(r['time_us']):.1f} ({r['x_floor']})")
    if base:
        table("Whole step, base / new (above 1.00 the new code is faster):",
              lambda r, b: f"{float(b['time_us']) / float(r['time_us']):.3f}" if b else "-")
    print("Each call alone at N = 1 (its own graph), time in us (x floor)" +
          (", and the base's time:" if base else ":") + "\n")
    # The new run's calls, and the base's that the new run does not make (time "-").
    is_call = lambda r: r["kernel"] not in ("step", "route") and int(r["N"]) == 1
    calls = [r for r in new.values() if is_call(r)]
    calls += [r for key, r in base.items() if is_call(r) and key not in new]
    calls.sort(key=lambda r: (r["preset"] != "flash", r["preset"], int(r["context"]), r["layer"]))
    print("| preset | layer | context | call | time, us | x floor |" +
          (" base, us |" if base else ""))
    print("|---|---|---|---|---|---|" + ("---|" if base else ""))
    for r in calls:
        key = key_of(r)
        mine, b = new.get(key), base.get(key)
        time = f"{float(mine['time_us']):.1f} | {mine['x_floor']}" if mine else "- | -"
        print(f"| {r['preset']} | {r['layer']} | {r['context']} | {r['kernel']} | {time} |" +
              ((f" {float(b['time_us']):.1f} |" if b else " - |") if base else ""))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="table", required=True)
    a = sub.add_parser("attention")
    a.add_argument("new", nargs="+")
    a.add_argument("--base", nargs="+", required=True)
    s = sub.add_parser("step")
    s.add_argument("step", nargs="+")
    s.add_argument("--base", nargs="+")
    b = sub.add_parser("bundle")
    b.add_argument("out")
    b.add_argument("runs", nargs="+")
    args = parser.parse_args()
    {"attention": attention, "step": step, "bundle": bundle}[args.table](args)


if __name__ == "__main__":
    sys.exit(main())
