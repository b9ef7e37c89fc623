// Step 1 of every index_topk kernel: a row's weights, queries and block ids to shared memory, the
// queries in the order its scoring kernel reads them (bf16 or fp32 mma fragments, E4M3 wgmma
// tiles, fp32 for CUDA cores), and the row's validity.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/bf16_pairs.h"
#include "core/cuda/wgmma.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/index_topk/cuda/index_key_loads.cuh"
#include "dsv4/index_topk/cuda/index_topk_device.cuh"
#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "dsv4/index_topk/index_mma_layout.h"
#include "dsv4/index_topk/index_wgmma_layout.h"
#include "dsv4/kv_cache/e4m3_bits.h"
#include "dsv4/kv_cache/kv_formats.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

// q[row, head, dim] as fp32 (exact for bf16 and E4M3; for MXFP4 the E2M1 value times its
// group's scale, exact unless below fp32's normal range).
template <QueryKind kQ>
__device__ __forceinline__ float query_value(const IndexerProblem& p, int64_t row, int64_t head,
                                             int dim) {
  const int64_t base = row * p.q.row_stride + head * p.q.head_stride;
  if constexpr (kQ == QueryKind::kFp32) {
    return static_cast<const float*>(p.q.data)[base + dim];
  } else if constexpr (kQ == QueryKind::kBf16) {
    return bf16_bits_value(static_cast<const uint16_t*>(p.q.data)[base + dim]);
  } else if constexpr (kQ == QueryKind::kE4M3) {
    return decode_e4m3(static_cast<const uint8_t*>(p.q.data)[base + dim]);
  } else {
    const uint8_t byte = static_cast<const uint8_t*>(p.q.data)[base + dim / 2];
    const uint8_t scale =
        p.q_scales[row * p.q_scales_row_stride + head * p.q_scales_head_stride + dim / 32];
    return decode_e2m1(static_cast<uint8_t>((byte >> (4 * (dim & 1))) & 0xf)) * decode_ue8m0(scale);
  }
}

// One 16-byte chunk of a q row (dims 8 c .. 8 c + 7) as it is stored: 4 words of bf16 pairs or
// 8 fp32 words; zero for heads past H.
template <bool kFp32Q>
struct QueryChunk {
  uint32_t words[kFp32Q ? 8 : 4];
};

template <bool kFp32Q>
__device__ __forceinline__ QueryChunk<kFp32Q> load_query_chunk(const IndexerProblem& p, int64_t row,
                                                               int head, int chunk, bool vector) {
  QueryChunk<kFp32Q> c{};
  if (head >= p.num_heads) return c;
  const int64_t offset = row * p.q.row_stride + head * p.q.head_stride + 8 * chunk;
  if constexpr (kFp32Q) {
    const float* q = static_cast<const float*>(p.q.data) + offset;
    if (vector) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(q));
      const uint4 b = __ldg(reinterpret_cast<const uint4*>(q) + 1);
      c = {{a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w}};
    } else {
#pragma unroll
      for (int d = 0; d < 8; ++d)
        c.words[d] = __float_as_uint(q[d]);
    }
  } else {
    const uint16_t* q = static_cast<const uint16_t*>(p.q.data) + offset;
    if (vector) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(q));
      c = {{a.x, a.y, a.z, a.w}};
    } else {
#pragma unroll
      for (int w = 0; w < 4; ++w)
        c.words[w] = q[2 * w] | static_cast<uint32_t>(q[2 * w + 1]) << 16;
    }
  }
  return c;
}

// The FP8 tensor-core kernel's queries: staged_heads / 64 tiles of 64 heads x 128 E4M3 codes in
// the k order of index_fp8_layout.h (E4M3 q as given; MXFP4 q as E4M3 codes of its values times
// 2^folded_query_exponent of its group), then, for MXFP4, [staged_heads][4] fp32 multipliers
// 2^(exponent - folded). Returns true when this thread saw a NaN code or scale; `remainder` when
// one of its multipliers is not 1.
template <QueryKind kQ>
__device__ bool stage_fp8_queries(const IndexerProblem& p, int64_t row, const IndexLaunch& launch,
                                  uint8_t* shared, bool& remainder) {
  bool bad = false;
  const uint8_t* q = static_cast<const uint8_t*>(p.q.data) + row * p.q.row_stride;
  const bool words = reinterpret_cast<uintptr_t>(q) % 4 == 0 && p.q.head_stride % 4 == 0;
  const int64_t chunks = launch.staged_heads * 8;
  for (int64_t chunk = threadIdx.x; chunk < chunks; chunk += kThreads) {
    const int head = static_cast<int>(chunk / 8), c = static_cast<int>(chunk % 8);
    uint32_t staged[4] = {0u, 0u, 0u, 0u};
    if (head < p.num_heads) {
      const uint8_t* qh = q + head * p.q.head_stride;
      uint32_t loaded[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int word =
            kQ == QueryKind::kE4M3 ? fp8_chunk_query_word(c, i) : mxfp4_chunk_query_word(c, i);
        if (words) {
          loaded[i] = *reinterpret_cast<const uint32_t*>(qh + 4 * word);
        } else {
          loaded[i] = qh[4 * word] | static_cast<uint32_t>(qh[4 * word + 1]) << 8 |
                      static_cast<uint32_t>(qh[4 * word + 2]) << 16 |
                      static_cast<uint32_t>(qh[4 * word + 3]) << 24;
        }
      }
      if constexpr (kQ == QueryKind::kE4M3) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          bad |= any_e4m3_nan(loaded[i]);
          staged[i] = loaded[i];
        }
      } else {
        const uint8_t scale =
            p.q_scales[row * p.q_scales_row_stride + head * p.q_scales_head_stride + c / 2];
        bad |= scale == kScaleNaN;
        const float folded = power_of_two(folded_query_exponent(static_cast<int>(scale) - 127));
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          // Code mxfp4_chunk_query_code(c, b) = 2 b + c % 2 of the word at bits 8 b .. 8 b + 3.
          const uint32_t codes = loaded[i] >> (4 * mxfp4_chunk_query_code(c, 0));
          auto code = [&](int b) { return static_cast<uint8_t>((codes >> (8 * b)) & 0xfu); };
          uint32_t packed = 0;
#pragma unroll
          for (int j = 0; j < 4; j += 2) {
            const float first = decode_e2m1(code(j));
            const float second = decode_e2m1(code(j + 1));
            // Exact: every E2M1 value times 2^-8 .. 2^6 is an E4M3 value.
            const uint32_t pair = __nv_cvt_float2_to_fp8x2(
                make_float2(first * folded, second * folded), __NV_SATFINITE, __NV_E4M3);
            packed |= pair << (8 * j);
          }
          staged[i] = packed;
        }
      }
    }
    *reinterpret_cast<uint4*>(shared + launch.q + fp8_query_chunk_offset(head, c)) =
        make_uint4(staged[0], staged[1], staged[2], staged[3]);
  }
  if constexpr (kQ == QueryKind::kMXFP4) {
    float* multipliers = reinterpret_cast<float*>(shared + launch.q + launch.staged_heads * 128);
    for (int64_t i = threadIdx.x; i < launch.staged_heads * 4; i += kThreads) {
      const int64_t head = i / 4;
      float multiplier = 1.0f;
      if (head < p.num_heads) {
        const int exponent =
            static_cast<int>(
                p.q_scales[row * p.q_scales_row_stride + head * p.q_scales_head_stride + i % 4]) -
            127;
        const int rest = exponent - folded_query_exponent(exponent);
        remainder |= rest != 0;
        // The rest is at most 2^121 or at least 2^-119 (a NaN byte marks the row bad instead).
        multiplier = power_of_two(rest);
      }
      multipliers[i] = multiplier;
    }
  }
  fence_shared_for_wgmma();  // the caller's barrier then covers every thread's writes
  return bad;
}

// Stages the row's queries; returns true when this thread saw a value that is not finite (or a
// NaN code or scale). `remainder`: see stage_fp8_queries.
template <ScoreKernel kScore, QueryKind kQ>
__device__ bool stage_queries(const IndexerProblem& p, int64_t row, const IndexLaunch& launch,
                              uint8_t* shared, bool& remainder) {
  constexpr bool kFp32Q = kQ == QueryKind::kFp32;
  bool bad = false;
  if constexpr (is_fp8_query(kQ) && kScore != ScoreKernel::kCudaCore) {
    bad = stage_fp8_queries<kQ>(p, row, launch, shared, remainder);
  } else if constexpr (kScore == ScoreKernel::kWarpgroup) {
    // The B tile from 16-byte chunks of the q rows, each stored as four bf16 pairs
    // (warpgroup_chunk_pair_k); heads past H are zero. Every load is issued before the first
    // store: a load does not pass a store to shared memory through a generic pointer, and when
    // each pair was stored before the next was loaded the staging took one memory round trip
    // per pair, 11 us of a row's fixed cost on an H100 (globaltimer probes, 2026-11-27).
    constexpr int kChunksPerHead = kIndexerKeyDim / 8;
    constexpr int kChunksPerThread = kWarpgroupHeads * kChunksPerHead / kThreads;
    static_assert(kWarpgroupHeads * kChunksPerHead % kThreads == 0, "whole rounds of chunks");
    constexpr int64_t kValuesPer16Bytes = kFp32Q ? 4 : 8;
    const bool vector = reinterpret_cast<uintptr_t>(p.q.data) % 16 == 0 &&
                        p.q.row_stride % kValuesPer16Bytes == 0 &&
                        p.q.head_stride % kValuesPer16Bytes == 0;
    QueryChunk<kFp32Q> chunks[kChunksPerThread];
    uint32_t nonfinite = 0;  // bf16 q: every pair's non-finite bits, tested once
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
      chunks[i] =
          load_query_chunk<kFp32Q>(p, row, chunk / kChunksPerHead, chunk % kChunksPerHead, vector);
    }
#pragma unroll
    for (int i = 0; i < kChunksPerThread; ++i) {
      const int chunk = static_cast<int>(threadIdx.x) + i * kThreads;
      const int head = chunk / kChunksPerHead;
      const uint32_t* w = chunks[i].words;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int offset =
            warpgroup_query_offset(head, warpgroup_chunk_pair_k(chunk % kChunksPerHead, j));
        uint32_t hi, lo = 0;
        if constexpr (kFp32Q) {
          uint32_t hi_bits[2], lo_bits[2];
          const float first = __uint_as_float(w[j]), second = __uint_as_float(w[j + 4]);
          bad |= !is_finite(first) || !is_finite(second);
          split_bf16(first, hi_bits[0], lo_bits[0]);
          split_bf16(second, hi_bits[1], lo_bits[1]);
          hi = pack_bf16x2(hi_bits[0], hi_bits[1]);
          lo = pack_bf16x2(lo_bits[0], lo_bits[1]);
        } else {
          // Dims j and j + 4: halves j % 2 of words j / 2 and j / 2 + 2.
          hi = __byte_perm(w[j / 2], w[j / 2 + 2], j % 2 == 0 ? 0x5410 : 0x7632);
          nonfinite |= bf16x2_nonfinite_bits(hi);
        }
        *reinterpret_cast<uint32_t*>(shared + launch.q + offset) = hi;
        if (kFp32Q) *reinterpret_cast<uint32_t*>(shared + launch.q_lo + offset) = lo;
      }
    }
    bad |= nonfinite != 0;
    fence_shared_for_wgmma();  // the caller's barrier then covers every thread's writes
  } else if constexpr (kScore == ScoreKernel::kWarp) {
    uint32_t* hi = reinterpret_cast<uint32_t*>(shared + launch.q);
    uint32_t* lo = reinterpret_cast<uint32_t*>(shared + launch.q_lo);
    const int64_t registers = launch.m_tiles * kKeySteps * 32 * 4;
    for (int64_t r = threadIdx.x; r < registers; r += kThreads) {
      const int64_t word = r / 4;  // q_fragment_word(m_tile, step, lane)
      const int reg = static_cast<int>(r % 4);
      const int lane = static_cast<int>(word % 32);
      const int step = static_cast<int>((word / 32) % kKeySteps);
      const int64_t m_tile = word / (32 * kKeySteps);
      uint32_t hi_bits[2], lo_bits[2];
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * reg + e;
        const int head = q_fragment_head(m_tile, lane, i);
        const float value = head < p.num_heads
                                ? query_value<kQ>(p, row, head, q_fragment_dim(step, lane, i))
                                : 0.0f;
        bad |= !is_finite(value);
        if (kFp32Q) {
          split_bf16(value, hi_bits[e], lo_bits[e]);
        } else {
          hi_bits[e] = bf16_rn_bits(value);  // exact: the value came from bf16
        }
      }
      hi[r] = pack_bf16x2(hi_bits[0], hi_bits[1]);
      if (kFp32Q) lo[r] = pack_bf16x2(lo_bits[0], lo_bits[1]);
    }
  } else {
    float* q = reinterpret_cast<float*>(shared + launch.q);
    const int64_t values = p.num_heads * kIndexerKeyDim;
    for (int64_t i = threadIdx.x; i < values; i += kThreads) {
      const float value = query_value<kQ>(p, row, i / kIndexerKeyDim, static_cast<int>(i % 128));
      bad |= !is_finite(value);
      q[i] = value;
    }
  }
  return bad;
}

// 1. Weights and queries to shared memory; the validity of the row (finite queries and weights,
// num_entries in range), which every CTA of the row reaches alike from the same values, and of
// the block ids of the used pages (in range): the row's, or its first kIndexEarlyPages and this
// CTA's own (kPages). `segment_of(length)` is this CTA's share of a row of `length` entries: the
// block ids of its pages are kept in shared memory when they fit (`pages`). Zeroes `first_level`
// when given. Every thread calls it; it ends with a barrier and returns whether the row (or,
// kOwnPages, this CTA's share) is invalid, with num_entries in `length`.
template <ScoreKernel kScore, QueryKind kQ, PageCheck kPages, typename SegmentOf>
__device__ bool stage_row(const IndexerProblem& p, int64_t row, const IndexLaunch& launch,
                          uint8_t* shared, uint32_t* first_level, SegmentOf&& segment_of,
                          int64_t& length, KeyPages& pages, bool& remainder) {
  const int tid = threadIdx.x;
  float* weights = reinterpret_cast<float*>(shared + launch.weights);
  // A load does not pass a store to shared memory through a generic pointer, so the loads go out
  // in batches ahead of the stores they feed: num_entries, this thread's weight and the block ids
  // of the row's first pages (any page below max_blocks is in the table) together with the
  // queries: kRowPages, the first kPageBatch x kThreads; kOwnPages, the first kIndexEarlyPages
  // (one a thread), which every CTA checks, and a CTA's own pages beyond them once num_entries is
  // known. With every CTA checking the row's first 1024 ids, the 264 CTAs of one row of 65536
  // keys read the same 4 KiB and their queries came back 1.4 us later (H200).
  bool bad = false;
  length = p.num_entries.at(row);
  const float own_weight = tid < p.num_heads
                               ? p.weights[row * p.weights_row_stride + tid * p.weights_head_stride]
                               : 0.0f;
  constexpr int kPageBatch = 4;  // block ids a thread loads before it checks them
  constexpr bool kOwn = kPages == PageCheck::kOwnPages;
  static_assert(kIndexEarlyPages == kThreads, "a thread's early page is its own index");
  int64_t blocks[kPageBatch];
  // Pages base + tid + i x kThreads: kRowPages, those below max_blocks; kOwnPages, those in
  // first_page .. end_page - 1.
  auto load_blocks = [&](int64_t base, int64_t first_page, int64_t end_page) {
#pragma unroll
    for (int i = 0; i < kPageBatch; ++i) {
      const int64_t page = base + tid + i * kThreads;
      const bool wanted = kOwn ? page >= first_page && page < end_page : page < p.max_blocks;
      blocks[i] = wanted ? p.block_table.at(row, page) : 0;
    }
  };
  int64_t early_block = 0;
  if constexpr (kOwn) {
    early_block = tid < p.max_blocks ? p.block_table.at(row, tid) : 0;
  } else {
    load_blocks(0, 0, p.max_blocks);
  }
  bool own_remainder = false;
  bad |= stage_queries<kScore, kQ>(p, row, launch, shared, own_remainder);
  // A caller that counts the select's first level while it scores counts from zero (the barrier
  // at the end orders this before any count).
  zero_first_level(first_level);
  for (int64_t h = tid; h < launch.staged_heads; h += kThreads) {
    const float w = h == tid ? own_weight
                    : h < p.num_heads
                        ? p.weights[row * p.weights_row_stride + h * p.weights_head_stride]
                        : 0.0f;
    bad |= !is_finite(w);
    weights[h] = w;
  }
  const int64_t block_size = p.keys.block_size;
  if (length < 0 || length > p.max_blocks * block_size) {
    bad = true;
  } else {
    // Entries and pages below 2^31 (the launch plan's limit) divide by the FastDivide.
    const Segment segment = segment_of(length);
    if (segment.last > segment.first) {
      pages.first_cached = pages.divide.quotient(static_cast<uint32_t>(segment.first));
      if (pages.divide.quotient(static_cast<uint32_t>(segment.last - 1)) - pages.first_cached <
          launch.page_capacity)
        pages.cached = reinterpret_cast<const int32_t*>(shared + launch.pages);
    }
    int32_t* cache = reinterpret_cast<int32_t*>(shared + launch.pages);
    auto check = [&](int64_t page, int64_t block) {
      bad |= block < 0 || block >= p.keys.num_blocks;
      const int64_t slot = page - pages.first_cached;
      if (pages.cached != nullptr && slot >= 0 && slot < launch.page_capacity)
        cache[slot] = static_cast<int32_t>(block);  // block_table is int32
    };
    // Rounded up here rather than by ceil_quotient, which changes every one-launch kernel's
    // compiled code (a form of this staging that did read 0.97-0.98x at 64-128 rows of 65536
    // MXFP4 keys, H200).
    const int64_t whole_pages = pages.divide.quotient(static_cast<uint32_t>(length));
    const int64_t page_count = whole_pages + (whole_pages * block_size != length ? 1 : 0);
    // The pages checked from loads after num_entries: first_page .. end_page - 1, in batches
    // from a multiple of a batch's.
    constexpr int64_t kBatchPages = kPageBatch * kThreads;
    int64_t first_page = 0, end_page = page_count;
    if constexpr (kOwn) {
      if (tid < page_count) check(tid, early_block);
      first_page = max(pages.first_cached, int64_t{kIndexEarlyPages});
      end_page = segment.last > segment.first
                     ? pages.divide.quotient(static_cast<uint32_t>(segment.last - 1)) + 1
                     : 0;
    }
    for (int64_t base = kOwn ? first_page / kBatchPages * kBatchPages : 0; base < end_page;
         base += kBatchPages) {
      if (kOwn || base > 0) load_blocks(base, first_page, end_page);
#pragma unroll
      for (int i = 0; i < kPageBatch; ++i) {
        const int64_t page = base + tid + i * kThreads;
        if (page >= end_page) break;
        if (kOwn && page < first_page) continue;
        check(page, blocks[i]);
      }
    }
  }
  // The verdicts (kOwnPages: on the row's queries, weights, length and first pages, and this
  // CTA's pages); also the barrier after staging.
  remainder = kQ == QueryKind::kMXFP4 && __syncthreads_or(own_remainder ? 1 : 0) != 0;
  return __syncthreads_or(bad ? 1 : 0) != 0;
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
