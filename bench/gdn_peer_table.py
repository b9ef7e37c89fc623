#!/usr/bin/env python3
"""Markdown tables from the JSON of ``python -m hdk.bench gdn``: one table per preset and state
dtype, a cell per (T, B) with hdk's time and the fastest peer's speed over hdk's (peer time /
hdk time: below 1.00 the peer is faster). T = 1 compares decode steps, T > 1 the verify pass
(the "multi" rows, FLA against hdk updating the pool without a cache, get a table of their own).
Each peer is compared with hdk in the peer's call form (row field "call_form"): SGLang and
FlashInfer with hdk on the pool ("pool"), FLA with hdk on the dense states FLA gets ("dense", no
slot index). The time in a cell is hdk's on the pool. A line counts the cells again with FLA
against hdk's pool form, and one line per peer (sglang, fla, flashinfer, ...) counts the cells
where hdk is at least as fast as that peer, and those the peer does not serve ("unsupported:"
rows, e.g. FlashInfer's asserts). --peer picks the peers the tables compare with (default: all,
the fastest per cell), e.g. --peer flashinfer for a table of FlashInfer against hdk alone.

    bench/gdn_peer_table.py python_bench.json > table.md
    bench/gdn_peer_table.py --timer do_bench python_bench.json   # the eager-call timer
    bench/gdn_peer_table.py --peer flashinfer python_bench.json  # FlashInfer's column alone
"""

import argparse
import json
from collections import defaultdict


def is_hdk(name):
    return name == "hdk" or name.startswith("hdk:")


def cells(rows):
    """{(preset, state, mode, T, B): {name: row}}; hdk's rows in a form other than the pool are
    named "hdk:<form>" (JSON written before call forms existed has pool rows only)."""
    grouped = defaultdict(dict)
    for row in rows:
        name = row["impl"]
        form = row.get("call_form", "pool")
        if name == "hdk" and form != "pool":
            name = f"hdk:{form}"
        grouped[(row.get("preset", ""), row["state"], row["mode"], row["T"], row["B"])][name] = row
    return grouped


def cell(implementations, timer="time_us", same_form=True, peers=None):
    """(text, the lowest peer time / hdk time or None); timer: the row field compared. With
    same_form each peer's time is divided by hdk's in that peer's call form, else by the pool's.
    peers: the peer names to consider (None: all)."""
    mine = implementations.get("hdk")
    if not mine or mine.get(timer) is None:
        return "-", None
    considered = {
        name: row
        for name, row in implementations.items()
        if not is_hdk(name) and (peers is None or name in peers)
    }
    ratios = []
    for name, row in considered.items():
        if row.get(timer) is None or row.get("check") != "ok":
            continue
        form = row.get("call_form", "pool") if same_form else "pool"
        against = mine if form == "pool" else implementations.get(f"hdk:{form}")
        if against and against.get(timer) is not None:
            ratios.append((row[timer] / against[timer], name))
    text = f"{mine[timer]:.1f} us"
    if not ratios:
        notes = [row.get("note") or "" for row in considered.values()]
        if notes and all(note.startswith("unsupported") for note in notes):
            return text + f" ({'/'.join(considered)} unsupported)", None
        return text + (" (peer skipped)" if any(notes) else ""), None
    ratio, name = min(ratios)
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
    parser.add_argument(
        "--peer",
        default=None,
        help="comma-separated peers the tables compare with (e.g. flashinfer); default: all",
    )
    args = parser.parse_args()
    peers = set(args.peer.split(",")) if args.peer else None
    timer = "time_us" if args.timer == "graph" else "do_bench_us"
    with open(args.json) as handle:
        document = json.load(handle)
    grouped = cells(document["rows"])
    batches = sorted({key[4] for key in grouped})
    bandwidth = document["copy_bandwidth_GBps"]
    names = sorted({name for key in grouped for name in grouped[key] if not is_hdk(name)})
    print(
        f"device: {document['device']}; copy bandwidth {bandwidth:.0f} GB/s; timer: {args.timer}; "
        f"peers: {', '.join(sorted(peers)) if peers else ', '.join(names) + ' (the fastest)'}"
    )
    # decode (T = 1) and verify (T > 1) rows share one table; "multi" rows get their own.
    tables = sorted(
        {(key[0], key[1], "multi" if key[2] == "multi" else "grid") for key in grouped},
        key=lambda k: (k[0], k[1], k[2] == "multi"),
    )
    wins = total = pool_wins = 0
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
                text, ratio = cell(implementations, timer, peers=peers)
                row.append(text)
                if mode != "multi" and ratio is not None:
                    total += 1
                    wins += ratio >= 1.0
                    pool_wins += cell(implementations, timer, False, peers)[1] >= 1.0
            print(f"| {tokens} | " + " | ".join(row) + " |")
    print(
        f"\ndecode/verify cells where hdk is at least as fast as the fastest peer: "
        f"{wins} of {total}"
    )
    print(
        f"the same with every peer against hdk's pool form (FLA's states gathered outside its "
        f"call, hdk's behind the slot index): {pool_wins} of {total}"
    )
    for name in names:
        compared = unsupported = faster = 0
        for key, implementations in grouped.items():
            if key[2] == "multi" or name not in implementations:
                continue
            if (implementations[name].get("note") or "").startswith("unsupported"):
                unsupported += 1
            ratio = cell(implementations, timer, peers={name})[1]
            if ratio is not None:
                compared += 1
                faster += ratio >= 1.0
        print(
            f"hdk at least as fast as {name}: {faster} of {compared} decode/verify cells"
            + (f"; {name} unsupported in {unsupported}" if unsupported else "")
        )


if __name__ == "__main__":
    main()
