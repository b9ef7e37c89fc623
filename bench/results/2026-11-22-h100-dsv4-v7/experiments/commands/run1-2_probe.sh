#!/usr/bin/env bash
# Session 7, calls 1-2: kernel-boundary, shared-memory, cold-code and L2-state costs (nvcc -O3 -arch sm_90a latency_probe.cu)
nvidia-smi --query-gpu=name,clocks.max.sm --format=csv; ./tmp_device/latency_probe 2>&1 | tee $OUT/probe.log
