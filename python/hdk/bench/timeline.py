"""Where a call's time goes inside its CUDA graph: each kernel's start and end in replays timed
as the benchmarks time them (an L2 flush before each replay), from the CUDA profiler's kernel
records (CUPTI, through torch.profiler). A graph replay's one number hides whether a call's time
is its first kernel, its second, or the gap between them; these records are GPU timestamps, so
they show, for example, a split kernel's end and the combine kernel that finishes after it.

`graph_timeline(timer, graph, replays)` replays a captured graph under the profiler and returns
`replay_timeline(...)` of the records: per kernel of the replay (in start order), the median
start and end in microseconds after the flush kernel's end."""

import statistics


def replay_timeline(kernels, is_flush, replays=None):
    """The median timeline of the replays in `kernels`: [(position, name, start_us, end_us)] in
    start order, then ("end", last end). `kernels` holds (name, start_us, end_us) in any order;
    a kernel for which `is_flush(name, duration_us)` is true begins a replay, and the kernels
    after it, up to the next flush, are that replay's, timed from the flush's end. Kernels
    before the first flush are left out. Raises ValueError when the replays do not all hold the
    same kernels in the same order (or when `replays` is given and their number differs)."""
    ordered = sorted(kernels, key=lambda kernel: kernel[1])
    groups = []
    flush_end = None
    for name, start, end in ordered:
        if is_flush(name, end - start):
            groups.append([])
            flush_end = end
        elif groups:
            groups[-1].append((name, start - flush_end, end - flush_end))
    if not groups or any(not group for group in groups):
        raise ValueError("replay_timeline: a flush without kernels after it, or no flush")
    if replays is not None and len(groups) != replays:
        raise ValueError(f"replay_timeline: {len(groups)} replays found, {replays} expected")
    names = [name for name, _, _ in groups[0]]
    for group in groups[1:]:
        if [name for name, _, _ in group] != names:
            raise ValueError("replay_timeline: the replays ran different kernels")
    timeline = []
    for position, name in enumerate(names):
        starts = [group[position][1] for group in groups]
        ends = [group[position][2] for group in groups]
        timeline.append((position, name, statistics.median(starts), statistics.median(ends)))
    last = statistics.median(max(end for _, _, end in group) for group in groups)
    return timeline + [("end", "", 0.0, last)]


def is_flush_kernel(name, duration_us, shortest_us=10.0):
    """CudaTimer's flush: a fill of twice the L2 (tens of microseconds), told from a call's own
    small fills by its length."""
    return "fill" in name.lower() and duration_us >= shortest_us


def graph_timeline(timer, graph, replays=20):
    """Replays `graph` (a hdk.bench.timing.CudaTimer capture) `replays` times, each after the
    timer's L2 flush, under the CUDA profiler; returns replay_timeline of its kernel records."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # clocks up, code in the instruction caches, as before a timed loop
        timer.flush()
        graph.replay()
    torch.cuda.synchronize(timer.device)
    with profile(activities=[ProfilerActivity.CUDA]) as profiler:
        for _ in range(replays):
            torch.cuda.synchronize(timer.device)
            timer.flush()
            graph.replay()
        torch.cuda.synchronize(timer.device)
    kernels = [
        (event.name, event.time_range.start, event.time_range.end)
        for event in profiler.events()
        if event.device_type == torch.autograd.DeviceType.CUDA
    ]
    return replay_timeline(kernels, is_flush_kernel, replays)


def format_timeline(timeline, width=72):
    """Lines of a timeline: position, kernel name (cut to `width`), start, end and duration."""
    lines = []
    for position, name, start, end in timeline:
        label = "end of the last kernel" if position == "end" else name[:width]
        lines.append(
            f"  {str(position):>3s} {label:<{width}s} {start:8.2f} -> {end:8.2f} us "
            f"({end - start:7.2f})"
        )
    return lines
