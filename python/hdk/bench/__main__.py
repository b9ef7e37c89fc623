"""python -m hdk.bench <benchmark> [options]. Benchmarks: gdn (``--help`` for its options)."""

import sys

USAGE = "usage: python -m hdk.bench gdn [--help | options]"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "gdn":
        from hdk.bench import gdn

        return gdn.main(rest)
    print(f"unknown benchmark {name!r}; {USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
