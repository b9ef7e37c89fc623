"""python -m hdk.bench <benchmark> [options]. Benchmarks: gdn, dsv4-step (``--help`` for their
options)."""

import sys

USAGE = "usage: python -m hdk.bench {gdn,dsv4-step} [--help | options]"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "gdn":
        from hdk.bench import gdn

        return gdn.main(rest)
    if name == "dsv4-step":
        from hdk.bench import dsv4_step

        return dsv4_step.main(rest)
    print(f"unknown benchmark {name!r}; {USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
