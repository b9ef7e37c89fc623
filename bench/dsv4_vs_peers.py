#!/usr/bin/env python3
"""hdk's DeepSeek-V4 read side against the kernels engines run on Hopper, side by side in one
process on one GPU, over the same bytes:

* sparse: ``hdk.dsv4.sparse_decode`` against FlashMLA's ``flash_mla_with_kvcache`` as vLLM's
  DeepSeek-V4 backend calls it (python/hdk/bench/dsv4_peers.py says how): the SWA window (128
  entries of the query's own ring page, block size 128) and a compressed list over the
  compressed pool (block size 64, each query's own shuffled pages), one MODEL1 page tensor each,
  shared by both implementations; a sink; bf16 q; scale 512^-0.5. Lists: ``csa`` (the top-k:
  512 Flash, 1024 Pro, picked at random from 4x as many), ``hca65536`` and ``hca262144`` (every
  compressed entry of a context of that many tokens: 512 and 2048). Presets ``flash`` (64
  heads) and ``pro`` (128). FlashMLA is timed twice: with its scheduler plan made in the call
  (``flashmla_us``: the first layer of a type in a vLLM step, which runs the planner kernel in
  its CUDA graph) and with the plan reused (``flashmla_reused_plan_us``: every later layer of
  that type in the step). Checked per cell: ``max |out_hdk - out_flashmla|`` and ``max |lse_hdk
  - logaddexp(lse_flashmla, sink)|`` (FlashMLA leaves the sink out of its lse).
* index: ``hdk.dsv4.index_topk`` with FP8 keys (DeepGEMM's Hopper page, ``format="fp8"``) and
  the E4M3 query against DeepGEMM's ``fp8_paged_mqa_logits`` followed by a top-k over its logits
  (``torch.topk`` and ``hdk.topk`` both timed, the faster one taken: ``peer_topk`` says which;
  engines run their own top-k kernels), block size 64, 64 heads, every row ``entries`` keys of
  its own pages. A third column: hdk with MXFP4 keys and the quantized MXFP4 query
  (``quantize_indexer_query``), the same random keys. DeepGEMM's scheduler metadata
  (``get_paged_mqa_logits_metadata``) runs once per step in vLLM, outside the layers: it is
  made before timing and its own time is a column (``peer_metadata_us``). Checked per cell:
  hdk's FP8 scores against DeepGEMM's logits at the entries hdk selected (max abs and relative
  difference) and the share of hdk's top-k that DeepGEMM's top-k holds (``overlap``; the MXFP4
  column's overlap with DeepGEMM's FP8 selection is reported, not checked). ``--index-peer
  none`` times hdk's two columns alone (with their floors and bytes; ``peer`` is ``none`` in
  each record and nothing is checked against a peer), for a machine where DeepGEMM does not run.

Every call is captured in its own CUDA graph and replayed (hdk.bench.timing.CudaTimer): before
each timed replay a buffer of twice the L2 size is written, so every byte starts in DRAM.
Medians of ``--iters`` replays. Also recorded: the device, the copy bandwidth measured now, the
launch floor (the replay of a one-kernel graph), and per cell ``floor_us`` = launch + bytes /
copy bandwidth (sparse: N x (128 + L) x 584 bytes; index: N x entries x 132, MXFP4 68).
A difference beyond the tolerances prints MISMATCH, a cell that raises (hdk's or a peer's error)
ERROR, and the run goes on; the exit status is then 1 (after the JSON).

Needs a GPU, hdk built with CUDA, and the peers built by ``bash scripts/peers/dsv4.sh build``
(found through PYTHONPATH or $HDK_DSV4_PEERS_DIR, default /tmp/hdk_dsv4_peers).

Usage: python3 bench/dsv4_vs_peers.py --json out.json [--ops sparse,index] [--N 1,8,64]
           [--presets flash,pro] [--lists csa,hca65536,hca262144] [--entries 2048,16384,65536]
           [--top-k 512,1024] [--index-peer deepgemm|none] [--iters 100] [--timeline]

--timeline adds, per cell, where each call's time goes inside its graph: every kernel's start
and end from the CUDA profiler's records of 20 replays, each after the L2 flush, times from the
flush's end (hdk.bench.timeline), e.g. a split kernel's end and the combine that follows it.
"""

import argparse
import json
import sys
import time

import torch

try:
    import hdk
    import hdk.dsv4
    from hdk.bench import dsv4_attention_torch, dsv4_peers
    from hdk.bench.timeline import format_timeline, graph_timeline
    from hdk.bench.timing import CudaTimer

    IMPORT_ERROR = None
except ImportError as error:  # pragma: no cover; reported after --help had its chance
    IMPORT_ERROR = error

PRESETS = {"flash": (64, 512), "pro": (128, 1024)}  # query heads, CSA top-k
LISTS = {"csa": None, "hca65536": 65536 // 128, "hca262144": 262144 // 128}
WINDOW = 128  # SWA window = ring page size
BLOCK_SIZE = 64  # compressed pool and indexer key pages
CSA_SPREAD = 4  # a CSA list picks its entries from 4x as many
INDEX_HEADS = 64
DEFAULT_N = "1,2,4,8,16,32,64,128"
# Tolerances of the checks (a MISMATCH beyond them): hdk and FlashMLA both decode the same FP8
# entries exactly and round the softmax weights to bf16 for P.V (hdk's tensor-core kernel and
# FlashMLA's RS wgmma), so out differs by a few bf16 roundings of values of order 1.
OUT_TOLERANCE = 2e-2
LSE_TOLERANCE = 2e-3
SCORE_RELATIVE_TOLERANCE = 1e-3  # FP8 scores: exact products, fp32 sums in another order
MIN_OVERLAP = 0.98


def mib(nbytes):
    return nbytes / 2**20


def capture(timer, call, warmup=2):
    """A CUDA graph of `call` after warm-up calls (JIT compiles, lazy allocations)."""
    for _ in range(warmup):
        call()
    return timer.capture(call)


def time_call(timer, call, iters):
    graph = capture(timer, call)
    result = timer.time_graph(graph, iters)
    del graph
    return result


def with_timelines(args, timer, record, line, calls):
    """(record, line) of a cell; with --timeline, the record also holds `timelines`: {name:
    [[position, kernel, start_us, end_us], ...]} of each named call's kernels inside its own
    graph (hdk.bench.timeline), and the line their printed form."""
    if not args.timeline:
        return record, line
    found, lines = {}, [line]
    for name, call in calls:
        graph = capture(timer, call)
        timeline = graph_timeline(timer, graph)
        del graph
        found[name] = [
            [position, kernel, round(start, 3), round(end, 3)]
            for position, kernel, start, end in timeline
        ]
        lines += [f"  {name}:"] + format_timeline(timeline)
    return {**record, "timelines": found}, "\n".join(lines)


def synchronize(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def workspace(nbytes, device):
    """hdk's workspace for a cell, allocated once outside the graphs (None where none is used)."""
    return torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes > 0 else None


class SparseCell:
    """One sparse_decode point: N queries, each over its own ring page (the window, in position
    order from a random start) and its own compressed entries (CSA: `length` distinct ones out
    of CSA_SPREAD x as many, in random order; HCA: all `length` in order)."""

    def __init__(self, flash_mla, heads, length, csa, rows, device):
        pool = length * (CSA_SPREAD if csa else 1)
        pages = -(-pool // BLOCK_SIZE)
        self.cache = dsv4_attention_torch.valid_model1_pages(rows * pages, BLOCK_SIZE, device)
        self.ring = dsv4_attention_torch.valid_model1_pages(rows, WINDOW, device)
        table = torch.randperm(rows * pages, device=device).view(rows, pages)
        if csa:
            ordinals = torch.rand(rows, pool, device=device).argsort(dim=1)[:, :length]
        else:
            ordinals = torch.arange(length, device=device).expand(rows, length)
        pages_of = table.gather(1, ordinals // BLOCK_SIZE)
        self.slots = (pages_of * BLOCK_SIZE + ordinals % BLOCK_SIZE).int()
        ring_pages = torch.randperm(rows, device=device)[:, None]
        start = torch.randint(0, WINDOW, (rows, 1), device=device)
        self.ring_slots = (
            ring_pages * WINDOW + (start + torch.arange(WINDOW, device=device)) % WINDOW
        ).int()
        self.q = torch.randn(rows, heads, 512, device=device).to(torch.bfloat16)
        self.sink = torch.randn(heads, device=device) * 2
        self.scale = 512**-0.5
        self.out = torch.empty(rows, heads, 512, dtype=torch.bfloat16, device=device)
        self.lse = torch.empty(rows, heads, dtype=torch.float32, device=device)
        self.workspace = workspace(
            hdk.dsv4.sparse_decode_workspace_bytes(rows, heads, length + WINDOW, device), device
        )
        self.peer = dsv4_peers.FlashMLASparseDecode(
            flash_mla,
            self.q,
            self.ring,
            self.ring_slots,
            self.cache,
            BLOCK_SIZE,
            self.slots,
            self.sink,
            self.scale,
        )
        self.nbytes = rows * (length + WINDOW) * 584

    def hdk_call(self):
        # The compressed list as `cache`, the window as the extra list over the ring tensor (as
        # hdk.dsv4.KVCacheManager keeps them; docs/dsv4-attention.md); FlashMLA's vLLM form has
        # them the other way round, which changes nothing but the order of the sums.
        hdk.dsv4.sparse_decode(
            self.q,
            self.cache,
            BLOCK_SIZE,
            self.slots,
            extra_cache=self.ring,
            extra_block_size=WINDOW,
            extra_indices=self.ring_slots,
            sink=self.sink,
            scale=self.scale,
            out=self.out,
            lse=self.lse,
            workspace=self.workspace,
        )

    def check(self):
        self.hdk_call()
        out, lse = self.peer.call(fresh_plan=True)
        synchronize(self.q.device)
        out_diff = float((out.squeeze(1).float() - self.out.float()).abs().max())
        lse_peer = dsv4_peers.lse_with_sink(lse, self.sink)
        lse_diff = float((lse_peer - self.lse).abs().max())
        return out_diff, lse_diff, float(self.out.float().abs().max())


def call_index_topk(q, *args, **kwargs):
    """hdk.dsv4.index_topk with an E4M3 query: as float8_e4m3fn, else as its uint8 bytes (the
    form the binding takes is remembered)."""
    form = call_index_topk.form
    if form is None:
        try:
            result = hdk.dsv4.index_topk(q, *args, **kwargs)
            call_index_topk.form = "float8"
            return result
        except (TypeError, ValueError, RuntimeError):
            call_index_topk.form = "uint8"
    if call_index_topk.form == "uint8" and q.dtype != torch.uint8:
        q = q.view(torch.uint8)
    return hdk.dsv4.index_topk(q, *args, **kwargs)


call_index_topk.form = None


class IndexCell:
    """One index point: N rows of `entries` keys each, on their own shuffled pages of 64; the
    same random bf16 keys stored as FP8 pages (hdk and DeepGEMM) and MXFP4 pages (hdk).
    deep_gemm None: hdk's columns only (no peer)."""

    def __init__(self, deep_gemm, rows, entries, top_k, device):
        pages = -(-entries // BLOCK_SIZE)
        blocks = rows * pages
        self.fp8_cache = torch.zeros(blocks, BLOCK_SIZE * 132, dtype=torch.uint8, device=device)
        self.mxfp4_cache = torch.zeros(blocks, BLOCK_SIZE * 68, dtype=torch.uint8, device=device)
        chunk = 1 << 20  # keys stored a chunk at a time (bf16 keys of 128 x 65536 rows: 2 GiB)
        for first in range(0, blocks * BLOCK_SIZE, chunk):
            count = min(chunk, blocks * BLOCK_SIZE - first)
            keys = torch.randn(count, 128, device=device).to(torch.bfloat16)
            slots = torch.arange(first, first + count, device=device, dtype=torch.int64)
            hdk.dsv4.store_indexer_keys(
                keys, slots, self.fp8_cache, BLOCK_SIZE, format="fp8", rotate=False
            )
            hdk.dsv4.store_indexer_keys(
                keys, slots, self.mxfp4_cache, BLOCK_SIZE, format="mxfp4", rotate=False
            )
        self.table = torch.randperm(blocks, device=device).view(rows, pages).int()
        self.num_entries = torch.full((rows,), entries, dtype=torch.int32, device=device)
        q = torch.randn(rows, INDEX_HEADS, 128, device=device).to(torch.bfloat16)
        weights = torch.randn(rows, INDEX_HEADS, device=device)
        # The same query both ways: E4M3 with its scale in the weights (vLLM's form for
        # DeepGEMM), and hdk's MXFP4 form (DeepSeek-V4's reference indexer quantizes q like k).
        self.q_e4m3, self.weights_e4m3 = dsv4_peers.quantize_q_e4m3(q, weights)
        self.q_mxfp4, self.q_scales = hdk.dsv4.quantize_indexer_query(q, rotate=False)
        self.weights_mxfp4 = weights * 128**-0.5 * INDEX_HEADS**-0.5
        self.top_k, self.entries, self.rows = top_k, entries, rows
        self.indices = torch.empty(rows, top_k, dtype=torch.int32, device=device)
        self.mxfp4_indices = torch.empty(rows, top_k, dtype=torch.int32, device=device)
        self.workspace = workspace(
            hdk.dsv4.index_topk_workspace_bytes(rows, pages * BLOCK_SIZE, device), device
        )
        self.peer = None
        if deep_gemm is not None:
            self.peer = dsv4_peers.DeepGEMMIndexer(
                deep_gemm,
                self.q_e4m3,
                self.weights_e4m3,
                self.fp8_cache,
                BLOCK_SIZE,
                self.table,
                entries,
            )
        self.peer_out = {}
        self.lengths = self.num_entries

    def args(self):
        return (self.fp8_cache, BLOCK_SIZE, self.table, self.num_entries, self.top_k)

    def hdk_fp8(self, scores=None):
        call_index_topk(
            self.q_e4m3,
            self.weights_e4m3,
            *self.args(),
            format="fp8",
            topk_indices=self.indices,
            topk_scores=scores,
            return_scores=scores is not None,
            workspace=self.workspace,
        )

    def hdk_mxfp4(self):
        hdk.dsv4.index_topk(
            self.q_mxfp4,
            self.weights_mxfp4,
            self.mxfp4_cache,
            BLOCK_SIZE,
            self.table,
            self.num_entries,
            self.top_k,
            format="mxfp4",
            q_scales=self.q_scales,
            topk_indices=self.mxfp4_indices,
            return_scores=False,
            workspace=self.workspace,
        )

    def peer_logits(self):
        self.peer_out["logits"] = self.peer.logits()

    def peer_torch_topk(self):
        logits = self.peer.logits()
        self.peer_out["logits"] = logits
        self.peer_out["indices"] = torch.topk(logits, self.top_k, dim=-1).indices

    def peer_hdk_topk(self):
        logits = self.peer.logits()
        self.peer_out["logits"] = logits
        self.peer_out["indices"] = hdk.topk(logits, self.top_k, self.lengths)[1]

    def peer_metadata(self):
        self.peer_out["meta"] = self.peer.schedule()

    def check(self):
        """(max abs and relative score difference at hdk's selection, overlap of hdk's FP8
        top-k with DeepGEMM's, overlap of hdk's MXFP4 top-k with DeepGEMM's)."""
        scores = torch.empty(self.rows, self.top_k, dtype=torch.float32, device=self.table.device)
        self.hdk_fp8(scores)
        self.hdk_mxfp4()
        self.peer_torch_topk()
        synchronize(self.table.device)
        logits = self.peer_out["logits"]
        at_hdk = logits.gather(1, self.indices.long())
        diff = (at_hdk - scores).abs()
        scale = scores.abs().amax(dim=1, keepdim=True).clamp_min(1e-30)
        chosen = torch.zeros(logits.shape, dtype=torch.bool, device=logits.device)
        chosen.scatter_(1, self.peer_out["indices"].long(), True)
        overlap = float(chosen.gather(1, self.indices.long()).float().mean())
        overlap_mxfp4 = float(chosen.gather(1, self.mxfp4_indices.long()).float().mean())
        return float(diff.max()), float((diff / scale).max()), overlap, overlap_mxfp4


def parse_list(text, kind=int):
    return [kind(item) for item in text.split(",") if item]


def sparse_point(args, timer, flash_mla, copy_gbs, launch_us, preset, list_name, rows):
    """One sparse cell: (record, progress line)."""
    heads, top_k = PRESETS[preset]
    length = top_k if LISTS[list_name] is None else LISTS[list_name]
    cell = SparseCell(flash_mla, heads, length, LISTS[list_name] is None, rows, timer.device)
    out_diff, lse_diff, out_max = cell.check()
    hdk_us = time_call(timer, cell.hdk_call, args.iters)
    peer_us = time_call(timer, lambda: cell.peer.call(fresh_plan=True), args.iters)
    cell.peer.call(fresh_plan=False)  # makes the plan the reused calls take
    reused_us = time_call(timer, lambda: cell.peer.call(fresh_plan=False), args.iters)
    floor_us = launch_us + cell.nbytes / (copy_gbs * 1e3)
    ok = out_diff <= OUT_TOLERANCE and lse_diff <= LSE_TOLERANCE
    record = {
        "hdk_us": round(hdk_us, 3),
        "flashmla_us": round(peer_us, 3),
        "flashmla_reused_plan_us": round(reused_us, 3),
        "peer_over_hdk": round(peer_us / hdk_us, 3),
        "peer_reused_plan_over_hdk": round(reused_us / hdk_us, 3),
        "floor_us": round(floor_us, 3),
        "hdk_x_floor": round(hdk_us / floor_us, 3),
        "bytes": cell.nbytes,
        "out_max_abs_diff": out_diff,
        "out_max_abs": out_max,
        "lse_max_abs_diff": lse_diff,
        "check": "ok" if ok else "MISMATCH",
    }
    line = (
        f"hdk {hdk_us:8.2f} us  FlashMLA {peer_us:8.2f} (plan reused {reused_us:8.2f}) us  "
        f"peer/hdk {peer_us / hdk_us:5.2f} ({reused_us / hdk_us:5.2f})  floor {floor_us:7.2f} us  "
        f"|dout| {out_diff:.2e} |dlse| {lse_diff:.2e}"
    )
    reused = ("flashmla_reused_plan", lambda: cell.peer.call(fresh_plan=False))
    return with_timelines(args, timer, record, line, [("hdk", cell.hdk_call), reused])


def hdk_index_columns(args, timer, cell, copy_gbs, launch_us):
    """hdk's FP8 and MXFP4 columns of an index cell: (fp8_us, mxfp4_us, floor_fp8, floor_mxfp4,
    the record's fields for them)."""
    fp8_us = time_call(timer, cell.hdk_fp8, args.iters)
    mxfp4_us = time_call(timer, cell.hdk_mxfp4, args.iters)
    fp8_bytes, mxfp4_bytes = cell.rows * cell.entries * 132, cell.rows * cell.entries * 68
    floor_fp8 = launch_us + fp8_bytes / (copy_gbs * 1e3)
    floor_mxfp4 = launch_us + mxfp4_bytes / (copy_gbs * 1e3)
    fields = {
        "hdk_fp8_us": round(fp8_us, 3),
        "hdk_mxfp4_us": round(mxfp4_us, 3),
        "floor_fp8_us": round(floor_fp8, 3),
        "floor_mxfp4_us": round(floor_mxfp4, 3),
        "hdk_fp8_x_floor": round(fp8_us / floor_fp8, 3),
        "hdk_mxfp4_x_floor": round(mxfp4_us / floor_mxfp4, 3),
        "bytes_fp8": fp8_bytes,
        "bytes_mxfp4": mxfp4_bytes,
    }
    return fp8_us, mxfp4_us, floor_fp8, floor_mxfp4, fields


def index_point(args, timer, deep_gemm, copy_gbs, launch_us, top_k, entries, rows):
    """One index cell, against DeepGEMM's logits + a top-k or, without a peer (--index-peer none),
    hdk's two columns alone: (record, progress line)."""
    cell = IndexCell(deep_gemm, rows, entries, top_k, timer.device)
    if deep_gemm is None:
        fp8_us, mxfp4_us, floor_fp8, floor_mxfp4, fields = hdk_index_columns(
            args, timer, cell, copy_gbs, launch_us
        )
        line = (
            f"hdk fp8 {fp8_us:8.2f} us  mxfp4 {mxfp4_us:8.2f} us  (no peer)  floor {floor_fp8:.2f} "
            f"/ {floor_mxfp4:.2f} us  x floor {fp8_us / floor_fp8:.2f} / "
            f"{mxfp4_us / floor_mxfp4:.2f}"
        )
        record = {"peer": "none", **fields, "check": "ok"}
        return with_timelines(args, timer, record, line, [("hdk_fp8", cell.hdk_fp8)])
    score_diff, score_rel, overlap, overlap_mxfp4 = cell.check()
    fp8_us, mxfp4_us, floor_fp8, floor_mxfp4, fields = hdk_index_columns(
        args, timer, cell, copy_gbs, launch_us
    )
    logits_us = time_call(timer, cell.peer_logits, args.iters)
    torch_us = time_call(timer, cell.peer_torch_topk, args.iters)
    hdk_topk_us = time_call(timer, cell.peer_hdk_topk, args.iters)
    meta_us = time_call(timer, cell.peer_metadata, args.iters)
    peer_us, peer_topk = min((torch_us, "torch.topk"), (hdk_topk_us, "hdk.topk"))
    ok = score_rel <= SCORE_RELATIVE_TOLERANCE and overlap >= MIN_OVERLAP
    record = {
        "peer": "deepgemm",
        "peer_us": round(peer_us, 3),
        "peer_topk": peer_topk,
        "peer_logits_us": round(logits_us, 3),
        "peer_logits_torch_topk_us": round(torch_us, 3),
        "peer_logits_hdk_topk_us": round(hdk_topk_us, 3),
        "peer_metadata_us": round(meta_us, 3),
        "peer_over_hdk_fp8": round(peer_us / fp8_us, 3),
        "peer_over_hdk_mxfp4": round(peer_us / mxfp4_us, 3),
        **fields,
        "score_max_abs_diff": score_diff,
        "score_max_rel_diff": score_rel,
        "overlap": round(overlap, 5),
        "overlap_mxfp4_vs_peer": round(overlap_mxfp4, 5),
        "check": "ok" if ok else "MISMATCH",
    }
    line = (
        f"hdk fp8 {fp8_us:8.2f} us  mxfp4 {mxfp4_us:8.2f} us  DeepGEMM+{peer_topk} {peer_us:8.2f} "
        f"us (logits {logits_us:.2f}, metadata {meta_us:.2f})  peer/hdk {peer_us / fp8_us:5.2f} / "
        f"{peer_us / mxfp4_us:5.2f}  floor {floor_fp8:.2f} / {floor_mxfp4:.2f} us  score rel diff "
        f"{score_rel:.1e}  overlap {100 * overlap:.2f}% (mxfp4 {100 * overlap_mxfp4:.1f}%)"
    )
    calls = [("hdk_fp8", cell.hdk_fp8), ("deepgemm_hdk_topk", cell.peer_hdk_topk)]
    return with_timelines(args, timer, record, line, calls)


def run_point(results, key, label, point, *args):
    """Runs one cell; a cell that raises (hdk's or a peer's error) is recorded with check ERROR
    and the run goes on, so the JSON is written either way."""
    try:
        record, line = point(*args)
    except Exception as error:  # noqa: BLE001; reported per cell
        record = {"check": "ERROR", "error": f"{type(error).__name__}: {error}"[:2000]}
        line = f"ERROR {record['error'].splitlines()[0][:300]}"
    results.append({**key, **record})
    suffix = "" if record["check"] == "ok" else f"  {record['check']}"
    print(f"{label}: {line}{suffix}", flush=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def bench_sparse(args, timer, flash_mla, copy_gbs, launch_us, results):
    torch.manual_seed(21)
    for preset in parse_list(args.presets, str):
        heads, top_k = PRESETS[preset]
        for list_name in parse_list(args.lists, str):
            length = WINDOW + (top_k if LISTS[list_name] is None else LISTS[list_name])
            for rows in parse_list(args.N):
                key = {"op": "sparse_decode", "preset": preset, "list": list_name}
                key.update({"Hq": heads, "N": rows, "L": length})
                label = f"sparse {preset:5s} {list_name:9s} N={rows:3d} L={length:4d}"
                point = (args, timer, flash_mla, copy_gbs, launch_us, preset, list_name, rows)
                run_point(results, key, label, sparse_point, *point)


def bench_index(args, timer, deep_gemm, copy_gbs, launch_us, results):
    torch.manual_seed(22)
    for top_k in parse_list(args.top_k):
        for entries in parse_list(args.entries):
            for rows in parse_list(args.N):
                key = {"op": "index_topk", "N": rows, "entries": entries, "top_k": top_k}
                key["heads"] = INDEX_HEADS
                label = f"index k={top_k:4d} entries={entries:6d} N={rows:3d}"
                point = (args, timer, deep_gemm, copy_gbs, launch_us, top_k, entries, rows)
                run_point(results, key, label, index_point, *point)


def print_tables(results):
    """One readable table per comparison: rows = (preset, list) or (top_k, entries), columns N."""

    def table(title, records, key, columns):
        if not records:
            return
        ns = sorted({r["N"] for r in records})
        print(f"\n{title}")
        print("| case | " + " | ".join(f"N={n}" for n in ns) + " |")
        print("|---" * (len(ns) + 1) + "|")
        groups = {}
        for r in records:
            groups.setdefault(key(r), {})[r["N"]] = r
        for name, by_n in groups.items():
            for label, fmt in columns:
                cells = [fmt(by_n[n]) if n in by_n else "" for n in ns]
                print(f"| {name} {label} | " + " | ".join(cells) + " |")

    results = [r for r in results if r["check"] != "ERROR"]
    sparse = [r for r in results if r["op"] == "sparse_decode"]
    table(
        "sparse_decode (us; peer = FlashMLA as vLLM calls it, plan made in the call / reused)",
        sparse,
        lambda r: f"{r['preset']} {r['list']}",
        [
            ("hdk", lambda r: f"{r['hdk_us']:.1f}"),
            ("FlashMLA", lambda r: f"{r['flashmla_us']:.1f}"),
            ("FlashMLA reused plan", lambda r: f"{r['flashmla_reused_plan_us']:.1f}"),
            (
                "peer/hdk",
                lambda r: f"{r['peer_over_hdk']:.2f} ({r['peer_reused_plan_over_hdk']:.2f})",
            ),
            ("floor", lambda r: f"{r['floor_us']:.1f}"),
        ],
    )
    hdk_only = [r for r in results if r["op"] == "index_topk" and r.get("peer") == "none"]
    table(
        "index_topk (us; hdk alone, no peer: --index-peer none)",
        hdk_only,
        lambda r: f"k={r['top_k']} {r['entries']}",
        [
            ("hdk fp8", lambda r: f"{r['hdk_fp8_us']:.1f}"),
            ("hdk mxfp4", lambda r: f"{r['hdk_mxfp4_us']:.1f}"),
            ("floor fp8", lambda r: f"{r['floor_fp8_us']:.1f}"),
            ("floor mxfp4", lambda r: f"{r['floor_mxfp4_us']:.1f}"),
        ],
    )
    index = [r for r in results if r["op"] == "index_topk" and r.get("peer") != "none"]
    table(
        "index_topk (us; peer = DeepGEMM fp8_paged_mqa_logits + the faster top-k)",
        index,
        lambda r: f"k={r['top_k']} {r['entries']}",
        [
            ("hdk fp8", lambda r: f"{r['hdk_fp8_us']:.1f}"),
            ("hdk mxfp4", lambda r: f"{r['hdk_mxfp4_us']:.1f}"),
            (
                "DeepGEMM",
                lambda r: f"{r['peer_us']:.1f} {'t' if r['peer_topk'] == 'torch.topk' else 'h'}",
            ),
            ("peer/hdk fp8", lambda r: f"{r['peer_over_hdk_fp8']:.2f}"),
            ("peer/hdk mxfp4", lambda r: f"{r['peer_over_hdk_mxfp4']:.2f}"),
            ("floor fp8", lambda r: f"{r['floor_fp8_us']:.1f}"),
        ],
    )
    if index:
        print("(DeepGEMM's top-k: t = torch.topk, h = hdk.topk)")


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", help="where to write the results (JSON)")
    parser.add_argument("--device", default="cuda", help="CUDA device (default cuda)")
    parser.add_argument("--ops", default="sparse,index", help="sparse, index (default both)")
    parser.add_argument("--N", default=DEFAULT_N, help=f"query rows (default {DEFAULT_N})")
    parser.add_argument("--presets", default="flash,pro", help="sparse: flash, pro")
    parser.add_argument(
        "--lists", default="csa,hca65536,hca262144", help="sparse: csa, hca65536, hca262144"
    )
    parser.add_argument(
        "--entries", default="2048,16384,65536", help="index: keys a row (default 2048,16384,65536)"
    )
    parser.add_argument("--top-k", default="512", help="index: top-k (512 Flash, 1024 Pro)")
    parser.add_argument(
        "--index-peer",
        default="deepgemm",
        choices=["deepgemm", "none"],
        help="index: DeepGEMM (default), or none: hdk's FP8 and MXFP4 columns alone",
    )
    parser.add_argument("--iters", type=int, default=100, help="timed replays a call (default 100)")
    parser.add_argument(
        "--flush-code",
        metavar="LIBRARY",
        help="also evict the SMs' instruction caches before each replay, as a call inside a "
        "decode step finds them: the path of libhdk_bench_code_flush.so (built with hdk-bench)",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="also each call's kernels, start and end inside its graph (the CUDA profiler's "
        "records of 20 flushed replays; hdk and FlashMLA's reused plan, hdk and DeepGEMM's "
        "logits + hdk.topk), printed and in the JSON",
    )
    args = parser.parse_args(argv)
    ops = set(parse_list(args.ops, str))
    if not ops <= {"sparse", "index"}:
        parser.error(f"--ops: unknown {sorted(ops - {'sparse', 'index'})}")
    for name, values, known in (
        ("--presets", args.presets, PRESETS),
        ("--lists", args.lists, LISTS),
    ):
        unknown = set(parse_list(values, str)) - set(known)
        if unknown:
            parser.error(f"{name}: unknown {sorted(unknown)}")
    if IMPORT_ERROR is not None:
        sys.exit(
            f"dsv4_vs_peers: the hdk package is not importable ({IMPORT_ERROR}); build python/ first"
        )
    if not torch.cuda.is_available():
        sys.exit("dsv4_vs_peers: needs a CUDA device (torch.cuda.is_available() is False)")
    if not (hdk.built_with_cuda() and hdk.extension_has_cuda()):
        sys.exit("dsv4_vs_peers: the hdk package was built without CUDA (see docs/python.md)")
    peers = {}
    for op, name, load in (
        ("sparse", "FlashMLA", dsv4_peers.load_flashmla),
        ("index", "DeepGEMM", dsv4_peers.load_deepgemm),
    ):
        if op in ops and not (op == "index" and args.index_peer == "none"):
            module, why = load()
            if module is None:
                sys.exit(f"dsv4_vs_peers: {name} is missing: {why}")
            peers[op] = module

    device = torch.device(args.device)
    if device.index is None:  # "cuda": the current device, which set_device needs by number
        device = torch.device("cuda", torch.cuda.current_device())
    torch.cuda.set_device(device)
    timer = CudaTimer(device, code_flush_library=args.flush_code)
    copy_gbs = timer.copy_bandwidth() / 1e9
    launch_us = timer.launch_floor_us(args.iters)
    pins = dsv4_peers.peer_pins()
    print(
        f"{timer.name}: copy bandwidth {copy_gbs:.1f} GB/s (read + write), one-kernel graph "
        f"replay {launch_us:.2f} us; torch {torch.__version__}, hdk {hdk.__version__}; peers "
        + (", ".join(f"{k} {v}" for k, v in pins.items()) or "(no PINS file)"),
        flush=True,
    )
    results = []
    started = time.time()
    if "sparse" in ops:
        bench_sparse(args, timer, peers["sparse"], copy_gbs, launch_us, results)
    if "index" in ops:
        bench_index(args, timer, peers.get("index"), copy_gbs, launch_us, results)
    print_tables(results)
    mismatches = [r for r in results if r["check"] != "ok"]
    report = {
        "device": timer.name,
        "torch": torch.__version__,
        "hdk": hdk.__version__,
        "peers": pins,
        "deep_gemm": getattr(peers.get("index"), "__version__", None),
        "index_peer": args.index_peer if "index" in ops else None,
        "copy_bandwidth_gbs": round(copy_gbs, 2),
        "launch_us": round(launch_us, 3),
        "timing": f"CUDA graph replay, L2 flushed before each"
        f"{' (instruction caches too)' if timer.flushes_code else ''}, median of {args.iters}",
        "floor": "launch_us + bytes / copy bandwidth",
        "tolerances": {
            "out_max_abs_diff": OUT_TOLERANCE,
            "lse_max_abs_diff": LSE_TOLERANCE,
            "score_max_rel_diff": SCORE_RELATIVE_TOLERANCE,
            "overlap": MIN_OVERLAP,
        },
        "seconds": round(time.time() - started, 1),
        "mismatches": len(mismatches),
        "results": results,
    }
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=2)
        print(f"wrote {args.json}")
    if mismatches:
        print(f"{len(mismatches)} cell(s) not ok (MISMATCH or ERROR)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
