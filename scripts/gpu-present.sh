#!/usr/bin/env bash
# Exits 0 when this machine has an NVIDIA GPU (`nvidia-smi -L` lists one, or /dev/nvidia0
# exists), 1 otherwise. Whether nvcc is installed does not matter: it says nothing about a GPU.
if [[ -e /dev/nvidia0 ]]; then exit 0; fi
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  exit 0
fi
exit 1
