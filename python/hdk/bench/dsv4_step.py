"""``python -m hdk.bench dsv4-step``: one DeepSeek-V4 layer's decode step, per kernel and whole,
through the C++ benchmark ``hdk-bench dsv4-step`` (bench/dsv4_step_bench.cpp), which captures
the step in one CUDA graph and measures the floor in the same run. This runs the binary with
``--json``, passes every other option on, lets its output through, and then prints the step
rows of the JSON as one table: per layer the step's time, floor and x floor next to the times of
its calls alone.

The binary is ``--hdk-bench PATH``, else ``$HDK_BENCH``, else ``build/bench/hdk-bench`` under
the current directory (a CUDA build: ``cmake -DHDK_WITH_CUDA=ON``)."""

import json
import os
import subprocess
import sys
import tempfile

DEFAULT_BINARY = os.path.join("build", "bench", "hdk-bench")
USAGE = (
    "usage: python -m hdk.bench dsv4-step [--hdk-bench PATH] [hdk-bench dsv4-step options]\n"
    "  --hdk-bench PATH   the hdk-bench binary (default: $HDK_BENCH or build/bench/hdk-bench)\n"
    "  --json FILE        keep the binary's JSON (default: a temporary file)\n"
    "  other options go to the binary: `hdk-bench dsv4-step --help` lists them"
)
KEY = ("preset", "context", "N", "layer")


def _take(argv, name):
    """Removes ``name VALUE`` or ``name=VALUE`` from argv; returns VALUE or None."""
    for i, word in enumerate(argv):
        if word == name and i + 1 < len(argv):
            value = argv[i + 1]
            del argv[i : i + 2]
            return value
        if word.startswith(name + "="):
            del argv[i]
            return word.split("=", 1)[1]
    return None


def step_table(results):
    """Rows of (preset, context, N, layer, step us, floor us, x floor, check, {kernel: us}) from
    the binary's records, in their order."""
    steps, kernels = [], {}
    for record in results:
        key = tuple(record[k] for k in KEY)
        if record["kernel"] in ("step", "route"):
            steps.append((key, record))
        else:
            kernels.setdefault(key, []).append((record["kernel"], record["time_us"]))
    return [(key, record, kernels.get(key, [])) for key, record in steps]


def format_table(results):
    lines = []
    header = f"{'preset':>6} {'context':>7} {'N':>4} {'layer':>5} {'step_us':>9} " + (
        f"{'floor_us':>9} {'x_floor':>7} {'check':>5}  calls alone (us)"
    )
    lines.append(header)
    lines.append("-" * len(header))
    for key, record, calls in step_table(results):
        preset, context, n, layer = key
        alone = ", ".join(f"{name} {us}" for name, us in calls) or "-"
        lines.append(
            f"{preset:>6} {context!s:>7} {n!s:>4} {layer:>5} {record['time_us']!s:>9} "
            f"{record['floor_us']!s:>9} {record['x_floor']!s:>7} {record['check']:>5}  {alone}"
        )
    return "\n".join(lines)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0
    binary = _take(argv, "--hdk-bench") or os.environ.get("HDK_BENCH") or DEFAULT_BINARY
    json_path = _take(argv, "--json")
    if not os.path.exists(binary):
        print(
            f"hdk.bench dsv4-step: no hdk-bench binary at {binary!r}: build it with "
            "`cmake -S . -B build -DHDK_WITH_CUDA=ON && cmake --build build --target hdk-bench` "
            "or pass --hdk-bench PATH",
            file=sys.stderr,
        )
        return 2
    with tempfile.TemporaryDirectory() as folder:
        path = json_path or os.path.join(folder, "dsv4-step.json")
        status = subprocess.call([binary, "dsv4-step", *argv, "--json", path])
        if not os.path.exists(path):
            return status or 1
        with open(path) as file:
            report = json.load(file)
    print(f"\nsteps ({report.get('device', '?')}; {report.get('timing', '?')}):")
    print(format_table(report["results"]))
    return status


if __name__ == "__main__":
    sys.exit(main())
