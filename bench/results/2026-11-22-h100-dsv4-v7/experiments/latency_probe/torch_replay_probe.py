# Diagnostic: what torch's CUDAGraph.replay() adds on the GPU around cudaGraphLaunch. Not committed.
import ctypes, statistics, torch
dev = torch.device("cuda")
props = torch.cuda.get_device_properties(dev)
flush = torch.empty(2 * props.L2_cache_size, dtype=torch.uint8, device=dev)
x = torch.zeros(1, device=dev)
s = torch.cuda.Stream()
torch.cuda.synchronize()
with torch.cuda.stream(s):
    x.fill_(1)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    x.fill_(0)
torch.cuda.synchronize()
print("CUDAGraph methods:", [m for m in dir(g) if not m.startswith("_")])
def time_replays(launch, n=200):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for a, b in zip(starts, ends):
        flush.zero_()
        a.record(); launch(); b.record()
    torch.cuda.synchronize()
    return statistics.median([a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends)])
print("graph.replay(), 1-element fill: %.2f us" % time_replays(g.replay))
lib = None
for line in open("/proc/self/maps"):
    if "libcudart" in line:
        lib = line.split()[-1]; break
print("cudart:", lib)
exec_handle = None
for name in ("raw_cuda_graph_exec",):
    if hasattr(g, name):
        try:
            exec_handle = getattr(g, name)()
        except Exception as e:
            print(name, "failed:", e)
if lib and exec_handle is not None:
    cudart = ctypes.CDLL(lib)
    stream = torch.cuda.current_stream().cuda_stream
    def raw():
        rc = cudart.cudaGraphLaunch(ctypes.c_void_p(exec_handle), ctypes.c_void_p(stream))
        assert rc == 0, rc
    print("cudaGraphLaunch on raw exec: %.2f us" % time_replays(raw))
    print("graph.replay() again: %.2f us" % time_replays(g.replay))
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=15))
