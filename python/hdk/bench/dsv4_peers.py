"""The DeepSeek-V4 peers of hdk's read side, called as the engines call them, over the same bytes
as hdk (bench/dsv4_vs_peers.py):

* FlashMLA's sparse FP8 decode, ``flash_mla.flash_mla_with_kvcache``, in the form of vLLM's
  DeepSeek-V4 FlashMLA backend (vllm-project/vllm, ``vllm/models/deepseek_v4/nvidia/flashmla.py``,
  ``DeepseekV4FlashMLAAttention._forward_decode``): the SWA ring is the main cache
  (``k_cache`` / ``indices`` / ``topk_length``), the compressed pool the extra cache
  (``extra_k_cache`` / ``extra_indices_in_kvcache`` / ``extra_topk_length``; CSA: the indexer's
  top-k as global slots, HCA: every compressed entry, built at metadata time), ``attn_sink``,
  ``is_fp8_kvcache=True``, q ``[tokens, 1, heads, 512]``. SGLang's DeepSeek-V4 backend
  (sgl-project/sglang, ``python/sglang/srt/layers/attention/deepseek_v4_backend.py``) makes the
  same call.
* DeepGEMM's paged MQA logits, ``deep_gemm.fp8_paged_mqa_logits`` after
  ``deep_gemm.get_paged_mqa_logits_metadata``, in the form of vLLM's sparse-attention indexer
  (vllm-project/vllm, ``vllm/model_executor/layers/sparse_attn_indexer.py``, decode branch of
  ``sparse_attn_indexer``): q E4M3 ``[batch, next_n, 64, 128]`` with its per-(token, head)
  power-of-two scale folded into ``weights`` (``fused_indexer_q_rope_quant`` in the same file),
  ``context_lens`` ``[batch, next_n]`` int32, ``clean_logits=False``, then a top-k over the
  logits rows (vLLM: its own ``cooperative_topk`` / ``persistent_topk`` CUDA ops; here
  ``torch.topk`` or ``hdk.topk``, whichever is faster).

The peers come from ``scripts/peers/dsv4.sh build`` (the git-ignored .peers/dsv4 payload, built
into ``$HDK_DSV4_PEERS_DIR``, default /tmp/hdk_dsv4_peers); never from hdk's tree. The views
and the query quantization below are plain torch and are tested on the CPU
(python/tests/test_bench_dsv4_peers.py).
"""

import os
import sys
from pathlib import Path

import torch

PEERS_DIR = "/tmp/hdk_dsv4_peers"  # scripts/peers/dsv4.sh's default build folder
ENTRY_BYTES = 584  # MODEL1: 448 FP8 + 64 bf16 at i * 576, then 8 scale bytes at bs * 576 + i * 8
FP8_KEY_BYTES = 132  # 128 E4M3 at i * 128, then an fp32 scale at bs * 128 + i * 4
INDEX_HEAD_DIM = 128
E4M3_MAX = 448.0


def peers_dir():
    return Path(os.environ.get("HDK_DSV4_PEERS_DIR") or PEERS_DIR)


def _import(name):
    """Imports `name` from the path, else from ``peers_dir()/site``; (module, None) or (None,
    why not)."""
    import importlib

    site = peers_dir() / "site"
    os.environ.setdefault("DG_JIT_CACHE_DIR", str(peers_dir() / "jit-cache"))
    if not os.environ.get("CUDA_HOME") and Path("/usr/local/cuda").is_dir():
        os.environ["CUDA_HOME"] = "/usr/local/cuda"  # DeepGEMM's JIT runs nvcc from there
    try:
        return importlib.import_module(name), None
    except ImportError as first:
        if site.is_dir() and str(site) not in sys.path:
            sys.path.insert(0, str(site))
            try:
                return importlib.import_module(name), None
            except Exception as error:  # a broken build is a report, not a crash
                return None, f"{name} from {site}: {type(error).__name__}: {error}"
        return None, (
            f"{name} is not importable ({first}); build it with `bash scripts/peers/dsv4.sh "
            f"build` (from .peers/dsv4, see the script's header) or set HDK_DSV4_PEERS_DIR"
        )
    except Exception as error:
        return None, f"{name}: {type(error).__name__}: {error}"


def load_flashmla():
    """(flash_mla module, None) or (None, why not)."""
    return _import("flash_mla")


def load_deepgemm():
    """(deep_gemm module, None) or (None, why not)."""
    return _import("deep_gemm")


def peer_pins():
    """The peers' pinned commits from the build's PINS file, {name: 'owner/repo commit'}."""
    pins = {}
    path = peers_dir() / "src" / "PINS"
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3:
                pins[parts[0]] = f"{parts[1]} {parts[2]}"
    return pins


# ---- The same bytes, the peers' views ---------------------------------------------------------


def flashmla_cache_view(pages, block_size):
    """hdk's MODEL1 pages ``[num_blocks, block_size * 584]`` uint8 as FlashMLA's ``k_cache``
    ``(num_blocks, block_size, 1, 584)``: the same memory, no copy.

    The bytes of a page are the same in both: FlashMLA's SM90 decode
    (``csrc/sm90/decode/sparse_fp8/splitkv_mla.cuh``, MODEL1 branch) reads entry i of a block at
    ``block * stride(0) + i * 576`` (448 E4M3, then 64 bf16 RoPE values) and its 8 UE8M0 scale
    bytes (7 used, one per 64 values, then a pad) at ``block * stride(0) + block_size * 576 +
    i * 8``, which is hdk's layout (docs/dsv4-kv-cache.md). FlashMLA needs ``stride(1) == 584``
    (checked in its ``sparse_decode.h``) and 16-byte-aligned blocks for its 128-bit loads: a
    block size that is a multiple of 2 gives that (584 * 2 = 73 * 16). vLLM pads each block to a
    multiple of 576 bytes; the kernel takes any block pitch, so hdk's unpadded pages are used
    as they are."""
    if pages.dim() != 2 or pages.shape[1] != block_size * ENTRY_BYTES:
        raise ValueError(
            f"MODEL1 pages must be [num_blocks, {block_size} * {ENTRY_BYTES}], got {tuple(pages.shape)}"
        )
    if pages.dtype != torch.uint8 or pages.stride(1) != 1:
        raise ValueError("MODEL1 pages must be uint8 with contiguous rows")
    return pages.as_strided(
        (pages.shape[0], block_size, 1, ENTRY_BYTES),
        (pages.stride(0), ENTRY_BYTES, ENTRY_BYTES, 1),
    )


def deepgemm_cache_view(pages, block_size):
    """hdk's FP8 key pages ``[num_blocks, block_size * 132]`` uint8 (``format="fp8"``) as
    DeepGEMM's ``fused_kv_cache`` ``[num_blocks, block_kv, 1, 132]`` uint8: the same memory.

    The shape is nominal: DeepGEMM (``csrc/apis/attention.hpp``, ``fp8_fp4_paged_mqa_logits``)
    reads a page as ``block_kv x 128`` E4M3 codes from its start, then ``block_kv`` fp32 scales
    at byte ``block_kv * 128`` (see :func:`deepgemm_codes_and_scales`), which is hdk's kFP8 page.
    It needs ``stride(1) == 132``, ``stride(3) == 1`` and a page pitch that is a multiple of 4
    (the TMA descriptors want 16: 64 * 132 = 8448 is); on Hopper block_kv must be 64."""
    if pages.dim() != 2 or pages.shape[1] != block_size * FP8_KEY_BYTES:
        raise ValueError(
            f"FP8 key pages must be [num_blocks, {block_size} * {FP8_KEY_BYTES}], "
            f"got {tuple(pages.shape)}"
        )
    if pages.dtype != torch.uint8 or pages.stride(1) != 1:
        raise ValueError("FP8 key pages must be uint8 with contiguous rows")
    return pages.as_strided(
        (pages.shape[0], block_size, 1, FP8_KEY_BYTES),
        (pages.stride(0), FP8_KEY_BYTES, FP8_KEY_BYTES, 1),
    )


def deepgemm_codes_and_scales(view):
    """DeepGEMM's split of a ``[num_blocks, block_kv, 1, 132]`` cache, as its
    ``fp8_fp4_paged_mqa_logits`` makes it with ``torch::from_blob``: codes ``[num_blocks,
    block_kv, 128]`` uint8 (E4M3 bit patterns) with strides ``(stride(0), 128, 1)``, scales
    ``[num_blocks, block_kv]`` fp32 from byte ``block_kv * 128`` with strides ``(stride(0) / 4,
    1)``. Views of the same memory (CPU or CUDA)."""
    num_blocks, block_kv = view.shape[0], view.shape[1]
    pitch = view.stride(0)
    if pitch % 4:
        raise ValueError(f"the page pitch must be a multiple of 4 bytes, got {pitch}")
    flat = view.as_strided((num_blocks, block_kv * FP8_KEY_BYTES), (pitch, 1))
    codes = flat.as_strided(
        (num_blocks, block_kv, INDEX_HEAD_DIM), (pitch, INDEX_HEAD_DIM, 1), flat.storage_offset()
    )
    scales = flat[:, block_kv * INDEX_HEAD_DIM :].view(torch.float32)
    return codes, scales


def decode_e4m3(codes):
    """E4M3 bit patterns (uint8) as fp32 values (NaN for 0x7F / 0xFF)."""
    if hasattr(torch, "float8_e4m3fn"):
        return codes.view(torch.float8_e4m3fn).float()
    sign = torch.where(codes >= 128, -1.0, 1.0)
    exponent = ((codes >> 3) & 0xF).float()
    mantissa = (codes & 0x7).float()
    value = torch.where(
        exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * torch.exp2(exponent - 7)
    )
    value = torch.where((codes & 0x7F) == 0x7F, torch.full_like(value, float("nan")), value)
    return sign * value


def deepgemm_keys(view):
    """The keys DeepGEMM scores against, ``[num_blocks, block_kv, 128]`` fp32: E4M3 code x the
    key's fp32 scale (its logits are ``sum_h relu(q_h . codes) * w_h * scale``, the same)."""
    codes, scales = deepgemm_codes_and_scales(view)
    return decode_e4m3(codes) * scales.unsqueeze(-1)


def lse_with_sink(softmax_lse, sink):
    """FlashMLA's ``softmax_lse`` ``[b, h_q, s_q]`` (the sink left out; +inf for an empty list)
    as hdk's lse ``[b * s_q, h_q]`` with the sink in: ``logaddexp(lse, sink)`` (an empty list:
    ``sink``)."""
    lse = softmax_lse.transpose(1, 2).reshape(-1, softmax_lse.shape[1]).float()
    lse = torch.where(torch.isinf(lse) & (lse > 0), torch.full_like(lse, float("-inf")), lse)
    if sink is None:
        return lse
    return torch.logaddexp(lse, sink.float().view(1, -1).expand_as(lse))


def quantize_q_e4m3(q, weights, softmax_scale=INDEX_HEAD_DIM**-0.5, head_scale=64**-0.5):
    """The indexer query as vLLM hands it to DeepGEMM (``fused_indexer_q_rope_quant`` in
    vllm/model_executor/layers/sparse_attn_indexer.py, without the RoPE, which the caller has
    applied): per (token, head) a power-of-two scale ``2^ceil(log2(max(amax, 1e-10) / 448))``,
    ``q / scale`` clamped to +-448 in E4M3, and that scale folded into the weights with the
    softmax and head scales. Returns ``(q_e4m3 [N, H, 128] float8_e4m3fn, weights [N, H]
    fp32)``."""
    q = q.float()
    amax = q.abs().amax(dim=-1, keepdim=True).clamp_min(1e-10)
    scale = torch.exp2(torch.ceil(torch.log2(amax / E4M3_MAX)))
    codes = (q / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return codes, weights.float() * scale.squeeze(-1) * softmax_scale * head_scale


# ---- The calls --------------------------------------------------------------------------------


class FlashMLASparseDecode:
    """One decode step of one attention layer through ``flash_mla_with_kvcache`` as vLLM calls
    it. ``ring`` ``[R, 128 * 584]`` holds the SWA windows (block size 128), ``ring_slots``
    ``[N, 128]`` each query's window; ``cache`` the compressed pool (block size
    ``block_size``), ``slots`` ``[N, L]`` each query's compressed entries (CSA: the top-k, HCA:
    all), -1 skipped. Lengths are passed as vLLM passes them (``topk_length`` = the window's,
    ``extra_topk_length`` = the list's), here every entry valid.

    The scheduler plan: vLLM makes one empty ``FlashMLASchedMeta`` per layer type (SWA-only,
    C4A, C128A) per step (``DeepseekSparseSWAMetadataBuilder.build_tile_scheduler`` in
    vllm/v1/attention/backends/mla/sparse_swa.py); the first layer of a type in a step runs
    FlashMLA's planner kernel (``get_decoding_sched_meta``) inside ``flash_mla_with_kvcache``,
    in the CUDA graph, and the type's other layers reuse its plan. ``call(fresh_plan=True)`` is
    that first layer (planner + decode + combine), ``fresh_plan=False`` a later one."""

    def __init__(self, flash_mla, q, ring, ring_slots, cache, block_size, slots, sink, scale):
        self.flash_mla = flash_mla
        self.q = q.unsqueeze(1)  # [N, s_q = 1, H, 512]
        self.k_cache = flashmla_cache_view(ring, ring.shape[1] // ENTRY_BYTES)
        self.indices = ring_slots.to(torch.int32).unsqueeze(1).contiguous()
        self.topk_length = torch.full(
            (q.shape[0],), ring_slots.shape[1], dtype=torch.int32, device=q.device
        )
        self.extra_k_cache = flashmla_cache_view(cache, block_size)
        self.extra_indices = slots.to(torch.int32).unsqueeze(1).contiguous()
        self.extra_topk_length = torch.full(
            (q.shape[0],), slots.shape[1], dtype=torch.int32, device=q.device
        )
        self.sink = sink
        self.scale = scale
        self.plan = None

    def call(self, fresh_plan=True):
        if fresh_plan or self.plan is None:
            plan = self.flash_mla.get_mla_metadata()[0]
            if not fresh_plan:
                self.plan = plan
        else:
            plan = self.plan
        return self.flash_mla.flash_mla_with_kvcache(
            q=self.q,
            k_cache=self.k_cache,
            block_table=None,
            cache_seqlens=None,
            head_dim_v=512,
            tile_scheduler_metadata=plan,
            softmax_scale=self.scale,
            is_fp8_kvcache=True,
            indices=self.indices,
            attn_sink=self.sink,
            extra_k_cache=self.extra_k_cache,
            extra_indices_in_kvcache=self.extra_indices,
            topk_length=self.topk_length,
            extra_topk_length=self.extra_topk_length,
        )


class DeepGEMMIndexer:
    """The indexer's decode step through DeepGEMM as vLLM calls it: ``q_e4m3`` ``[N, 64, 128]``
    (next_n = 1), ``weights`` ``[N, 64]`` fp32 with the q scale folded in, the FP8 key pages
    ``[num_blocks, 64 * 132]`` (read through :func:`deepgemm_cache_view`), ``block_table``
    ``[N, max_blocks]`` int32, every row ``entries`` keys long. ``schedule()`` is
    ``get_paged_mqa_logits_metadata`` (vLLM: once per step at metadata build, shared by every
    indexer layer), ``logits()`` the per-layer call. vLLM passes ``max_model_len`` as
    ``max_context_len`` (a longer logits row, its tail unwritten and not read by its top-k);
    here the rows' length."""

    def __init__(self, deep_gemm, q_e4m3, weights, pages, block_size, block_table, entries):
        self.deep_gemm = deep_gemm
        rows = q_e4m3.shape[0]
        self.q = q_e4m3.reshape(rows, 1, *q_e4m3.shape[1:]).contiguous()
        self.weights = weights.contiguous()
        self.kv = deepgemm_cache_view(pages, block_size)
        self.block_size = block_size
        self.block_table = block_table.to(torch.int32).contiguous()
        self.entries = int(entries)
        self.context_lens = torch.full(
            (rows, 1), self.entries, dtype=torch.int32, device=q_e4m3.device
        )
        self.num_sms = deep_gemm.get_num_sms()
        self.meta = self.schedule()

    def schedule(self):
        return self.deep_gemm.get_paged_mqa_logits_metadata(
            self.context_lens, self.block_size, self.num_sms
        )

    def logits(self):
        """``[N, entries]`` fp32 (a view of rows padded to 256 entries)."""
        return self.deep_gemm.fp8_paged_mqa_logits(
            self.q,
            self.kv,
            self.weights,
            self.context_lens,
            self.block_table,
            self.meta,
            self.entries,
            False,
        )
