"""``python -m hdk.bench gdn``: hdk's GDN decode against the engines' Triton kernels and
FlashInfer's.

For every (state dtype, T, B) point all implementations get the same random inputs, in the same
process: hdk (``hdk.gdn_decode``), SGLang's ``fused_sigmoid_gating_delta_rule_update`` and FLA's
``fused_recurrent_gated_delta_rule`` when they can be imported from the peers folder, and, when
asked for (``--impls ...,flashinfer``), FlashInfer's ``flashinfer.gdn_decode`` (CuTe DSL kernels
on Hopper) from the install of ``scripts/peers/flashinfer.sh`` (:mod:`hdk.bench.peers`). Each
peer's results are cross-checked against hdk's (relative L2 error of the output and of the final
or intermediate states), then every implementation is captured once in a CUDA graph and replayed
with L2 flushed before each replay, the cases of a point timed in turn for --rounds rounds; the
lowest median replay time is reported with its share of the device-to-device copy bandwidth
measured in the same run, and the ratio peer time / hdk time. A cell FlashInfer does not serve
(it asserts or raises ValueError/NotImplementedError) is an "unsupported: <its message>" row.

Modes: T = 1 is the decode step (pool read and written in place). T > 1 is the speculative
verify pass (pool only read, the state after every token cached) for hdk, SGLang and FlashInfer
(its MTP kernels with ``intermediate_states_buffer``); FLA has neither pool nor cache, so at
T > 1 it is compared with hdk running the same multi-token update ("multi": pool updated, no
cache).

Call forms: every peer is compared with hdk doing the same work. SGLang and FlashInfer read and
write a pool through per-request slot indices ("pool", hdk's form too; FlashInfer's
"pretranspose" ``[pool, HV, V, K]`` state is hdk's VK layout). FLA has no slot index: request n's
state is row n of a dense tensor the caller gathered ("dense"). So at points where FLA runs, hdk
is timed twice: on the pool (its headline time, against SGLang and FlashInfer) and in FLA's
call form (no ``state_indices``, the same gathered states FLA gets), and FLA's ratio is against
the latter. Both hdk rows are in the JSON, so FLA against hdk's pool form can be read there too.
"""

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

import hdk
from hdk.bench import peers
from hdk.bench.timing import CudaTimer, HostTimer

PRESETS = {
    "qwen3.5-397b": dict(H=16, HV=64, K=128, V=128),
    "qwen3-next": dict(H=16, HV=32, K=128, V=128),
}
STATE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
INPUT_DTYPE = torch.bfloat16
# SGLang's verify kernel computes cache offsets (index * steps * HV * K * V) in int32: past
# 2^31 elements it faults with an illegal address (the spec measured B=512, T=4, HV=64 on an
# H200), which would poison the CUDA context for every later point.
SGLANG_CACHE_LIMIT = 2**31
# FlashInfer's bf16-state verify (0.7.2.post1) faulted the same way at B=512, T=8, HV=64 (2^32
# cache elements, H200) and ran at B=256, T=8 (2^31): its cells above 2^31 are skipped.
FLASHINFER_CACHE_LIMIT = 2**31 + 1


def verify_cache_limit(peer):
    """(cache elements B*T*HV*V*K from which the peer's verify is not called, why), or (None, "")
    for a peer without one: a fault there would poison the CUDA context for every later point."""
    if peer == "sglang":
        return SGLANG_CACHE_LIMIT, (
            ">= 2^31 overflows SGLang's int32 cache offsets (illegal address, see the spec)"
        )
    if peer == "flashinfer":
        return FLASHINFER_CACHE_LIMIT, (
            "> 2^31: FlashInfer's verify faulted with an illegal address there (B=512, T=8, "
            "HV=64, H200)"
        )
    return None, ""


# How each peer addresses the states (see the module docstring); hdk is timed in each form.
PEER_CALL_FORM = {"sglang": "pool", "fla": "dense", "flashinfer": "pool"}
IMPLS = ("hdk",) + tuple(PEER_CALL_FORM)
# Peers that run only when --impls names them (and only then get a line in "peers").
OPT_IN_PEERS = ("flashinfer",)
# What FlashInfer raises for a cell it does not serve (its asserts, its backends' ValueError and
# NotImplementedError): recorded as "unsupported: <message>" rows.
FLASHINFER_UNSUPPORTED = (AssertionError, ValueError, NotImplementedError)
TOLERANCE = {torch.bfloat16: 2e-2, torch.float32: 5e-3}


@dataclass
class Row:
    state: str
    T: int
    B: int
    mode: str
    impl: str
    time_us: float = None
    bytes: int = None
    GBps: float = None
    pct_copy: float = None
    peer_over_hdk: float = None
    err_out: float = None
    err_state: float = None
    check: str = None
    do_bench_us: float = None  # triton.testing.do_bench median (eager calls, its own L2 flush)
    note: str = ""
    preset: str = ""
    call_form: str = "pool"  # "pool": slot indices; "dense": request n's state in row n


@dataclass
class Inputs:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    A_log: torch.Tensor
    a: torch.Tensor
    dt_bias: torch.Tensor
    b: torch.Tensor
    pool: torch.Tensor  # the starting states, never written: every implementation clones it
    indices: torch.Tensor
    shape: dict = field(default_factory=dict)


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m hdk.bench gdn",
        description="hdk GDN decode vs SGLang's Triton kernel, FLA's fused_recurrent and "
        "FlashInfer's GDN decode",
    )
    parser.add_argument("--batch", default="1,2,4,8,16,32,64,128,256,512", help="batch sizes B")
    parser.add_argument("--T", default="1,2,4,8", help="tokens per request")
    parser.add_argument("--state", default="bf16,fp32", help="state dtypes (bf16, fp32)")
    parser.add_argument(
        "--preset", default="qwen3.5-397b", help=f"shapes, comma-separated: {', '.join(PRESETS)}"
    )
    parser.add_argument("--json", help="write the results to this JSON file")
    parser.add_argument("--peers-dir", default=None, help="folder with sglang/ and fla/")
    parser.add_argument(
        "--impls",
        default="hdk,sglang,fla",
        help=f"implementations to run, of {','.join(IMPLS)} (flashinfer: only when named; "
        "install it with scripts/peers/flashinfer.sh)",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=30, help="most timed replays per case")
    parser.add_argument("--min-iters", type=int, default=5, help="fewest timed replays")
    parser.add_argument(
        "--budget-ms", type=float, default=150.0, help="replay time per case that sizes --iters"
    )
    parser.add_argument(
        "--rounds", type=int, default=2, help="timing rounds over a point's cases (lowest median)"
    )
    parser.add_argument("--seed", type=int, default=0)
    # For the benchmark's own tests: load stand-in peers on the CPU.
    parser.add_argument("--cpu-peers", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.batch = [int(x) for x in args.batch.split(",") if x]
    args.T = [int(x) for x in args.T.split(",") if x]
    args.state = [x for x in args.state.split(",") if x]
    unknown = [x for x in args.state if x not in STATE_DTYPES]
    if unknown:
        parser.error(f"unknown state dtype(s) {unknown}; use bf16, fp32")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    args.impls = [x for x in args.impls.split(",") if x]
    unknown = [x for x in args.impls if x not in IMPLS]
    if unknown:
        parser.error(f"unknown implementation(s) {unknown}; use {', '.join(IMPLS)}")
    args.preset = [x for x in args.preset.split(",") if x]
    unknown = [x for x in args.preset if x not in PRESETS]
    if unknown:
        parser.error(f"unknown preset(s) {unknown}; use {', '.join(PRESETS)}")
    return args


def make_inputs(shape, batch, tokens, state_dtype, device, seed):
    # Drawn on the device: a B=512 pool is half a billion numbers, minutes on the host.
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    H, HV, K, V = shape["H"], shape["HV"], shape["K"], shape["V"]

    def random(*size, scale=1.0, dtype=INPUT_DTYPE):
        x = torch.randn(size, generator=generator, device=device, dtype=torch.float32)
        return (x * scale).to(dtype)

    return Inputs(
        q=random(batch, tokens, H, K),
        k=random(batch, tokens, H, K),
        v=random(batch, tokens, HV, V),
        A_log=torch.rand(HV, generator=generator, device=device) * 2.5,
        a=random(batch, tokens, HV),
        dt_bias=random(HV, scale=0.5, dtype=torch.float32),
        b=random(batch, tokens, HV),
        pool=random(batch, HV, V, K, scale=0.1, dtype=state_dtype),
        # Slots in random order: an engine's pool is not laid out by batch position.
        indices=torch.randperm(batch, generator=generator, device=device).to(torch.int32),
        shape=shape,
    )


def minimal_bytes(x, mode, final_state_size=None):
    """What any implementation must move: inputs, output, state read, and state (or cache)
    writes. FLA writes a new fp32 final state, hence `final_state_size`."""
    batch, tokens = x.q.shape[0], x.q.shape[1]
    H, HV, K, V = (x.shape[name] for name in ("H", "HV", "K", "V"))
    size = x.q.element_size()
    state = batch * HV * V * K
    state_size = x.pool.element_size()
    moved = batch * tokens * (2 * H * K + 2 * HV * V + 2 * HV) * size
    moved += state * state_size  # read
    if mode == "verify":
        moved += tokens * state * state_size
    else:
        moved += state * (final_state_size or state_size)
    return moved


@dataclass
class Case:
    """One implementation at one point: `call` runs it; `results()` are the tensors to compare."""

    name: str
    mode: str
    call: Callable
    results: Callable
    bytes: int


def gathered_states(x):
    """The starting states in request order (row n = slot indices[n]): FLA's call form."""
    return x.pool.index_select(0, x.indices.long())


def to_slot_order(x, states):
    """Request-ordered states back in slot order, to compare with a pool."""
    scattered = torch.empty_like(states)
    scattered[x.indices.long()] = states
    return scattered


def hdk_case(x, mode, call_form="pool"):
    dense = call_form == "dense"
    # The dense form is what a caller of FLA has: states gathered outside the call, no index.
    pool = gathered_states(x) if dense else x.pool.clone()
    out = torch.empty(x.v.shape, dtype=x.v.dtype, device=x.v.device)
    cache = None
    if mode == "verify":
        cache = torch.empty(
            (x.q.shape[0], x.q.shape[1]) + tuple(pool.shape[1:]),
            dtype=pool.dtype,
            device=pool.device,
        )

    def call():
        hdk.gdn_decode(
            x.q,
            x.k,
            x.v,
            pool,
            A_log=x.A_log,
            a=x.a,
            dt_bias=x.dt_bias,
            b=x.b,
            state_indices=None if dense else x.indices,
            intermediate_states=cache,
            out=out,
            update_state=mode != "verify",
            use_qk_l2norm=True,
        )

    def results():
        if mode == "verify":
            return {"out": out, "state": cache}
        return {"out": out, "state": to_slot_order(x, pool) if dense else pool}

    return Case("hdk", mode, call, results, minimal_bytes(x, mode))


def sglang_case(function, x, mode):
    pool = x.pool.clone()
    cache = rows = None
    if mode == "verify":
        cache = torch.empty(
            (x.q.shape[0], x.q.shape[1]) + tuple(pool.shape[1:]),
            dtype=pool.dtype,
            device=pool.device,
        )
        rows = torch.arange(x.q.shape[0], dtype=torch.int32, device=pool.device)
    produced = {}

    def call():
        produced["out"] = function(
            A_log=x.A_log,
            a=x.a,
            dt_bias=x.dt_bias,
            softplus_beta=1.0,
            softplus_threshold=20.0,
            q=x.q,
            k=x.k,
            v=x.v,
            b=x.b,
            initial_state_source=pool,
            initial_state_indices=x.indices,
            use_qk_l2norm_in_kernel=True,
            disable_state_update=mode == "verify",
            intermediate_states_buffer=cache,
            intermediate_state_indices=rows,
            # Versions of the kernel that default it to 0 would write every request's states
            # over request 0's: give the cache's steps explicitly.
            cache_steps=x.q.shape[1] if mode == "verify" else None,
        )

    def results():
        return {"out": produced["out"], "state": cache if mode == "verify" else pool}

    return Case("sglang", mode, call, results, minimal_bytes(x, mode))


def fla_case(function, x, mode):
    produced = {}
    # FLA reads request n's state from row n of initial_state: it has no pool indices. Its
    # states are gathered by slot once, outside the timed call; hdk's "dense" row gets the same.
    initial_state = gathered_states(x)

    def call():
        produced["out"], produced["state"] = function(
            q=x.q,
            k=x.k,
            v=x.v,
            g=x.a,
            beta=x.b,
            initial_state=initial_state,
            output_final_state=True,
            use_qk_l2norm_in_kernel=True,
            use_gate_in_kernel=True,
            A_log=x.A_log,
            dt_bias=x.dt_bias,
            use_beta_sigmoid_in_kernel=True,
            state_v_first=True,
        )

    def results():
        return {"out": produced["out"], "state": to_slot_order(x, produced["state"])}

    return Case("fla", mode, call, results, minimal_bytes(x, mode, final_state_size=4))


def flashinfer_case(fns, x, mode):
    """FlashInfer (``fns`` from :func:`hdk.bench.peers.load_flashinfer`) on a clone of hdk's pool,
    with the same slot indices: its "pretranspose" ``[pool, HV, V, K]`` state is hdk's VK layout.

    decode (T = 1): ``gated_delta_rule_decode_pretranspose`` updates the pool in place (bf16
    state: its bf16-state CuTe DSL kernel; fp32: its fp32 pretranspose kernel). verify (T > 1):
    the pool is only read (``disable_state_update=True``) and the state after every token goes
    to ``intermediate_states_buffer`` ``[B, T, HV, V, K]``, indexed by request like hdk's cache.
    A bf16 pool goes through ``gated_delta_rule_decode_pretranspose`` (which runs its bf16 MTP
    kernel at T > 1: ``gated_delta_rule_mtp`` itself asserts an fp32 state), an fp32 pool
    through ``gated_delta_rule_mtp``. ``backend`` stays "auto", as an engine calls it: on SM90
    "auto" passes over its cake_gdn kernels (SM100a/SM103a only) to the CuTe DSL ones. Inputs
    are as FlashInfer takes them: bf16 q/k/v/a/b, fp32 A_log and dt_bias, int32 indices."""
    if mode not in ("decode", "verify"):
        raise ValueError(f"FlashInfer is compared in decode and verify mode, not {mode}")
    pool = x.pool.clone()
    out = torch.empty(x.v.shape, dtype=torch.bfloat16, device=x.v.device)
    cache = None
    if mode == "verify":
        cache = torch.empty(
            (x.q.shape[0], x.q.shape[1]) + tuple(pool.shape[1:]),
            dtype=pool.dtype,
            device=pool.device,
        )
    produced = {}

    def call():
        if mode == "verify" and pool.dtype == torch.float32:
            produced["out"], _ = fns.mtp(
                x.q,
                x.k,
                x.v,
                pool,
                x.indices,
                x.A_log,
                x.a,
                x.dt_bias,
                x.b,
                output=out,
                intermediate_states_buffer=cache,
                disable_state_update=True,
                use_qk_l2norm=True,
            )
            return
        verify = {}
        if mode == "verify":
            verify = dict(intermediate_states_buffer=cache, disable_state_update=True)
        produced["out"], _ = fns.decode_pretranspose(
            x.q,
            x.k,
            x.v,
            None,
            x.A_log,
            x.a,
            x.dt_bias,
            x.b,
            output=out,
            use_qk_l2norm=True,
            initial_state=pool,
            initial_state_indices=x.indices,
            **verify,
        )

    def results():
        return {"out": produced["out"], "state": cache if mode == "verify" else pool}

    return Case("flashinfer", mode, call, results, minimal_bytes(x, mode))


PEER_CASES = {"sglang": sglang_case, "fla": fla_case, "flashinfer": flashinfer_case}


def relative_error(actual, expected, chunk=2**24):
    """||actual - expected|| / ||expected||, in chunks: caches of several GiB are compared."""
    actual, expected = actual.reshape(-1), expected.reshape(-1)
    difference = reference = 0.0
    for start in range(0, expected.numel(), chunk):
        mine = expected[start : start + chunk].double()
        difference += (actual[start : start + chunk].double() - mine).square().sum().item()
        reference += mine.square().sum().item()
    return math.sqrt(difference / max(reference, 1e-60))


class Runner:
    def __init__(self, args):
        self.args = args
        self.device = torch.device(args.device)
        self.timer = CudaTimer(self.device) if self.device.type == "cuda" else HostTimer()
        self.preset = args.preset[0]
        self.rows = []
        self.peer_status = {}
        self.peers = {}
        peers_dir = args.peers_dir or peers.default_peers_dir()
        self.peers_dir = str(peers_dir)
        loaders = (
            ("sglang", peers.load_sglang),
            ("fla", peers.load_fla),
            ("flashinfer", peers.load_flashinfer),
        )
        for name, loader in loaders:
            if name not in args.impls:
                if name not in OPT_IN_PEERS:
                    self.peer_status[name] = "not requested (--impls)"
            elif self.device.type != "cuda" and not args.cpu_peers:
                self.peer_status[name] = "skipped: the peers are GPU kernels and need CUDA"
            else:
                function, problem = loader(peers_dir)
                self.peers[name] = function
                self.peer_status[name] = problem
                if function:
                    describe = getattr(function, "describe", None)
                    self.peer_status[name] = f"loaded: {describe}" if describe else "loaded"
        self.copy_bandwidth = self.timer.copy_bandwidth()

    def timed(self, cases):
        """Median microseconds per call of each case (graph replays on CUDA), the lowest over
        --rounds rounds that time every case in turn: a stretch of slow clocks then costs one
        round, not a cell (one run read hdk 49.3 us where it takes 15.6, and FLA 3.5x its time,
        in the same cell; 2026-11-27)."""
        graphs = [self.timer.capture(case.call) for case in cases]
        iters = []
        for graph in graphs:
            estimate = max(self.timer.estimate_us(graph), 1.0)
            count = int(self.args.budget_ms * 1e3 / estimate)
            iters.append(max(self.args.min_iters, min(self.args.iters, count)))
        best = [math.inf] * len(cases)
        for _ in range(self.args.rounds):
            for index, graph in enumerate(graphs):
                best[index] = min(best[index], self.timer.time_graph(graph, iters[index]))
        del graphs
        return best

    def do_bench(self, case):
        """Median microseconds per eager call by triton.testing.do_bench, or None off CUDA."""
        if self.device.type != "cuda":
            return None
        try:
            import triton.testing
        except ImportError:
            return None
        return 1e3 * triton.testing.do_bench(case.call, warmup=10, rep=50, return_mode="median")

    def record(self, row, case=None, elapsed=None, reference_time=None):
        if case is not None and elapsed is not None:
            row.time_us = elapsed
            row.bytes = case.bytes
            row.GBps = case.bytes / elapsed / 1e3
            row.pct_copy = 100.0 * case.bytes / (elapsed * 1e-6) / self.copy_bandwidth
            if reference_time:
                row.peer_over_hdk = elapsed / reference_time
        self.rows.append(row)
        print(format_row(row), flush=True)
        if self.args.json:
            self.write_json()

    def compare(self, row, peer, reference):
        mine, theirs = reference.results(), peer.results()
        row.err_out = relative_error(theirs["out"], mine["out"])
        row.err_state = relative_error(theirs["state"], mine["state"])
        limit = TOLERANCE[self.state_dtype]
        row.check = "ok" if max(row.err_out, row.err_state) <= limit else f"MISMATCH (> {limit})"

    def run_point(self, preset, state_name, tokens, batch):
        self.preset = preset
        self.state_dtype = STATE_DTYPES[state_name]
        x = make_inputs(
            PRESETS[preset], batch, tokens, self.state_dtype, self.device, self.args.seed
        )
        if tokens == 1:
            groups = [("decode", ["sglang", "fla", "flashinfer"])]
        else:
            groups = [("verify", ["sglang", "flashinfer"]), ("multi", ["fla"])]
        for mode, peer_names in groups:
            available = [name for name in peer_names if self.peers.get(name)]
            # "multi" exists only to give FLA a like-for-like hdk run.
            if mode == "multi" and not available:
                continue
            self.run_group(x, state_name, tokens, batch, mode, available)
        del x
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def run_group(self, x, state_name, tokens, batch, mode, peer_names):
        def new_row(impl, note="", call_form="pool"):
            return Row(
                state_name,
                tokens,
                batch,
                mode,
                impl,
                note=note,
                preset=self.preset,
                call_form=call_form,
            )

        reference = hdk_case(x, mode)
        reference.call()  # eager: the results every peer is checked against
        # (row, case) of everything timed at this point, hdk's pool form first. hdk in each
        # peer's call form is checked against its pool form like a peer, before any timed replay
        # moves the reference's pool on.
        timed = [(new_row("hdk"), reference)]
        for form in sorted({PEER_CALL_FORM[name] for name in peer_names} - {"pool"}):
            case = hdk_case(x, mode, form)
            case.call()
            row = new_row("hdk", call_form=form)
            self.compare(row, case, reference)
            timed.append((row, case))
        failed = []
        for name in peer_names:
            function = self.peers[name]
            form = PEER_CALL_FORM[name]
            cache_elements = batch * tokens * x.pool[0].numel()
            limit, why = verify_cache_limit(name)
            if mode == "verify" and limit is not None and cache_elements >= limit:
                row = new_row(name, f"skipped: B*T*HV*V*K = {cache_elements} {why}", form)
                failed.append(row)
                continue
            row = new_row(name, call_form=form)
            try:
                case = PEER_CASES[name](function, x, mode)
                case.call()
                self.compare(row, case, reference)
                if name == "flashinfer":
                    # A call that cannot be captured (a host sync, say) is this peer's row, not
                    # an error of the whole point in self.timed().
                    self.timer.capture(case.call)
                timed.append((row, case))
            except Exception as error:  # a peer failure is a result, not the end of the run
                message = (str(error).splitlines() or [""])[0][:200] or type(error).__name__
                if name == "flashinfer" and isinstance(error, FLASHINFER_UNSUPPORTED):
                    row.note = f"unsupported: {message}"
                else:
                    row.note = f"failed: {type(error).__name__}: {message}"
                failed.append(row)
                if "illegal" in str(error) or "CUDA error" in str(error):
                    raise
        times = self.timed([case for _, case in timed])
        hdk_times = {}
        for (row, case), elapsed in zip(timed, times):
            row.do_bench_us = self.do_bench(case)
            if row.impl == "hdk":
                hdk_times[row.call_form] = elapsed
            self.record(row, case, elapsed, None if row.impl == "hdk" else hdk_times[row.call_form])
        for row in failed:
            self.record(row)

    def write_json(self):
        rounds = self.args.rounds
        document = dict(
            benchmark="gdn",
            command=" ".join(["python -m hdk.bench gdn"] + sys.argv[2:]),
            device=self.timer.name,
            torch=torch.__version__,
            hdk=hdk.__version__,
            presets={name: PRESETS[name] for name in self.args.preset},
            input_dtype="bf16",
            copy_bandwidth_GBps=self.copy_bandwidth / 1e9,
            l2_flush_bytes=2 * self.timer.l2_bytes,
            timing=(
                f"median CUDA-graph replay, L2 flushed before each, lowest of {rounds} rounds"
                if self.device.type == "cuda"
                else "median eager call (CPU)"
            ),
            peers_dir=self.peers_dir,
            peers=self.peer_status,
            rows=[asdict(row) for row in self.rows],
        )
        with open(self.args.json, "w") as handle:
            json.dump(document, handle, indent=1)


HEADER = (
    f"{'preset':12} {'state':5} {'T':>2} {'B':>4} {'mode':6} {'impl':10} {'form':5} {'time_us':>9} "
    f"{'GB/s':>7} "
    f"{'%copy':>6} {'peer/hdk':>8} {'do_bench':>9} {'err_out':>8} {'err_state':>9}  check/note"
)


def format_number(value, width, digits):
    return f"{value:{width}.{digits}f}" if value is not None else f"{'-':>{width}}"


def format_error(value, width):
    return f"{value:{width}.1e}" if value is not None else f"{'-':>{width}}"


def format_row(row):
    note = " ".join(part for part in (row.check or "", row.note) if part)
    return (
        f"{row.preset:12} {row.state:5} {row.T:>2} {row.B:>4} {row.mode:6} {row.impl:10} "
        f"{row.call_form:5} {format_number(row.time_us, 9, 2)} {format_number(row.GBps, 7, 0)} "
        f"{format_number(row.pct_copy, 6, 1)} {format_number(row.peer_over_hdk, 8, 2)} "
        f"{format_number(row.do_bench_us, 9, 2)} {format_error(row.err_out, 8)} "
        f"{format_error(row.err_state, 9)}  {note}"
    )


def main(argv):
    args = parse_args(argv)
    started = time.time()
    with torch.inference_mode():
        runner = Runner(args)
        print(
            f"hdk {hdk.__version__} on {runner.timer.name}; torch {torch.__version__}; "
            f"presets {', '.join(f'{name} {PRESETS[name]}' for name in args.preset)}; "
            "q/k/v/a/b bf16",
            flush=True,
        )
        print(
            f"copy bandwidth (read + write): {runner.copy_bandwidth / 1e9:.0f} GB/s; "
            f"peers from {runner.peers_dir}",
            flush=True,
        )
        for name, status in runner.peer_status.items():
            print(f"  {name}: {status}", flush=True)
        points = [
            (preset, state, tokens, batch)
            for preset in args.preset
            for state in args.state
            for tokens in args.T
            for batch in args.batch
        ]
        print(HEADER, flush=True)
        try:
            for preset, state_name, tokens, batch in points:
                try:
                    runner.run_point(preset, state_name, tokens, batch)
                except torch.cuda.OutOfMemoryError as error:
                    runner.record(
                        Row(
                            state_name,
                            tokens,
                            batch,
                            "-",
                            "all",
                            note=f"out of memory: {str(error).splitlines()[0][:160]}",
                            preset=preset,
                        )
                    )
                    torch.cuda.empty_cache()
        except Exception as error:
            print(f"stopping: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            if args.json:
                runner.write_json()
            return 1
    if args.json:
        runner.write_json()
        print(f"wrote {args.json}", flush=True)
    print(f"done: {len(points)} points in {time.time() - started:.0f} s", flush=True)
    mismatches = [row for row in runner.rows if row.check and row.check != "ok"]
    return 1 if mismatches else 0
