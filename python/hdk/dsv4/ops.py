"""DeepSeek-V4's operations on the decode path: routing (``torch.ops.hdk.dsv4_route``), the KV
cache's write side (``dsv4_store_*``, ``dsv4_gather_*``, ``dsv4_compress(_pair)``) and its read
side (``dsv4_index_topk``, ``dsv4_sparse_decode``), with the C++ field names. Exported as
``hdk.dsv4.*``; the model-level owner of the pools (kv_cache_manager.py) builds on these, never
the other way round."""

import torch

from hdk._ops import HdkError, run_op


def _check_tensor(name, value):
    if value is None or isinstance(value, torch.Tensor):
        return
    raise TypeError(
        f"hdk.dsv4.route: argument '{name}' must be a torch.Tensor or None, "
        f"got {type(value).__name__}"
    )


def route_workspace_slabs(rows):
    """The slabs S of the fused gate's ``logits_workspace`` ``[S, N, E]`` for ``rows`` = N: 16 up
    to 64 rows, then ``16 // ceil(N / 64)``, at least 1. A workspace sized for the largest batch
    can be sliced as ``workspace[:S, :N]``."""
    return int(torch.ops.hdk.dsv4_route_workspace_slabs(int(rows)))


def route(
    logits=None,
    *,
    hidden=None,
    gate_weight=None,
    bias=None,
    token_ids=None,
    tid2eid=None,
    top_k=6,
    route_scale=1.0,
    topk_ids=None,
    topk_weights=None,
    logits_workspace=None,
    invalid_count=None,
):
    r"""DeepSeek-V4's MoE router for N tokens, in fp32::

        s        = sqrt(softplus(logits))        logits = hidden @ gate_weight.T, or given
        selected = top_k of (s + bias)          or tid2eid[token_ids] (hash routing)
        weights  = s[selected] / s[selected].sum(-1) * route_scale

    Ties in ``s + bias`` go to the lower expert index; ``topk_ids`` are in descending key order
    (table order for hash routing). A row with a NaN logit, or whose selected ``s`` sum to 0 or
    infinity, gets ids -1 and weights 0 and is counted in ``invalid_count``; on CUDA so is a
    token id (or table entry) out of range, which is an error on the CPU. The call allocates
    only what it returns (and, for the fused gate on CUDA, the ``[S, N, E]`` fp32 logits
    workspace) and never synchronizes, so it can be captured in a CUDA graph. The contract is
    docs/dsv4-router.md.

    Args:
        logits: ``[N, E]`` fp32 or bf16 (last dim contiguous); or None with hidden and
            gate_weight.

    Keyword Args:
        hidden: ``[N, D]`` bf16: the fused gate computes ``hidden @ gate_weight.T`` itself.
        gate_weight: ``[E, D]`` bf16.
        bias: ``[E]`` fp32 selection bias (dense routing only; never added to the weights).
        token_ids: ``[N]`` int32/int64 and tid2eid ``[vocab, top_k]`` int32: hash routing.
        top_k: experts per token, 1..min(E, 2048) (default 6).
        route_scale: weight scale (DeepSeek-V4: 1.5 Flash, 2.5 Pro).
        topk_ids, topk_weights: ``[N, top_k]`` int32 / fp32 outputs, written in place; None:
            allocated.
        logits_workspace: ``[S, N, E]`` fp32 with ``S >= route_workspace_slabs(N)`` (last dim
            contiguous), fused gate only: the gate GEMM's partial sums; afterwards
            ``logits_workspace[0]`` holds the logits. None: allocated on CUDA (where the kernels
            need it), not used on the CPU.
        invalid_count: ``[1]`` int32/int64 counter hdk adds invalid rows to (never clears).

    Returns:
        ``(topk_ids, topk_weights)``.

    Raises:
        HdkError: (a ValueError and a RuntimeError) for any invalid argument, with hdk's
            message naming the argument, e.g. ``hdk::dsv4::route: argument 'gate_weight' must
            have shape [E, D] = ...``.
        TypeError: when a tensor argument is not a torch.Tensor.
    """
    arguments = (
        ("logits", logits),
        ("hidden", hidden),
        ("gate_weight", gate_weight),
        ("bias", bias),
        ("token_ids", token_ids),
        ("tid2eid", tid2eid),
        ("topk_ids", topk_ids),
        ("topk_weights", topk_weights),
        ("logits_workspace", logits_workspace),
        ("invalid_count", invalid_count),
    )
    for name, value in arguments:
        _check_tensor(name, value)
    scores = logits if logits is not None else hidden
    if scores is None:
        raise HdkError(
            "hdk::dsv4::route: no scores given: pass 'logits' [N, E], or 'hidden' [N, D] with "
            "'gate_weight' [E, D]"
        )
    fused = logits is None
    if scores.dim() < 1:
        raise HdkError(
            f"hdk::dsv4::route: argument "
            f"'{'hidden' if fused else 'logits'}' must have rank 2, got a scalar"
        )
    rows = scores.shape[0]
    device = scores.device
    # An out-of-range top_k gets hdk's message (it is checked before the output shapes), not
    # an allocation failure.
    columns = int(top_k) if 0 <= int(top_k) <= 2048 else 0
    if topk_ids is None:
        topk_ids = torch.empty((rows, columns), dtype=torch.int32, device=device)
    if topk_weights is None:
        topk_weights = torch.empty((rows, columns), dtype=torch.float32, device=device)
    if (
        logits_workspace is None
        and fused
        and device.type == "cuda"
        and isinstance(gate_weight, torch.Tensor)
        and gate_weight.dim() >= 1
    ):
        logits_workspace = torch.empty(
            (route_workspace_slabs(rows), rows, gate_weight.shape[0]),
            dtype=torch.float32,
            device=device,
        )
    run_op(
        torch.ops.hdk.dsv4_route,
        logits,
        hidden,
        gate_weight,
        bias,
        token_ids,
        tid2eid,
        topk_ids,
        topk_weights,
        logits_workspace,
        invalid_count,
        int(top_k),
        float(route_scale),
    )
    return topk_ids, topk_weights


# ------------------------------------------------------------------------------------------
# KV cache, write side (docs/dsv4-kv-cache.md): thin wrappers over torch.ops.hdk.dsv4_* with the
# C++ field names. Each writes in place, allocates only what it returns, never synchronizes.

# Indexer key formats (the ops take the int): MXFP4 68 B a key (64 B E2M1 + 4 UE8M0 scales),
# NVFP4 72 B (64 B E2M1 + 8 E4M3 scales), FP8 132 B (128 E4M3 + one fp32 scale: the page of
# vLLM / SGLang / DeepGEMM's fp8_paged_mqa_logits on Hopper).
KEY_FORMATS = {"mxfp4": 0, "nvfp4": 1, "fp8": 2}
KEY_BYTES = {"mxfp4": 68, "nvfp4": 72, "fp8": 132}
ENTRY_BYTES = 584
# After store + gather, a non-RoPE value x with |x| >= 2^-6 x its group's scale is within
# FP8_RELATIVE_ERROR_BOUND * |x| (kFp8RelativeErrorBound in kv_cache.h); smaller ones within
# 2^-10 x scale.
FP8_RELATIVE_ERROR_BOUND = 0.0625


def _key_format(format):
    if format not in KEY_FORMATS:
        raise HdkError(f"hdk::dsv4: key format must be 'mxfp4', 'nvfp4' or 'fp8', got {format!r}")
    return KEY_FORMATS[format]


def hadamard_matrix(n=128, device="cpu"):
    """The orthonormal Sylvester Hadamard matrix H_n / sqrt(n), fp32: the rotation hdk applies
    to indexer keys (``rotate=True``). An indexer query ``q`` scores against rotated keys as
    ``q @ hadamard_matrix()`` (H is symmetric and orthonormal, so the scores are q . k)."""
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / n**0.5).to(device)


def store_entries(values, slots, cache, block_size, *, invalid_count=None, check_indices=False):
    """MODEL1 entries: values [N, 512] fp32/bf16 -> cache [num_blocks, block_size * 584] uint8
    at flat slots [N] (negative: skipped)."""
    run_op(
        torch.ops.hdk.dsv4_store_entries,
        values,
        slots,
        cache,
        int(block_size),
        invalid_count,
        bool(check_indices),
    )
    return cache


def gather_entries(
    cache,
    block_size,
    slots,
    *,
    out=None,
    dtype=torch.float32,
    invalid_count=None,
    check_indices=False,
):
    """Dequantized entries [N, L, 512] for slots [N, L] (negative: a zero row)."""
    if out is None:
        out = torch.empty((*slots.shape, 512), dtype=dtype, device=cache.device)
    run_op(
        torch.ops.hdk.dsv4_gather_entries,
        cache,
        int(block_size),
        slots,
        out,
        invalid_count,
        bool(check_indices),
    )
    return out


def store_indexer_keys(
    keys,
    slots,
    cache,
    block_size,
    *,
    format="mxfp4",
    rotate=True,
    invalid_count=None,
    check_indices=False,
):
    """Indexer keys [N, 128] fp32/bf16 -> cache [num_blocks, block_size * KEY_BYTES[format]]
    uint8 at flat slots [N] (negative: skipped), rotated by :func:`hadamard_matrix` first when
    ``rotate``. ``format``: ``"mxfp4"`` (68 B a key: 64 B packed E2M1, then 4 UE8M0 scales, one
    per 32 values), ``"nvfp4"`` (72 B: 64 B E2M1, then 8 E4M3 scales, one per 16) or ``"fp8"``
    (132 B: a page holds key i's 128 E4M3 codes at ``i * 128``, then its fp32 scale at
    ``block_size * 128 + i * 4``; the scale is the power of two ``2^ceil(log2(max(amax, 1e-4) /
    448))`` of the key's amax). A key with a NaN or infinity is stored with NaN markers (FP8:
    codes 0x7F and the scale NaN 0x7FC00000) and counted in ``invalid_count``."""
    run_op(
        torch.ops.hdk.dsv4_store_indexer_keys,
        keys,
        slots,
        cache,
        int(block_size),
        _key_format(format),
        bool(rotate),
        invalid_count,
        bool(check_indices),
    )
    return cache


def gather_indexer_keys(
    cache,
    block_size,
    slots,
    *,
    format="mxfp4",
    out=None,
    dtype=torch.float32,
    invalid_count=None,
    check_indices=False,
):
    """Decoded keys [N, L, 128] (in the rotated basis) for slots [N, L] (negative: a zero row):
    code x scale (``"fp8"``: E4M3 code x the key's fp32 scale, whatever fp32 the page holds);
    NaN markers decode to NaN. ``format``: ``"mxfp4"``, ``"nvfp4"`` or ``"fp8"``, as stored."""
    if out is None:
        out = torch.empty((*slots.shape, 128), dtype=dtype, device=cache.device)
    run_op(
        torch.ops.hdk.dsv4_gather_indexer_keys,
        cache,
        int(block_size),
        slots,
        out,
        _key_format(format),
        invalid_count,
        bool(check_indices),
    )
    return out


def compress(
    kv,
    score,
    ape,
    positions,
    state_slots,
    state,
    norm_weight,
    rope_cos,
    rope_sin,
    block_table,
    cache,
    block_size,
    ratio,
    *,
    norm_eps=1e-6,
    key_format="mxfp4",
    rotate=True,
    invalid_count=None,
    check_indices=False,
):
    """One compressor call for a decode batch (see hdk::dsv4::CompressorParams). d = 512 writes
    MODEL1 entries; d = 128 (the CSA indexer's compressor) writes indexer keys in ``key_format``
    (``"mxfp4"``, ``"nvfp4"`` or ``"fp8"``, pages of ``KEY_BYTES[key_format]`` bytes a key),
    rotated when ``rotate``."""
    run_op(
        torch.ops.hdk.dsv4_compress,
        kv,
        score,
        ape,
        positions,
        state_slots,
        state,
        norm_weight,
        rope_cos,
        rope_sin,
        block_table,
        cache,
        int(block_size),
        int(ratio),
        float(norm_eps),
        _key_format(key_format),
        bool(rotate),
        invalid_count,
        bool(check_indices),
    )
    return cache


_COMPRESS_TENSORS = (
    "kv",
    "score",
    "ape",
    "positions",
    "state_slots",
    "state",
    "norm_weight",
    "rope_cos",
    "rope_sin",
    "block_table",
    "cache",
)
_COMPRESS_OPTIONS = ("norm_eps", "key_format", "rotate")


def _compress_arguments(call, which, operation="hdk.dsv4.compress_pair"):
    """One call's arguments of dsv4_compress_pair (or dsv4_store_and_compress) from a dict of
    :func:`compress`'s."""
    known = set(_COMPRESS_TENSORS) | {"block_size", "ratio"} | set(_COMPRESS_OPTIONS)
    unknown = sorted(set(call) - known)
    missing = [name for name in _COMPRESS_TENSORS + ("block_size", "ratio") if name not in call]
    if unknown or missing:
        raise HdkError(
            f"{operation}: the {which} call "
            + (f"has unknown arguments {unknown}" if unknown else f"misses {missing}")
            + f"; each call is a dict of compress's arguments {list(_COMPRESS_TENSORS)}, "
            "block_size, ratio and optionally norm_eps, key_format, rotate"
        )
    return [call[name] for name in _COMPRESS_TENSORS] + [
        int(call["block_size"]),
        int(call["ratio"]),
        float(call.get("norm_eps", 1e-6)),
        _key_format(call.get("key_format", "mxfp4")),
        bool(call.get("rotate", True)),
    ]


def compress_pair(first, second, *, invalid_count=None, check_indices=False):
    """Two compressor calls in one launch, such as a CSA layer's main (d = 512) and indexer
    (d = 128) compressors (hdk::dsv4::compress with two calls). ``first`` and ``second`` are dicts
    of :func:`compress`'s arguments by name (``kv``, ``score``, ``ape``, ``positions``,
    ``state_slots``, ``state``, ``norm_weight``, ``rope_cos``, ``rope_sin``, ``block_table``,
    ``cache``, ``block_size``, ``ratio`` and optionally ``norm_eps``, ``key_format``,
    ``rotate``); ``invalid_count`` and ``check_indices`` serve both. The same bytes as
    ``compress(**first)`` then ``compress(**second)``; neither call may write what the other
    reads or writes. Returns both caches."""
    run_op(
        torch.ops.hdk.dsv4_compress_pair,
        *_compress_arguments(first, "first"),
        *_compress_arguments(second, "second"),
        invalid_count,
        bool(check_indices),
    )
    return first["cache"], second["cache"]


_STORE_ARGUMENTS = ("values", "slots", "cache", "block_size")


def store_and_compress(store, first, second=None, *, invalid_count=None, check_indices=False):
    """A CSA or HCA layer's cache writes of one decode step in one launch
    (hdk::dsv4::store_and_compress): the step's SWA entries (``store``, a dict of
    :func:`store_entries`' ``values``, ``slots``, ``cache``, ``block_size``) with the layer's
    compressor calls (``first``, and for a CSA layer ``second``: dicts of :func:`compress`'s
    arguments by name, as :func:`compress_pair` takes them); ``invalid_count`` and
    ``check_indices`` serve every call. The same bytes and counts as ``store_entries(**store)``
    then the compress calls, without the store's launch. No call may write what another reads or
    writes, so the SWA ring is a tensor apart from the compressed pools. Returns the SWA cache and
    the compressors' caches."""
    operation = "hdk.dsv4.store_and_compress"
    unknown = sorted(set(store) - set(_STORE_ARGUMENTS))
    missing = [name for name in _STORE_ARGUMENTS if name not in store]
    if unknown or missing:
        raise HdkError(
            f"{operation}: the store "
            + (f"has unknown arguments {unknown}" if unknown else f"misses {missing}")
            + f"; the store is a dict of store_entries' arguments {list(_STORE_ARGUMENTS)}"
        )
    store_arguments = [store["values"], store["slots"], store["cache"], int(store["block_size"])]
    if second is None:
        run_op(
            torch.ops.hdk.dsv4_store_and_compress,
            *store_arguments,
            *_compress_arguments(first, "compressor", operation),
            invalid_count,
            bool(check_indices),
        )
        return store["cache"], first["cache"]
    run_op(
        torch.ops.hdk.dsv4_store_and_compress_pair,
        *store_arguments,
        *_compress_arguments(first, "first compressor", operation),
        *_compress_arguments(second, "second compressor", operation),
        invalid_count,
        bool(check_indices),
    )
    return store["cache"], first["cache"], second["cache"]


def quantize_indexer_query(q, rotate=True, q_packed=None, q_scales=None, invalid_count=None):
    r"""The indexer's q as DeepSeek-V4's reference indexer quantizes it
    (hdk::dsv4::quantize_indexer_query): each ``[n, h]`` vector, rotated by
    :func:`hadamard_matrix` when ``rotate``, becomes exactly the bytes :func:`store_indexer_keys`
    writes for an ``"mxfp4"`` key: 64 bytes of packed E2M1 codes (dim ``2i`` in the low nibble
    of byte ``i``) into ``q_packed[n, h]`` and 4 UE8M0 scales (one per 32 dims) into
    ``q_scales[n, h]``. A vector holding a NaN or infinity is stored with MXFP4's NaN markers
    (scale 0xFF, codes 0, in every group it reaches) and counted. Writes in place, allocates
    only what it returns, never synchronizes (capturable in a CUDA graph).

    Args:
        q: ``[N, H, 128]`` bf16/fp32 (last dim contiguous).
        rotate: apply H_128 / sqrt(128) first (as the keys were stored).
        q_packed: ``[N, H, 64]`` uint8 output (last dim contiguous); None: allocated.
        q_scales: ``[N, H, 4]`` uint8 output (last dim contiguous); None: allocated.
        invalid_count: ``[1]`` int32/int64 counter; +1 per non-finite vector. hdk adds, never
            clears.

    Returns:
        ``(q_packed, q_scales)``.

    Raises:
        HdkError: with hdk's message naming the bad argument (nothing is written then).
        TypeError: when a tensor argument is not a torch.Tensor.
    """
    _check_tensors(
        "quantize_indexer_query",
        (
            ("q", q),
            ("q_packed", q_packed),
            ("q_scales", q_scales),
            ("invalid_count", invalid_count),
        ),
    )
    if q is None:
        raise HdkError(
            "hdk::dsv4::quantize_indexer_query: argument 'q' is required ([N, H, 128] bf16 or "
            "fp32), but was not given"
        )
    # Outputs are allocated only for a q of the right rank (else hdk's message names q).
    lead = tuple(q.shape[:2]) if q.dim() == 3 else (0, 0)
    if q_packed is None:
        q_packed = torch.empty((*lead, 64), dtype=torch.uint8, device=q.device)
    if q_scales is None:
        q_scales = torch.empty((*lead, 4), dtype=torch.uint8, device=q.device)
    run_op(
        torch.ops.hdk.dsv4_quantize_indexer_query,
        q,
        q_packed,
        q_scales,
        bool(rotate),
        invalid_count,
    )
    return q_packed, q_scales


def blocks_to_reserve(ratio, block_size, position_before, position_after):
    """Blocks a request needs before a step takes it from position_before to position_after."""
    return int(
        run_op(
            torch.ops.hdk.dsv4_blocks_to_reserve,
            int(ratio),
            int(block_size),
            int(position_before),
            int(position_after),
        )
    )


def compressor_accumulators(ratio):
    return 3 if int(ratio) == 4 else 1


# ------------------------------------------------------------------------------------------
# Read side (docs/dsv4-attention.md): the indexer's score + top-k and sparse attention decode,
# over torch.ops.hdk.dsv4_index_topk / dsv4_sparse_decode with the C++ field names. Each writes
# its outputs in place, allocates only what it returns, never synchronizes.


def _check_tensors(operation, arguments):
    for name, value in arguments:
        if value is not None and not isinstance(value, torch.Tensor):
            raise TypeError(
                f"hdk.dsv4.{operation}: argument '{name}' must be a torch.Tensor or None, "
                f"got {type(value).__name__}"
            )


def _device(device):
    """torch.device of ``device``; a CUDA device without an index is the current one."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def index_topk_workspace_bytes(num_rows, max_entries, device):
    """Bytes of the workspace :func:`index_topk` may use for up to ``num_rows`` rows of up to
    ``max_entries`` entries (``max_blocks * block_size``) on ``device``: 0 on the CPU and where
    CUDA would not use one. Pure (reads only the device's SM count); grows with both arguments."""
    return int(
        run_op(
            torch.ops.hdk.dsv4_index_topk_workspace_bytes,
            int(num_rows),
            int(max_entries),
            _device(device),
        )
    )


def sparse_decode_workspace_bytes(num_rows, num_heads, list_length, device):
    """Bytes of the workspace :func:`sparse_decode` may use for up to ``num_rows`` query rows of
    ``num_heads`` heads over lists of up to ``list_length`` entries (both lists together) on
    ``device``: 0 on the CPU and where CUDA would not use one. Pure; grows with every argument."""
    return int(
        run_op(
            torch.ops.hdk.dsv4_sparse_decode_workspace_bytes,
            int(num_rows),
            int(num_heads),
            int(list_length),
            _device(device),
        )
    )


def _workspace(size, device):
    """A workspace of ``size()`` bytes from torch's caching allocator for a CUDA call (also
    under graph capture, where it comes from the graph's pool), None on the CPU or when the
    call needs none. ``size`` is only called on CUDA, after the arguments' shapes were found
    usable; hdk's validation reports any other mistake."""
    if device.type != "cuda":
        return None
    try:
        bytes_needed = size()
    except (AttributeError, IndexError, TypeError, HdkError):
        return None  # malformed arguments or no CUDA backend: the call itself says so
    if bytes_needed <= 0:
        return None
    return torch.empty(bytes_needed, dtype=torch.uint8, device=device)


# torch.float8_e4m3fn where torch has it (2.1 and later): index_topk passes such a q as its
# uint8 codes.
_FLOAT8_E4M3 = getattr(torch, "float8_e4m3fn", None)


def index_topk(
    q,
    weights,
    key_cache,
    block_size,
    block_table,
    num_entries,
    top_k,
    *,
    format="mxfp4",
    q_scales=None,
    topk_indices=None,
    topk_scores=None,
    return_scores=True,
    topk_slots=None,
    invalid_count=None,
    workspace=None,
):
    r"""The indexer's top-k for N query rows (hdk::dsv4::index_topk)::

        score[n, s] = sum_h relu(q[n, h] . K[s]) * weights[n, h]      for s < num_entries[n]

    with K[s] the row's compressed entry s, decoded straight from the key pages (entry s of
    row n is at slot ``block_table[n, s // block_size] * block_size + s % block_size``).

    q comes in one of three forms, each with its key formats:

    - exact: ``[N, H, 128]`` bf16/fp32, with ``format="mxfp4"`` or ``"nvfp4"``;
    - E4M3: ``[N, H, 128]`` ``torch.float8_e4m3fn`` (where torch has it) or uint8 E4M3 codes,
      with ``format="fp8"``: DeepGEMM's ``fp8_paged_mqa_logits`` form, q without a scale of its
      own (fold it into ``weights``), K[s] = E4M3 code x the key's fp32 scale;
    - packed MXFP4: ``[N, H, 64]`` uint8 E2M1 codes (dim 2i in the low nibble of byte i) with
      ``q_scales`` ``[N, H, 4]`` uint8 UE8M0 (one per 32 dims), with ``format="mxfp4"``: what
      :func:`quantize_indexer_query` returns. Each 32-dim group's term
      ``2^(qs + ks - 254) x (E2M1 dot)`` is exact in fp32.

    Args:
        q: the query in one of the forms above (last dim contiguous), already rotated like the
            stored keys (H = 64).
        weights: ``[N, H]`` fp32, already scaled.
        key_cache: ``[num_blocks, block_size * KEY_BYTES[format]]`` uint8 pages written by
            :func:`store_indexer_keys` or :func:`compress`.
        block_size: entries per page.
        block_table: ``[N, max_blocks]`` int32, the pages of each row's request.
        num_entries: ``[N]`` int32/int64, the compressed entries each row may see.
        top_k: 1..2048; more than ``num_entries[n]`` pads the row.

    Keyword Args:
        format: ``"mxfp4"`` (68 B per key), ``"nvfp4"`` (72 B) or ``"fp8"`` (132 B).
        q_scales: ``[N, H, 4]`` uint8 UE8M0 scales of a packed MXFP4 q; None for the other forms.
        topk_indices: ``[N, top_k]`` int32 output (entry ordinals, best first, ties to the lower
            ordinal, -1 as padding); None: allocated.
        topk_scores: ``[N, top_k]`` fp32 output (-inf as padding); None: allocated when
            ``return_scores``, else not computed.
        topk_slots: optional ``[N, top_k]`` int32 output, written in place: the flat slot of
            each selected entry through ``block_table`` (-1 as padding), i.e. sparse_decode's
            ``indices`` for a pool sharing the key cache's block table and block size (the CSA
            compressed pool of :class:`KVCacheManager`).
        invalid_count: ``[1]`` int32/int64 counter; +1 per row whose q or weights hold a NaN or
            infinity (an E4M3 NaN code 0x7F / 0xFF, a q_scales byte 0xFF), which gets only
            padding. hdk adds, never clears.
        workspace: optional 1-D uint8 tensor on the call's device, 256-byte aligned, of at least
            :func:`index_topk_workspace_bytes` ``(N, max_blocks * block_size, device)`` bytes,
            sharing no memory with the other arguments: allocate one for the largest call and
            pass it to every call (calls sharing it run in stream order). None: on CUDA one is
            taken from torch's caching allocator for this call; the CPU uses none. The results
            are the same with any workspace; its contents before and after do not matter.

    Returns:
        ``(topk_indices, topk_scores)`` (``topk_scores`` None when not asked for).

    Raises:
        HdkError: with hdk's message naming the bad argument.
        TypeError: when a tensor argument is not a torch.Tensor.
    """
    _check_tensors(
        "index_topk",
        (
            ("q", q),
            ("q_scales", q_scales),
            ("weights", weights),
            ("key_cache", key_cache),
            ("block_table", block_table),
            ("num_entries", num_entries),
            ("topk_indices", topk_indices),
            ("topk_scores", topk_scores),
            ("topk_slots", topk_slots),
            ("invalid_count", invalid_count),
            ("workspace", workspace),
        ),
    )
    rows = q.shape[0] if q is not None and q.dim() >= 1 else 0
    device = q.device if q is not None else key_cache.device
    if workspace is None:
        workspace = _workspace(
            lambda: index_topk_workspace_bytes(
                rows, block_table.shape[1] * int(block_size), device
            ),
            device,
        )
    # An out-of-range top_k gets hdk's message, not an allocation failure.
    columns = int(top_k) if 0 <= int(top_k) <= 2048 else 0
    if topk_indices is None:
        topk_indices = torch.empty((rows, columns), dtype=torch.int32, device=device)
    if topk_scores is None and return_scores:
        topk_scores = torch.empty((rows, columns), dtype=torch.float32, device=device)
    if q is not None and _FLOAT8_E4M3 is not None and q.dtype == _FLOAT8_E4M3:
        q = q.view(torch.uint8)
    run_op(
        torch.ops.hdk.dsv4_index_topk,
        q,
        weights,
        key_cache,
        int(block_size),
        _key_format(format),
        block_table,
        num_entries,
        int(top_k),
        topk_indices,
        topk_scores,
        topk_slots,
        invalid_count,
        workspace,
        q_scales,
    )
    return topk_indices, topk_scores


def sparse_decode(
    q,
    cache,
    block_size,
    indices,
    *,
    extra_cache=None,
    extra_block_size=0,
    extra_indices=None,
    sink=None,
    scale=0.0,
    out=None,
    lse=None,
    return_lse=True,
    lse_includes_sink=True,
    invalid_count=None,
    workspace=None,
):
    r"""Sparse MQA attention decode with a per-head sink (hdk::dsv4::sparse_decode). For query
    n and head h, over the slots j of ``indices[n]`` that are not negative::

        s_j   = scale * q[n, h] . E[j]         E[j]: the decoded 512-value MODEL1 entry (K = V)
        o_h   = sum_j e^{s_j} E[j] / (sum_j e^{s_j} + e^{sink_h})
        lse_h = log(sum_j e^{s_j} + e^{sink_h})   (no sink term without a sink)

    Args:
        q: ``[N, Hq, 512]`` bf16/fp32 (Hq = 64 Flash, 128 Pro).
        cache: ``[num_blocks, block_size * 584]`` uint8 MODEL1 pages (SWA ring and compressed
            entries in one tensor) written by :func:`store_entries` or :func:`compress`.
        block_size: entries per page.
        indices: ``[N, L]`` int32/int64 flat slots ``block * block_size + offset``; negative:
            skipped.

    Keyword Args:
        extra_cache, extra_block_size, extra_indices: an optional second list (both tensors or
            neither) over a second MODEL1 tensor, e.g. the SWA rings kept apart from the
            compressed pool (as :class:`KVCacheManager` keeps them): ``extra_indices`` ``[N, L2]``
            holds slots ``block * extra_block_size + offset`` of ``extra_cache``. One softmax
            runs over both lists.
        sink: ``[Hq]`` fp32 sink logits (denominator only), or None.
        scale: softmax scale; 0 means ``512 ** -0.5``.
        out: ``[N, Hq, 512]`` bf16/fp32 output; None: allocated with q's dtype.
        lse: ``[N, Hq]`` fp32 output; None: allocated when ``return_lse``, else not computed.
            A row with an empty list gets ``o = 0`` and ``lse = sink`` (-inf without a sink).
        lse_includes_sink: False leaves the sink out of ``lse`` (``log(sum_j e^{s_j})``, -inf
            for an empty list), FlashMLA's convention; ``out`` is the same either way.
        invalid_count: ``[1]`` int32/int64 counter; +1 per row whose q holds a NaN or infinity
            or whose result is NaN (the row gets o = 0, lse = NaN). hdk adds, never clears.
        workspace: optional 1-D uint8 tensor on the call's device, 256-byte aligned, of at least
            :func:`sparse_decode_workspace_bytes` ``(N, Hq, L + L2, device)`` bytes, sharing no
            memory with the other arguments; None: on CUDA one is taken from torch's caching
            allocator for this call, the CPU uses none (as for :func:`index_topk`).

    Returns:
        ``(out, lse)`` (``lse`` None when not asked for).

    Raises:
        HdkError: with hdk's message naming the bad argument.
        TypeError: when a tensor argument is not a torch.Tensor.
    """
    _check_tensors(
        "sparse_decode",
        (
            ("q", q),
            ("cache", cache),
            ("indices", indices),
            ("extra_cache", extra_cache),
            ("extra_indices", extra_indices),
            ("sink", sink),
            ("out", out),
            ("lse", lse),
            ("invalid_count", invalid_count),
            ("workspace", workspace),
        ),
    )
    device = q.device if q is not None else cache.device
    if workspace is None:
        workspace = _workspace(
            lambda: sparse_decode_workspace_bytes(
                q.shape[0],
                q.shape[1],
                indices.shape[1] + (extra_indices.shape[1] if extra_indices is not None else 0),
                device,
            ),
            device,
        )
    if out is None:
        dtype = q.dtype if q is not None and q.dtype == torch.float32 else torch.bfloat16
        shape = tuple(q.shape) if q is not None else (0, 0, 512)
        out = torch.empty(shape, dtype=dtype, device=device)
    if lse is None and return_lse:
        shape = tuple(q.shape[:2]) if q is not None and q.dim() >= 2 else (0, 0)
        lse = torch.empty(shape, dtype=torch.float32, device=device)
    run_op(
        torch.ops.hdk.dsv4_sparse_decode,
        q,
        cache,
        int(block_size),
        indices,
        extra_cache,
        int(extra_block_size),
        extra_indices,
        sink,
        float(scale),
        out,
        lse,
        bool(lse_includes_sink),
        invalid_count,
        workspace,
    )
    return out, lse
