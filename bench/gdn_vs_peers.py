#!/usr/bin/env python3
"""hdk's GDN decode against SGLang's and FLA's Triton kernels, side by side in one process.

The comparison itself is `python -m hdk.bench gdn` (it lives in the package because it needs
the torch extension); this is its entry point from bench/. The peers are imported only when
their sources are present in the git-ignored .peers/ folder (never committed), e.g.
.peers/sglang/fused_sigmoid_gating_recurrent.py and .peers/fla/. Every option of the package
benchmark passes through: --batch, --T, --state, --preset, --json FILE, --peers-dir, --help.

Usage: python3 bench/gdn_vs_peers.py [--batch 1,16,64,256] [--T 1,2,4,8] [--json out.json]
Recorded runs: bench/results/<date>-<device>/python/gdn_vs_peers.*
"""
import sys

try:
    from hdk.bench import gdn
except ImportError as error:
    sys.exit(f"gdn_vs_peers: the hdk package is not importable ({error}); build python/ first "
             "(scripts/run-python-tests.sh or scripts/device/python_gpu.sh)")

if __name__ == "__main__":
    sys.exit(gdn.main(sys.argv[1:]))
