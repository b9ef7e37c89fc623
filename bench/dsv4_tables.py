#!/usr/bin/env python3
"""Markdown tables of the DeepSeek-V4 read side from hdk-bench and bench/dsv4_vs_peers.py JSON,
for bench/results READMEs.

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

  dsv4_tables.py index-timeline TIMELINE.json
      bench/dsv4_vs_peers.py --ops index --timeline: per cell, hdk's scoring kernel and the end of
      its select against the peer's logits kernel and the end of its top-k, inside the graph (us
      from the flush's end), and the differences of the two kernels' times.
  dsv4_tables.py index-copy-share PEERS.json
      bench/dsv4_vs_peers.py --ops index: hdk's stored bytes over its time, as a share of the copy
      bandwidth measured in the same run, per key format, keys a row and N.
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


def index_timeline(args):
    data = json.load(open(args.timeline))
    rows = [r for r in data["results"] if r.get("timelines")]
    if not rows:
        sys.exit(f"index-timeline: {args.timeline} holds no timelines (run with --timeline)")
    peer = {"deepgemm": "DeepGEMM"}.get(data.get("index_peer"), "peer")
    topk = rows[0].get("peer_topk", "the peer's top-k")
    print(f"| keys | N | hdk scoring | hdk select ends | {peer} logits | {topk} ends | "
          f"scoring, hdk - {peer} | select - {topk} |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        # Each timeline: [position, kernel, start, end] per kernel, then ["end", "", 0, end].
        kernels = {name: [k for k in line if k[0] != "end"] for name, line in r["timelines"].items()}
        hdk = kernels.pop("hdk_fp8")
        theirs = next(iter(kernels.values()), [])
        if len(hdk) != 2 or len(theirs) != 2:
            # One launch (no separate select) or a peer without its own top-k kernel.
            print(f"| {r['entries']} | {r['N']} | {len(hdk)} kernels | - | {len(theirs)} kernels | "
                  "- | - | - |")
            continue
        (_, _, score_start, score_end), (_, _, _, select_end) = hdk
        (_, _, logits_start, logits_end), (_, _, _, topk_end) = theirs
        score, logits = score_end - score_start, logits_end - logits_start
        select_after, topk_after = select_end - score_end, topk_end - logits_end
        print(f"| {r['entries']} | {r['N']} | {score_start:.1f} -> {score_end:.1f} us ({score:.1f}) "
              f"| {select_end:.1f} ({select_after:.1f} after) | {logits_start:.1f} -> "
              f"{logits_end:.1f} ({logits:.1f}) | {topk_end:.1f} ({topk_after:.1f} after) | "
              f"{score - logits:+.1f} | {select_after - topk_after:+.1f} |")


def index_copy_share(args):
    data = json.load(open(args.peers))
    bandwidth = float(data["copy_bandwidth_gbs"])
    rows = data["results"]
    ns = sorted({int(r["N"]) for r in rows})
    print("| index_topk, hdk | " + " | ".join(f"N={n}" for n in ns) + " |")
    print("|---|" + "---|" * len(ns))
    for entries in sorted({int(r["entries"]) for r in rows}):
        for form in ("fp8", "mxfp4"):
            cells = []
            for n in ns:
                row = next((r for r in rows if int(r["N"]) == n and int(r["entries"]) == entries),
                           None)
                time = row.get(f"hdk_{form}_us") if row else None
                if time in (None, "error"):
                    cells.append("-")
                    continue
                gbs = row[f"bytes_{form}"] / (float(time) * 1e-6) / 1e9
                cells.append(f"{gbs / bandwidth * 100:.1f}%")
            print(f"| {entries} keys, {form} | " + " | ".join(cells) + " |")


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
    t = sub.add_parser("index-timeline")
    t.add_argument("timeline")
    c = sub.add_parser("index-copy-share")
    c.add_argument("peers")
    args = parser.parse_args()
    {"attention": attention, "step": step, "bundle": bundle, "index-timeline": index_timeline,
     "index-copy-share": index_copy_share}[args.table](args)


if __name__ == "__main__":
    sys.exit(main())
