# Session 8: the spread of the one-kernel launch floor within one process (five medians in a row).
import sys
import torch
from hdk.bench.timing import CudaTimer
timer = CudaTimer("cuda")
timer.copy_bandwidth()
scratch = torch.zeros(1, dtype=torch.uint8, device=timer.device)
scratch.fill_(0)
graph = timer.capture(lambda: scratch.fill_(0))
print("medians (us):", " ".join(f"{timer.time_graph(graph, 200):.2f}" for _ in range(5)),
      "| launch_floor_us:", f"{timer.launch_floor_us(200):.2f}")
