#!/usr/bin/env python3
"""Markdown tables from the JSON of ``python -m hdk.bench gdn``: one table per preset and state
dtype, a cell per (T, B) with hdk's time and the fastest peer's speed over hdk's (peer time /
hdk time: below 1.00 the peer is faster). T = 1 compares decode steps, T > 1 the verify pass
(the "multi" rows, FLA against hdk updating the pool without a cache, get a table of their own).

    bench/gdn_peer_table.py python_bench.json > table.md
    bench/gdn_peer_table.py --timer do_bench python_bench.json   # the eager-call timer
"""

import argparse
import json
from collections import defaultdict


def cells(rows):
    grouped = defaultdict(dict)
    for row in rows:
        grouped[(row.get("preset", ""), row["state"], row["mode"], row["T"], row["B"])][
            row["impl"]
        ] = row
    return grouped


def cell(implementations, timer="time_us"):
    """(text, fastest peer time / hdk time or None); timer: the row field compared."""
    mine = implementations.get("hdk")
    if not mine or mine.get(timer) is None:
        return "-", None
    peers = [
        (row[timer], name)
        for name, row in implementations.items()
        if name != "hdk" and row.get(timer) is not None and row.get("check") == "ok"
    ]
    text = f"{mine[timer]:.1f} us"
    if not peers:
        skipped = [row.get("note", "") for name, row in implementations.items() if name != "hdk"]
        return text + (" (peer skipped)" if any(skipped) else ""), None
    fastest, name = min(peers)
    ratio = fastest / mine[timer]
    return f"{text}, {ratio:.2f} {name}", ratio


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json")
    parser.add_argument(
        "--timer",
        choices=("graph", "do_bench"),
        default="graph",
        help="graph: CUDA-graph replay after an L2 flush (time_us); do_bench: "
        "triton.testing.do_bench of eager calls (do_bench_us)",
    )
    args = parser.parse_args()
    timer = "time_us" if args.timer == "graph" else "do_bench_us"
    with open(args.json) as handle:
        document = json.load(handle)
    grouped = cells(document["rows"])
    batches = sorted({key[4] for key in grouped})
    bandwidth = document["copy_bandwidth_GBps"]
    print(f"device: {document['device']}; copy bandwidth {bandwidth:.0f} GB/s; timer: {args.timer}")
    # decode (T = 1) and verify (T > 1) rows share one table; "multi" rows get their own.
    tables = sorted(
        {(key[0], key[1], "multi" if key[2] == "multi" else "grid") for key in grouped},
        key=lambda k: (k[0], k[1], k[2] == "multi"),
    )
    wins = total = 0
    for preset, state, mode in tables:
        title = "T = 1 decode, T > 1 verify"
        if mode == "multi":
            title = "multi-token update, no cache (vs FLA)"
        print(f"\n{preset}, {state} state, {title}\n")
        print("| T | " + " | ".join(f"B={b}" for b in batches) + " |")
        print("|---|" + "---|" * len(batches))
        modes = ("decode", "verify") if mode != "multi" else ("multi",)
        token_counts = {key[3] for key in grouped if key[:2] == (preset, state) and key[2] in modes}
        for tokens in sorted(token_counts):
            row = []
            for batch in batches:
                keys = [(preset, state, m, tokens, batch) for m in modes]
                implementations = next((grouped[key] for key in keys if key in grouped), {})
                text, ratio = cell(implementations, timer)
                row.append(text)
                if mode != "multi" and ratio is not None:
                    total += 1
                    wins += ratio >= 1.0
            print(f"| {tokens} | " + " | ".join(row) + " |")
    print(
        f"\ndecode/verify cells where hdk is at least as fast as the fastest peer: "
        f"{wins} of {total}"
    )


if __name__ == "__main__":
    main()
