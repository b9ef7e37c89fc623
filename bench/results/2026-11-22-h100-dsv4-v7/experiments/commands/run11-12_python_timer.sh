#!/usr/bin/env bash
# Session 7, calls 11-12: the Python timer: the one-kernel floor under different process histories, then the queued replay loop against wait-then-queue
python3 tmp_device/floor_probe.py | tee $OUT/floor_probe.log
python3 tmp_device/floor_probe2.py | tee $OUT/floor_probe2.log
