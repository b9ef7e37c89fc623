"""Device timing: CUDA-graph replays with a cold L2, and the copy bandwidth of the same run."""

import ctypes
import statistics
import time

import torch


# Busy replays before each timed loop. After seconds of host-only work (building and checking
# the previous point's inputs) the GPU's clocks are down, and 3 replays did not bring them up:
# on an H100 the first implementation timed at a point (hdk) read 18.5 us where it takes 7.5,
# and 70.5 us where it takes 9-10, in 4 of 152 cells of one run (2026-11-23); a second run
# with the same binaries had other such cells.
WARMUP_MS = 20.0


def median_us(samples):
    return statistics.median(samples)


class CudaTimer:
    """Times one captured call per replay, writing 2x the L2 size between replays so every
    replay starts with the call's data out of L2 (a decode step never finds its state there).

    `code_flush_library`: the path of libhdk_bench_code_flush.so (built with hdk-bench from
    bench/code_flush.cu); each flush then also runs its 192 KB of other code on every SM, so a
    call fetches its own instructions from memory, as a kernel inside a decode step does (the L2
    flush leaves the SMs' instruction caches holding the previous replay's code)."""

    def __init__(self, device, code_flush_library=None):
        self.device = torch.device(device)
        properties = torch.cuda.get_device_properties(self.device)
        self.l2_bytes = int(getattr(properties, "L2_cache_size", 0) or 50 * 2**20)
        self.name = properties.name
        self._flush = torch.empty(2 * self.l2_bytes, dtype=torch.uint8, device=self.device)
        self._code_flush = None
        if code_flush_library:
            launch = ctypes.CDLL(code_flush_library).hdk_bench_code_flush
            launch.argtypes = [ctypes.c_void_p]
            launch.restype = ctypes.c_int
            self._code_flush = launch

    @property
    def flushes_code(self):
        return self._code_flush is not None

    def flush(self):
        """Writes twice the L2 size, so that what a call reads next starts in DRAM (and, with a
        code flush library, evicts the SMs' instruction caches)."""
        self._flush.zero_()
        if self._code_flush is not None:
            with torch.cuda.device(self.device):
                error = self._code_flush(torch.cuda.current_stream(self.device).cuda_stream)
            if error != 0:
                raise RuntimeError(f"hdk_bench_code_flush: CUDA error {error}")

    def capture(self, call):
        """A CUDA graph of `call` (which must already have run once: Triton compiles on the
        first call, and compiling is not capturable)."""
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
        torch.cuda.synchronize(self.device)
        return graph

    def time_graph(self, graph, iters, warmup=3, flush=True, warmup_ms=WARMUP_MS):
        """Median microseconds of `iters` replays, each after an L2 flush. flush=False times hot
        replays; it also lets the GPU catch up with the host, so a replay shorter than its
        submission then measures the host's launch cost too (use flush=True for launch floors).
        Before timing, replays (and flushes) keep the GPU busy for at least `warmup_ms`."""
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
        begin = time.perf_counter()
        done = 0
        while done < warmup or (time.perf_counter() - begin) * 1e3 < warmup_ms:
            if flush:
                self.flush()
            graph.replay()
            done += 1
            if done % 8 == 0:
                torch.cuda.synchronize(self.device)  # wall time must follow the GPU's
        for start, end in zip(starts, ends):
            if flush:
                # The host waits for the previous replay, then queues the flush (tens of us of GPU
                # work) and the timed replay behind it, so the replay is queued before the GPU
                # reaches it. Queued without the wait, the host sometimes fell behind the GPU and
                # the GPU's wait for it landed inside the timed window: a one-kernel graph read
                # 3.42 us or 4.16-4.64 us from one call to the next (H100, 2026-11-22-h100-dsv4-v7).
                torch.cuda.synchronize(self.device)
                self.flush()
            start.record()
            graph.replay()
            end.record()
        torch.cuda.synchronize(self.device)
        return median_us([start.elapsed_time(end) * 1e3 for start, end in zip(starts, ends)])

    def launch_floor_us(self, iters, attempts=3):
        """The launch latency of every floor: the replay time of a graph of one tiny kernel (a
        1-element fill), timed like the calls (after an L2 flush). The smallest of `attempts`
        medians, as `hdk-bench` takes it: a single median read 3.33, 3.90 and 4.00 us in three
        runs of one script on one H100 (git show 0712de7:bench/results/2026-11-22-h100-dsv4-v8), and the floor
        divides every x_floor."""
        scratch = torch.zeros(1, dtype=torch.uint8, device=self.device)
        scratch.fill_(0)
        graph = self.capture(lambda: scratch.fill_(0))
        return min(self.time_graph(graph, iters) for _ in range(attempts))

    def estimate_us(self, graph):
        """One replay's time, to size the timed loop."""
        return self.time_graph(graph, iters=1, warmup=1, warmup_ms=0.0)

    def copy_bandwidth(self, nbytes=2**30, iters=10):
        """Bytes read + written per second by a large device-to-device copy."""
        source = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        target = torch.empty_like(source)
        target.copy_(source)
        samples = []
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) * 1e-3)
        del source, target
        return 2 * nbytes / statistics.median(samples)


class HostTimer:
    """The CPU counterpart (no graphs, no L2 flush): for smoke runs of the benchmark itself."""

    name = "cpu"
    l2_bytes = 0

    def capture(self, call):
        return call

    def time_graph(self, call, iters, warmup=1):
        for _ in range(warmup):
            call()
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            call()
            samples.append((time.perf_counter() - start) * 1e6)
        return median_us(samples)

    def estimate_us(self, call):
        return self.time_graph(call, iters=1, warmup=0)

    def copy_bandwidth(self, nbytes=2**28, iters=5):
        source = torch.empty(nbytes, dtype=torch.uint8)
        target = torch.empty_like(source)
        samples = []
        for _ in range(iters):
            start = time.perf_counter()
            target.copy_(source)
            samples.append(time.perf_counter() - start)
        return 2 * nbytes / statistics.median(samples)
