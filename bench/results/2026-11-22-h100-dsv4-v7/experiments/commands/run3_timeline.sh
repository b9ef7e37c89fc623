#!/usr/bin/env bash
# Session 7, call 3: per-CTA globaltimer stamps of the committed kernels (timeline_stamps.patch on 4826a06, libhdk.a + timeline_driver.cu), and what torch adds to a graph replay
cd tmp_device && (for m in 1 2; do ./timeline_driver 384 7168 64 $m; ./timeline_driver 256 4096 64 $m; done; ./timeline_driver 384 7168 32 1; ./timeline_driver 384 7168 17 1; HDK_NO_PDL=1 ./timeline_driver 384 7168 64 1) 2>&1 | tee $OUT/timeline.log; python3 replay_probe.py 2>&1 | tee $OUT/replay_probe.log
