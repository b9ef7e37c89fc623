# Diagnostic: the Python one-kernel floor of bench/dsv4_vs_torch.py under different process
# histories (before/after the copy-bandwidth measurement, after a long run of other graphs).
import importlib.util, statistics, sys, time, torch
spec = importlib.util.spec_from_file_location("timing", "python/hdk/bench/timing.py")
timing = importlib.util.module_from_spec(spec); spec.loader.exec_module(timing)
timer = timing.CudaTimer("cuda")
scratch = torch.zeros(1, dtype=torch.uint8, device="cuda")
def capture(call):
    for _ in range(2): call()
    return timer.capture(call)
g = capture(lambda: scratch.fill_(0))
def floor(tag):
    vals = [timer.time_graph(g, 200, flush=True) for _ in range(3)]
    print(f"{tag:50s} floor {', '.join(f'{v:.2f}' for v in vals)} us", flush=True)
floor("fresh process")
bw = timer.copy_bandwidth() / 1e9
print(f"copy bandwidth {bw:.1f} GB/s")
floor("after copy_bandwidth()")
time.sleep(2)
floor("after 2 s idle")
hidden = torch.randn(64, 7168, device="cuda").bfloat16(); gate = torch.randn(384, 7168, device="cuda").bfloat16()
chain = capture(lambda: torch.nn.functional.linear(hidden, gate).float().softmax(-1).topk(6, -1))
for _ in range(3): print(f"chain graph {timer.time_graph(chain, 200):.2f} us")
floor("after chain graphs")
print("nvidia-smi clocks:"); import subprocess
print(subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu", "--format=csv"], capture_output=True, text=True).stdout)
