# Diagnostic: the Python timer's replay loop, queued (as until 2026-11-22 v6) against waiting for
# each replay before queuing the flush and the next one (timing.py now), same process, alternating.
import importlib.util, statistics, torch
spec = importlib.util.spec_from_file_location("timing", "python/hdk/bench/timing.py")
timing = importlib.util.module_from_spec(spec); spec.loader.exec_module(timing)
timer = timing.CudaTimer("cuda")
def queued(graph, iters=200, warmup=3):
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for _ in range(warmup):
        timer._flush.zero_(); graph.replay()
    for a, b in zip(starts, ends):
        timer._flush.zero_(); a.record(); graph.replay(); b.record()
    torch.cuda.synchronize()
    return statistics.median([a.elapsed_time(b) * 1e3 for a, b in zip(starts, ends)])
def capture(call):
    for _ in range(2): call()
    return timer.capture(call)
scratch = torch.zeros(1, dtype=torch.uint8, device="cuda")
hidden = torch.randn(64, 7168, device="cuda").bfloat16(); gate = torch.randn(384, 7168, device="cuda").bfloat16()
bias = torch.rand(384, device="cuda")
def chain_call():
    logits = torch.nn.functional.linear(hidden, gate).float()
    s = torch.nn.functional.softplus(logits).sqrt()
    ids = (s + bias).topk(6, dim=-1).indices
    w = s.gather(1, ids)
    return ids, w / w.sum(-1, keepdim=True) * 2.5
graphs = {"one-kernel graph": capture(lambda: scratch.fill_(0)), "Pro N=64 torch chain": capture(chain_call)}
timer.copy_bandwidth()
for name, g in graphs.items():
    for r in range(4):
        print(f"{name:22s} queued {queued(g):7.2f} us   wait-then-queue {timer.time_graph(g, 200):7.2f} us", flush=True)
