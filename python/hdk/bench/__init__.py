"""Benchmarks: python -m hdk.bench gdn --help."""
