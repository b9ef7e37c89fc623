// DeepSeek-V4 decode, read side: the indexer's score + top-k over the FP4 indexer keys (CSA
// layers), and sparse MQA attention with a per-head sink over MODEL1 entries (the SWA ring plus
// the selected or all compressed entries). The math is docs/spec.md's "Indexer" and "Sparse
// attention decode"; the contract case by case and how an engine calls these
// within a decode step: docs/dsv4-attention.md.
//
// Both read the quantized pages the write side (hdk/dsv4/kv_cache.h) stored, straight from the
// paged pools: no dequantized copy of a cache is made. Every call runs on the device its tensors
// live on. Both have a CPU and a CUDA backend; on CUDA they allocate nothing, do not synchronize
// (unless check_indices asks) and can be captured in a CUDA graph.
//
// Both take an optional `workspace` that the caller allocates once (its size from
// index_topk_workspace_bytes / sparse_decode_workspace_bytes for the largest call it will make)
// and passes to every call and layer. With it, CUDA spreads a few rows over every SM: their
// partial results go to the workspace and a second kernel finishes them. Without it a row's work
// stays in one thread-block cluster. The results are the same either way; the workspace's
// contents before a call do not matter and after it are unspecified, so calls sharing one
// workspace must be ordered on one stream. The CPU backend ignores it.
#pragma once

#include <cstdint>

#include "hdk/cuda_stream.h"
#include "hdk/device.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/tensor_view.h"
#include "hdk/topk.h"

namespace hdk {
namespace dsv4 {

constexpr int64_t kIndexerHeads = 64;  // indexer query heads of Flash and Pro (any H is accepted)

// ---- Indexer: score + top-k -----------------------------------------------------------------
//   score[n, s] = sum_h relu(q[n, h] · K[s]) * weights[n, h]      for s < num_entries[n]
// with K[s] the key of the row's compressed entry s, dequantized from the key cache (in the
// rotated basis the keys were stored in: q must be rotated the same way). Entry s of row n lives
// at flat slot block_table[n, s / block_size] * block_size + s % block_size.
//
// q comes in one of three forms, each for its key formats:
//  - exact: bf16 or fp32 [N, H, 128], keys kMXFP4 or kNVFP4;
//  - E4M3: uint8 [N, H, 128] FP8 E4M3 codes, keys kFP8 (DeepGEMM's fp8_paged_mqa_logits form:
//    q has no scale of its own, the caller folds it into weights); K[s] = E4M3 codes x the key's
//    fp32 scale;
//  - MXFP4: uint8 [N, H, 64] packed E2M1 (dim 2i in the low nibble of byte i) with q_scales
//    [N, H, 4] UE8M0 (one per 32 dims), keys kMXFP4: DeepSeek-V4's reference indexer, which
//    quantizes the rotated q as it does the keys (quantize_indexer_query below). Every score is
//    then exact per 32-dim group: sum_g 2^(qs_g + ks_g - 254) x (the group's E2M1 dot product).
struct IndexerParams {
  // [N, H, 128] bf16 / fp32 / uint8 E4M3, or [N, H, 64] uint8 packed E2M1 (with q_scales); H = 64
  // for Flash and Pro; last dim contiguous
  TensorView q;
  TensorView q_scales;   // [N, H, 4] uint8 UE8M0, last dim contiguous: only with packed E2M1 q
  TensorView weights;    // [N, H] fp32, already scaled (128^-0.5 * 64^-0.5 folded in)
  TensorView key_cache;  // [num_blocks, block_size * key_bytes(format)] uint8, last dim contiguous
  int64_t block_size = 0;
  KeyFormat format = KeyFormat::kMXFP4;
  TensorView block_table;  // [N, max_blocks] int32: the pages of the row's request
  TensorView num_entries;  // [N] int32/int64: compressed entries the row may see
  int64_t top_k = 0;       // 1 .. kMaxTopK (2048); more than num_entries is allowed (padding)
  // [N, top_k] int32, last dim contiguous: entry ordinals s, best first, ties to the lower s;
  // -1 beyond min(top_k, num_entries[n]).
  TensorView topk_indices;
  // Optional [N, top_k] fp32, last dim contiguous: the scores of topk_indices, -inf for padding.
  TensorView topk_scores;
  // Optional [N, top_k] int32, last dim contiguous: the flat slot of each selected entry,
  // block_table[n, s / block_size] * block_size + s % block_size, -1 for padding. A pool that
  // shares the key cache's block table and block size (the CSA compressed pool of
  // hdk.dsv4.KVCacheManager) holds entry s there, so this is sparse_decode's `indices` for the
  // selected entries with no gather in between.
  TensorView topk_slots;
  // Optional [1] or scalar int32/int64 counter; hdk adds, never clears. +1 per row whose q or
  // weights hold a NaN or infinity: such a row gets only padding (-1, -inf). A key stored with
  // NaN markers scores NaN and ranks below every number (as in hdk::topk); it is not counted.
  TensorView invalid_count;
  // Optional 1-D contiguous uint8 device memory of at least
  // index_topk_workspace_bytes(N, max_blocks * block_size, device) bytes, 256-byte aligned, on
  // the tensors' device, sharing no bytes with any other argument. Too small: hdk::Error before
  // anything runs.
  TensorView workspace;
};

// The workspace index_topk may use for up to `num_rows` rows of up to `max_entries` entries
// (max_blocks * block_size) on `device`: 0 on the CPU and where CUDA would not use one. Pure
// (reads only the device's SM count); the size grows with both arguments.
int64_t index_topk_workspace_bytes(int64_t num_rows, int64_t max_entries, const Device& device);

// The CPU throws hdk::Error before writing anything for num_entries[n] outside
// 0 .. max_blocks * block_size and for a block id of a used page outside the key cache. CUDA
// (which would have to synchronize for that check) gives such a row only padding and counts it
// in invalid_count instead.
void index_topk(const IndexerParams& params);
void index_topk(const IndexerParams& params, CudaStream stream);

// ---- The indexer's quantized query -----------------------------------------------------------
// Each [n, h] vector of q, rotated by H_128 / sqrt(128) (Sylvester order) when `rotate`, becomes
// exactly the bytes store_indexer_keys writes for a kMXFP4 key: 64 bytes of E2M1 codes into
// q_packed[n, h] and 4 UE8M0 scales into q_scales[n, h]. A vector holding a NaN or infinity is
// stored with the key format's NaN markers (its scores are NaN, ranked last) and counted.
struct QuantizeIndexerQueryParams {
  TensorView q;         // [N, H, 128] bf16 or fp32, last dim contiguous
  TensorView q_packed;  // [N, H, 64] uint8, last dim contiguous
  TensorView q_scales;  // [N, H, 4] uint8, last dim contiguous
  bool rotate = true;
  TensorView invalid_count;  // optional [1] or scalar int32/int64 counter: +1 per non-finite vector
};

void quantize_indexer_query(const QuantizeIndexerQueryParams& params);
void quantize_indexer_query(const QuantizeIndexerQueryParams& params, CudaStream stream);

// ---- Sparse attention decode ----------------------------------------------------------------
// For query n and head h, over the list j of indices[n, :] that are not negative:
//   s_j  = scale * q[n, h] · E[j]          E[j]: the dequantized 512-value entry (K = V = E)
//   o_h  = sum_j e^{s_j} E[j] / (sum_j e^{s_j} + e^{sink_h})
//   lse_h = log(sum_j e^{s_j} + e^{sink_h})     (the sink term left out when no sink is given)
// The list is `indices` over `cache`, followed by the optional `extra_indices` over `extra_cache`,
// and one softmax runs over both. An engine that keeps the SWA rings and the compressed pool in
// one MODEL1 tensor concatenates their slots into `indices`; one that keeps them apart (as
// hdk.dsv4.KVCacheManager does, and as FlashMLA's extra_k_cache allows) passes the compressed
// pool and its slots as cache/indices and the SWA rings and their slots as the extra pair. The
// order of the entries changes nothing but rounding.
struct SparseDecodeParams {
  TensorView q;      // [N, Hq, 512] bf16 or fp32 (Hq = 64 Flash, 128 Pro), last dim contiguous
  TensorView cache;  // [num_blocks, block_size * 584] uint8 MODEL1 pages, last dim contiguous
  int64_t block_size = 0;
  TensorView indices;  // [N, L] int32/int64 flat slots (block * block_size + offset); < 0: skip
  // Optional second list, both given or neither: extra_cache [extra_num_blocks,
  // extra_block_size * 584] uint8 MODEL1 pages and extra_indices [N, L2] int32/int64 flat slots
  // of it (block * extra_block_size + offset); < 0: skip. May be the same tensor as `cache`.
  TensorView extra_cache;
  int64_t extra_block_size = 0;
  TensorView extra_indices;
  TensorView sink;     // optional [Hq] fp32: the per-head sink logit (denominator only)
  float scale = 0.0f;  // softmax scale; 0 means 512^-0.5
  TensorView out;      // [N, Hq, 512] bf16 or fp32, last dim contiguous
  // Optional [N, Hq] fp32: lse_h as above, natural log. A row whose list is empty gets o = 0 and
  // lse = sink_h (-inf without a sink).
  TensorView lse;
  // false: lse_h = log(sum_j e^{s_j}) with the sink left out even when one is given (FlashMLA's
  // convention: the sink scales o, not lse; an empty list then gets lse = -inf). o is the same.
  bool lse_includes_sink = true;
  // Optional [1] or scalar int32/int64 counter; hdk adds, never clears. +1 per query row whose q
  // holds a NaN or infinity, or whose result is NaN (an entry stored with NaN markers, a NaN
  // sink): the row gets o = 0 and lse = NaN, never a plausible value. On CUDA, also +1 per query
  // row naming a slot at or beyond its cache (o = 0, lse = NaN; the CPU throws instead).
  TensorView invalid_count;
  // Debug option for CUDA tensors: copy the indices to the host first (a synchronization) and
  // throw hdk::Error for one at or beyond the cache, as the CPU does. Never inside CUDA-graph
  // capture.
  bool check_indices = false;
  // Optional 1-D contiguous uint8 device memory of at least
  // sparse_decode_workspace_bytes(N, Hq, L + L2, device) bytes, 256-byte aligned, on the tensors'
  // device, sharing no bytes with any other argument. Too small: hdk::Error before anything runs.
  TensorView workspace;
};

// The workspace sparse_decode may use for up to `num_rows` query rows of `num_heads` heads over
// lists of up to `list_length` entries (both lists together) on `device`: 0 on the CPU and where
// CUDA would not use one. Pure (reads only the device's SM count); it grows with every argument
// and stays within one SM count's worth of 64-head partial results (17.4 MB on 132 SMs).
int64_t sparse_decode_workspace_bytes(int64_t num_rows, int64_t num_heads, int64_t list_length,
                                      const Device& device);

// The CPU throws hdk::Error before writing anything for an index at or beyond its cache's
// num_blocks * block_size slots; CUDA treats that row as invalid (see invalid_count) unless
// check_indices asks for the CPU's check.
void sparse_decode(const SparseDecodeParams& params);
void sparse_decode(const SparseDecodeParams& params, CudaStream stream);

}  // namespace dsv4
}  // namespace hdk
