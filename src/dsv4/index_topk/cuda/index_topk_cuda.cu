// CUDA backend of hdk::dsv4::index_topk: one launch, a cluster of C CTAs (C = 1..8) per row, each
// CTA owning a contiguous segment of the row's entries. A CTA
//  1. stages the row's weights and queries in shared memory (the queries already in the mma
//     fragment order of dsv4/index_topk/index_mma_layout.h), checks that they are finite and that
//     the row's num_entries and the block ids of its used pages are in range (every CTA of the
//     cluster reads the same values and reaches the same verdict, so no cluster barrier is
//     needed before an invalid row returns);
//  2. scores its segment straight from the paged FP4 key cache into shared memory, as the
//     order-preserving uint32 keys of topk_key.h: on tensor cores, up to 64 heads by warpgroups
//     (a warpgroup takes 64 entries at a time: each thread dequantizes 32 dims of two keys by
//     bit placement into bf16 A fragments, wgmma m64n64k16 against the staged q, then relu,
//     weight and a sum over heads within a quad; dsv4/index_topk/index_wgmma_layout.h), above 64
//     heads by warps (two 8-entry tiles at a time: mma.sync m16n8k16 for every 16 heads;
//     dsv4/index_topk/index_mma_layout.h), or, as a test cross-check, on CUDA cores (one warp per
//     entry, fp32 FMAs);
//  3. runs hdk::topk's cluster radix select (topk/cuda/cluster_select.cuh) over those scores
//     (the warpgroup kernel has counted its first level while scoring, where the launch plan
//     keeps that histogram apart from the staged data); the leader CTA writes the row's outputs.
// The scores never leave shared memory: the cluster holds up to 8 x 32768 of them, which covers
// 262144 entries per row with no workspace. A longer row still gets exact results: each CTA
// then scores its segment in chunks again on every pass of the select (usually 2 or 3 passes,
// at most 7).
// With a workspace, few rows (and FP8-form rows where index_rows_stream and, for MXFP4 keys,
// index_mxfp4_ring_pays say so) take two launches instead: scoring CTAs over every SM write each
// row's keys to the workspace (index_score_kernel; FP8-form keys stream through a ring in shared
// memory there), then a cluster a row selects from them (index_select_kernel).
// docs/dsv4-attention.md has the reasoning and the numbers.
#include "dsv4/index_topk/cuda/index_topk_cuda.h"

#include <cooperative_groups.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/bf16_pairs.h"
#include "core/ceil_div.h"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/count_invalid.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/gate_mma.cuh"
#include "core/cuda/named_barrier.cuh"
#include "core/cuda/shared_address.cuh"
#include "core/cuda/wgmma.cuh"
#include "core/cuda_helpers.h"
#include "core/fast_divide.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "dsv4/index_topk/index_mma_layout.h"
#include "dsv4/index_topk/index_wgmma_layout.h"
#include "dsv4/kv_cache/e4m3_bits.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/error.h"
#include "topk/cuda/cluster_select.cuh"
#include "topk/topk_key.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

namespace cg = cooperative_groups;
using hdk::detail::ceil_div;
using hdk::detail::cluster_select;
using hdk::detail::column_of;
using hdk::detail::FastDivide;
using hdk::detail::ordered_key;
using hdk::detail::select_layout;
using hdk::detail::shared_address;

constexpr const char* kOperation = "hdk::dsv4::index_topk";
// 8 warps: with two tiles per warp the tensor-core kernels take 146-155 registers a thread.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kTilesPerWarp = 2;  // 8-entry tiles per warp per query fragment read
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpgroups = kThreads / 128;
// Tiles of raw key bytes a warpgroup thread holds in registers ahead of the one it converts:
// with 3, an SM has about 26 KiB of key loads in flight (and the kernel 234-254 registers).
constexpr int kWarpgroupStages = 3;

// Which kernel scores: the warpgroup's wgmma (up to 64 heads), the warp's mma.sync, CUDA cores.
enum class ScoreKernel { kWarpgroup, kWarp, kCudaCore };

// The kernel's q (IndexQueryForm, with the exact form split by dtype): bf16 or fp32 on bf16
// tensor cores, E4M3 codes or packed MXFP4 on FP8 tensor cores (index_fp8_layout.h).
enum class QueryKind { kBf16, kFp32, kE4M3, kMXFP4 };

HDK_HOST_DEVICE constexpr bool is_fp8_query(QueryKind q) {
  return q == QueryKind::kE4M3 || q == QueryKind::kMXFP4;
}

std::atomic<int> g_score_path{static_cast<int>(IndexScorePath::kTensorCore)};

// relu that keeps NaN, as the CPU backend's: a key stored with NaN markers must score NaN.
__device__ __forceinline__ float relu(float x) {
  return x < 0.0f ? 0.0f : x;
}

// The same in one instruction (max.NaN; -0 may come back as +0, which scores the same).
__device__ __forceinline__ float relu_keep_nan(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
  return y;
}

// The score a ranked key stands for (ordered_key's inverse; -0 comes back as +0).
__device__ __forceinline__ float value_of_key(uint32_t key) {
  if (key == 0u) return __uint_as_float(0x7fc00000u);
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

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
          const uint32_t codes = c % 2 == 0 ? loaded[i] : loaded[i] >> 16;
          uint32_t packed = 0;
#pragma unroll
          for (int j = 0; j < 4; j += 2) {
            const float first = decode_e2m1(static_cast<uint8_t>((codes >> (4 * j)) & 0xfu));
            const float second = decode_e2m1(static_cast<uint8_t>((codes >> (4 * j + 4)) & 0xfu));
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
          bad |= !bf16x2_finite(hi);
        }
        *reinterpret_cast<uint32_t*>(shared + launch.q + offset) = hi;
        if (kFp32Q) *reinterpret_cast<uint32_t*>(shared + launch.q_lo + offset) = lo;
      }
    }
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

// Where entry s of the row lives: its page and its offset in the page (s < 2^31, checked).
struct EntryPlace {
  const uint8_t* page;
  int64_t offset;
};

// How a CTA finds its entries' pages: the division by the block size, and the block ids of its
// segment's pages, copied to shared memory while the row is validated when they fit there
// (launch.page_capacity). Read from global memory, a block id is a round trip that the key load
// behind it has to wait for; from shared memory it is a few cycles, so the key loads in flight
// are not held up by it.
struct KeyPages {
  FastDivide divide;
  const int32_t* cached = nullptr;  // block ids of pages first_cached .., or nullptr
  int64_t first_cached = 0;
};

__device__ __forceinline__ EntryPlace place_of(const IndexerProblem& p, int64_t row, int64_t s,
                                               const KeyPages& pages) {
  const uint32_t entry = static_cast<uint32_t>(s);
  const uint32_t page = pages.divide.quotient(entry);
  const int64_t block = pages.cached != nullptr ? pages.cached[page - pages.first_cached]
                                                : p.block_table.at(row, page);
  return EntryPlace{p.keys.data + block * p.keys.page_stride,
                    static_cast<int64_t>(entry - page * pages.divide.divisor)};
}

// One lane's 16 bytes of an entry's key (dims 32t .. 32t + 31 for quad lane t) and their scale
// bytes (MXFP4: byte t; NVFP4: bytes 2t and 2t + 1, the first in the low bits).
struct RawPiece {
  uint32_t words[4];
  uint32_t scale_bytes;
};

// Loads entry s of the row for quad lane t. Past the end of a segment the callers load its first
// entry and drop its score; its codes stay as they are: the entries of a product (rows of a
// wgmma, columns of an mma.sync) do not mix, and zeroing them would put a select on the loaded
// words right behind the load, where it waits for the data (one memory latency per tile: the
// kernels took 3-17% longer with it on an H100, docs/dsv4-attention.md).
template <KeyFormat kFormat>
__device__ __forceinline__ RawPiece load_raw_piece(const IndexerProblem& p, int64_t row, int64_t s,
                                                   int t, bool wide, const KeyPages& pages) {
  const EntryPlace place = place_of(p, row, s, pages);
  const uint8_t* data = place.page + place.offset * kKeyDataBytes + 16 * t;
  RawPiece piece;
  if (wide) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(data));
    piece.words[0] = v.x, piece.words[1] = v.y, piece.words[2] = v.z, piece.words[3] = v.w;
  } else {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      piece.words[i] = __ldg(reinterpret_cast<const uint32_t*>(data) + i);
  }
  const uint8_t* scales =
      place.page + p.keys.block_size * kKeyDataBytes + place.offset * key_scale_bytes(kFormat);
  piece.scale_bytes = kFormat == KeyFormat::kMXFP4
                          ? __ldg(scales + t)
                          : __ldg(reinterpret_cast<const unsigned short*>(scales) + t);
  return piece;
}

// One lane's share of an 8-entry tile of the warp kernel: 16 bytes of its key and their scales.
struct KeyPiece {
  uint32_t words[4];
  uint32_t scale_lo, scale_hi;  // bf16x2 scales of dims 32t .. 32t + 15 and 32t + 16 .. 32t + 31
};

// The piece of entry `first + e` (e = tile * 8 + group) for quad lane t; entries past `count`
// read entry `first` (load_raw_piece).
template <KeyFormat kFormat>
__device__ __forceinline__ KeyPiece load_key_piece(const IndexerProblem& p, int64_t row,
                                                   int64_t first, int64_t count, int64_t tile,
                                                   int group, int t, bool wide,
                                                   const KeyPages& pages) {
  const int64_t e = tile * kMmaN + group;
  const RawPiece raw = load_raw_piece<kFormat>(p, row, first + (e < count ? e : 0), t, wide, pages);
  KeyPiece piece;
#pragma unroll
  for (int i = 0; i < 4; ++i)
    piece.words[i] = raw.words[i];
  if (kFormat == KeyFormat::kMXFP4) {
    const float scale = decode_ue8m0(static_cast<uint8_t>(raw.scale_bytes));
    piece.scale_lo = piece.scale_hi = pack_floats_bf16x2(scale, scale);
  } else {
    const float lo = decode_e4m3(static_cast<uint8_t>(raw.scale_bytes & 0xffu));
    const float hi = decode_e4m3(static_cast<uint8_t>(raw.scale_bytes >> 8));
    piece.scale_lo = pack_floats_bf16x2(lo, lo);
    piece.scale_hi = pack_floats_bf16x2(hi, hi);
  }
  return piece;
}

// Lanes t = 0..3 of a quad hold partial sums of rows upper and upper + 8 of a 64-entry tile (the
// tile's entry `tile_entry` first) over their heads: the quad's totals, lane 0 writing row upper's
// key and lane 1 row upper + 8's (`finish` maps a total to its score), each counted into the
// select's first level when given. Every warpgroup kernel ends its tiles so.
template <typename Finish>
__device__ __forceinline__ void write_quad_rows(float (&sum)[2], int64_t tile_entry, int upper,
                                                int t, int64_t count, uint32_t* out,
                                                uint32_t* first_level, Finish&& finish) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 1);
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 2);
  }
  if (t < 2) {  // lane t = 0 writes the upper row, t = 1 the lower one
    const int64_t e = tile_entry + upper + 8 * t;
    if (e < count) {
      const uint32_t key = ordered_key(finish(t == 0 ? sum[0] : sum[1]));
      out[e] = key;
      if (first_level != nullptr)
        atomicAdd(&first_level[key >> (32 - hdk::detail::kSelectDigitBits)], 1u);
    }
  }
}

// Where the FP8 kernels find a row's staged q (stage_fp8_queries): the heads' weights, MXFP4's
// per-(head, group) multipliers after the codes, the 64-head tiles and the first one's wgmma
// descriptor.
struct Fp8StagedQuery {
  const float* weights;
  const float* multipliers;
  int head_tiles;
  uint64_t q_tile0;
};
__device__ __forceinline__ Fp8StagedQuery fp8_staged_query(const uint8_t* shared,
                                                           const IndexLaunch& launch) {
  return Fp8StagedQuery{
      reinterpret_cast<const float*>(shared + launch.weights),
      reinterpret_cast<const float*>(shared + launch.q + launch.staged_heads * 128),
      static_cast<int>(launch.staged_heads / kFp8HeadTile),
      wgmma_descriptor(shared_address(shared + launch.q), scores_operand(0, kFp8HeadTile))};
}

// The A fragments of a tile's kFp8Steps k-steps from a thread's pieces of its two rows (upper and
// upper + 8): E4M3 codes as they are, MXFP4 codes turned into the E4M3 codes of their values.
template <QueryKind kQ, size_t kWords>
__device__ __forceinline__ void fp8_step_fragments(const uint32_t (&upper)[kWords],
                                                   const uint32_t (&lower)[kWords],
                                                   uint32_t (&a)[kFp8Steps][4]) {
#pragma unroll
  for (int step = 0; step < kFp8Steps; ++step) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      if constexpr (kQ == QueryKind::kE4M3) {
        a[step][reg] = fp8_step_fragment(upper, lower, step, reg);
      } else {
        a[step][reg] = mxfp4_step_fragment(upper, lower, step, reg);
      }
    }
  }
}

// An MXFP4 key's scale of group g from its 4 UE8M0 bytes (group 0 in the low bits).
__device__ __forceinline__ float mxfp4_group_scale(uint32_t scales, int g) {
  return decode_ue8m0(static_cast<uint8_t>((scales >> (8 * g)) & 0xffu));
}

// The product of MXFP4 scale group `step` (exact in `group`) times both its scales, the key's
// (`key_scale`, per row) and, where the row has one (`remainder`), the head's multiplier, added
// to `dot` in group order: the one arithmetic of both FP8 tensor-core kernels, which give the same
// scores bit for bit.
__device__ __forceinline__ void add_scaled_group(float (&dot)[32], float (&group)[32], int step,
                                                 const float (&key_scale)[2][kFp8Steps],
                                                 bool remainder, const float* multipliers,
                                                 int head_tile, int thread) {
  if (remainder) {  // the same for the whole row
#pragma unroll
    for (int i = 0; i < 32; ++i) {
      const int head = head_tile * kFp8HeadTile + wgmma_d_coord(thread, i).col;
      group[i] *= key_scale[(i / 2) % 2][step] * multipliers[4 * head + step];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 32; ++i)
      group[i] *= key_scale[(i / 2) % 2][step];
  }
#pragma unroll
  for (int i = 0; i < 32; ++i)
    dot[i] = step == 0 ? group[i] : dot[i] + group[i];
}

// Tensor cores, up to 64 heads: scores entries first .. first + count - 1 of the row into
// out[0 .. count). Warpgroup g takes the 64-entry tiles g, g + 2, ...; a thread converts rows r
// and r + 8 of its warp's 16 (dsv4/index_topk/index_wgmma_layout.h) into the A fragments of the
// tile's 8 k-steps, the warpgroup multiplies them by the staged q (twice for fp32 q: hi and lo),
// and the 4 threads of a quad sum relu(D) x weight over their 16 heads each. The raw bytes of the
// next kWarpgroupStages tiles are in flight meanwhile. With `first_level`, each score is also
// counted into the select's first-level histogram (the pass the select would otherwise make over
// the scores).
template <QueryKind kQ, KeyFormat kFormat>
__device__ void score_warpgroup(const IndexerProblem& p, int64_t row, int64_t first, int64_t count,
                                const IndexLaunch& launch, const uint8_t* shared, uint32_t* out,
                                bool wide, const KeyPages& pages, uint32_t* first_level) {
  constexpr bool kFp32Q = kQ == QueryKind::kFp32;
  const int warpgroup = threadIdx.x / 128, thread = threadIdx.x % 128;
  const int lane = threadIdx.x & 31, t = lane & 3;
  const int upper = wgmma_d_coord(thread, 0).row;  // this thread's rows: upper and upper + 8
  // This thread's accumulator columns are heads 8 j + 2t + (0, 1): their weights, for good.
  const float* staged_weights = reinterpret_cast<const float*>(shared + launch.weights);
  float weight[kWarpgroupHeads / 4];
#pragma unroll
  for (int i = 0; i < kWarpgroupHeads / 4; ++i)
    weight[i] = staged_weights[wgmma_d_coord(thread, 4 * (i / 2) + i % 2).col];
  // The B descriptors of k-step 0; the other steps' are fixed byte offsets from them.
  const uint64_t q_hi =
      wgmma_descriptor(shared_address(shared + launch.q), scores_operand(0, kWarpgroupHeads));
  const uint64_t q_lo =
      wgmma_descriptor(shared_address(shared + launch.q_lo), scores_operand(0, kWarpgroupHeads));
  const int64_t tiles = ceil_div(count, kWarpgroupEntries);

  auto load = [&](int64_t tile, RawPiece(&rows)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t e = tile * kWarpgroupEntries + upper + 8 * r;
      rows[r] = load_raw_piece<kFormat>(p, row, first + (e < count ? e : 0), t, wide, pages);
    }
  };
  RawPiece stage[kWarpgroupStages][2];
#pragma unroll
  for (int u = 0; u < kWarpgroupStages; ++u)
    load(warpgroup + u * kWarpgroups, stage[u]);

  constexpr int64_t kStride = int64_t{kWarpgroupStages} * kWarpgroups;
  for (int64_t base = warpgroup; base < tiles; base += kStride) {
#pragma unroll
    for (int u = 0; u < kWarpgroupStages; ++u) {
      const int64_t tile = base + u * kWarpgroups;
      if (tile >= tiles) break;  // the same for the whole warpgroup
      uint32_t a[2][16];
      if (kFormat == KeyFormat::kMXFP4) {
        // Scale bytes above 136 (scales above 2^9, NaN) take two multiplies; a warp that has one
        // converts every piece that way (the same exact values).
        const uint32_t s0 = stage[u][0].scale_bytes, s1 = stage[u][1].scale_bytes;
        if (__any_sync(kFullMask, mxfp4_needs_two_steps(s0) || mxfp4_needs_two_steps(s1))) {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t scale =
                scale_pair(decode_ue8m0(static_cast<uint8_t>(stage[u][r].scale_bytes)));
            entry_fragments<true>(stage[u][r].words, scale, scale, a[r]);
          }
        } else {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t scale = mxfp4_placed_multiplier(stage[u][r].scale_bytes);
            entry_fragments<false>(stage[u][r].words, scale, scale, a[r]);
          }
        }
      } else {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint32_t bytes = stage[u][r].scale_bytes;
          entry_fragments<false>(
              stage[u][r].words,
              nvfp4_placed_multiplier(decode_e4m3(static_cast<uint8_t>(bytes & 0xffu))),
              nvfp4_placed_multiplier(decode_e4m3(static_cast<uint8_t>(bytes >> 8))), a[r]);
        }
      }
      load(tile + kStride, stage[u]);  // past the end: entry `first`, dropped

      float d[32];
      wgmma_fence();
#pragma unroll
      for (int step = 0; step < kWarpgroupSteps; ++step) {
        const uint32_t fragment[4] = {
            step_fragment(a[0], a[1], step, 0), step_fragment(a[0], a[1], step, 1),
            step_fragment(a[0], a[1], step, 2), step_fragment(a[0], a[1], step, 3)};
        const int offset = scores_operand(step, kWarpgroupHeads).start;
        wgmma_m64n64k16_a_registers(d, fragment, wgmma_descriptor_advance(q_hi, offset), step > 0);
        if (kFp32Q) {
          wgmma_m64n64k16_a_registers(d, fragment, wgmma_descriptor_advance(q_lo, offset), true);
        }
      }
      wgmma_commit();
      wgmma_wait<0>();
      wgmma_fence_accumulators(d);

      // Accumulator i is row upper + 8 ((i / 2) % 2), head wgmma_d_coord(thread, i).col.
      float sum[2] = {0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < 32; ++i)
        sum[(i / 2) % 2] += relu_keep_nan(d[i]) * weight[2 * (i / 4) + i % 2];
      // A carried 2^-kPlacedShift: exact back (a power of two), not folded into the weights,
      // which could then overflow.
      write_quad_rows(sum, tile * kWarpgroupEntries, upper, t, count, out, first_level,
                      [](float total) { return total * kPlacedScoreFactor; });
    }
  }
}

// Tensor cores, any head count: scores entries first .. first + count - 1 of the row into
// out[0 .. count). A warp
// takes kTilesPerWarp consecutive 8-entry tiles at a time (warp w: tile groups w, w + 8, ...),
// so each query fragment read from shared memory feeds kTilesPerWarp mma; the next group's key
// bytes are loaded while the current group is computed.
template <QueryKind kQ, KeyFormat kFormat>
__device__ void score_warp(const IndexerProblem& p, int64_t row, int64_t first, int64_t count,
                           const IndexLaunch& launch, const uint8_t* shared, uint32_t* out,
                           bool wide, const KeyPages& pages) {
  constexpr bool kFp32Q = kQ == QueryKind::kFp32;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int group = lane >> 2, t = lane & 3;
  const uint4* q_hi = reinterpret_cast<const uint4*>(shared + launch.q);
  const uint4* q_lo = reinterpret_cast<const uint4*>(shared + launch.q_lo);
  const float* weights = reinterpret_cast<const float*>(shared + launch.weights);
  const int m_tiles = static_cast<int>(launch.m_tiles);
  const int64_t tile_groups = ceil_div(ceil_div(count, kMmaN), kTilesPerWarp);
  if (warp >= tile_groups) return;
  // Tiles past the end load entry `first`; their scores are not written.
  KeyPiece next[kTilesPerWarp];
#pragma unroll
  for (int u = 0; u < kTilesPerWarp; ++u) {
    next[u] = load_key_piece<kFormat>(p, row, first, count, warp * kTilesPerWarp + u, group, t,
                                      wide, pages);
  }
  for (int64_t tile_group = warp; tile_group < tile_groups; tile_group += kWarps) {
    uint32_t b[kTilesPerWarp][kKeySteps][2];
#pragma unroll
    for (int u = 0; u < kTilesPerWarp; ++u) {
#pragma unroll
      for (int step = 0; step < kKeySteps; ++step) {
        key_fragment(next[u].words, step,
                     step < kKeySteps / 2 ? next[u].scale_lo : next[u].scale_hi, b[u][step][0],
                     b[u][step][1]);
      }
    }
    const int64_t ahead = tile_group + kWarps < tile_groups ? tile_group + kWarps : tile_group;
#pragma unroll
    for (int u = 0; u < kTilesPerWarp; ++u) {
      next[u] = load_key_piece<kFormat>(p, row, first, count, ahead * kTilesPerWarp + u, group, t,
                                        wide, pages);
    }

    float sum[kTilesPerWarp][2] = {};  // entries 2t and 2t + 1 of each tile, this lane's heads
    for (int m_tile = 0; m_tile < m_tiles; ++m_tile) {
      float c[kTilesPerWarp][4] = {};
#pragma unroll
      for (int step = 0; step < kKeySteps; ++step) {
        const uint4 a = q_hi[q_fragment_word(m_tile, step, lane)];
#pragma unroll
        for (int u = 0; u < kTilesPerWarp; ++u)
          mma_bf16_16816(c[u], a.x, a.y, a.z, a.w, b[u][step][0], b[u][step][1]);
        if (kFp32Q) {
          const uint4 l = q_lo[q_fragment_word(m_tile, step, lane)];
#pragma unroll
          for (int u = 0; u < kTilesPerWarp; ++u)
            mma_bf16_16816(c[u], l.x, l.y, l.z, l.w, b[u][step][0], b[u][step][1]);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float w = weights[m_tile * kMmaM + mma_c_row(lane, i)];
#pragma unroll
        for (int u = 0; u < kTilesPerWarp; ++u)
          sum[u][i & 1] += relu(c[u][i]) * w;
      }
    }
    // The 8 lanes of one quad position hold the same entries for different heads.
#pragma unroll
    for (int u = 0; u < kTilesPerWarp; ++u) {
#pragma unroll
      for (int offset = 4; offset < 32; offset <<= 1) {
        sum[u][0] += __shfl_xor_sync(kFullMask, sum[u][0], offset);
        sum[u][1] += __shfl_xor_sync(kFullMask, sum[u][1], offset);
      }
    }
    if (group == 0) {
#pragma unroll
      for (int u = 0; u < kTilesPerWarp; ++u) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int64_t e = (tile_group * kTilesPerWarp + u) * kMmaN + mma_c_col(lane, i);
          if (e < count) out[e] = ordered_key(sum[u][i]);
        }
      }
    }
  }
}

// The FP8 forms on FP8 tensor cores, the workspace's scoring kernel (E4M3 q over kFP8 keys, packed
// MXFP4 q over kMXFP4 keys): scores entries first .. first + count - 1 of the row into
// out[0 .. count), any head count. Warpgroup g takes the 64-entry tiles g, g + 2, ... Their
// stored bytes go by cp.async, as they are, into a ring of kFp8KeyStages tiles of its own in
// shared memory (launch.key_ring; index_fp8_layout.h): while it multiplies one tile the next
// three are in flight and no register holds them, so the kernel takes 118 (E4M3) or 128 (MXFP4)
// registers where score_warpgroup_fp8 takes 226-254, and two CTAs share an SM. Each thread then
// loads from the tile the very pieces score_warpgroup_fp8 loads from memory and builds the same A
// fragments, so both give the same scores bit for bit. E4M3: per staged 64-head tile of q one chain
// of 4 k-steps, the key's scale, relu (NaN kept), the heads' weights and the quad's sum. MXFP4:
// each k-step (scale group) alone into one set of accumulators (score_warpgroup_fp8 takes two at a
// time; a group's product is exact either way), times both scales, the groups added in order.
template <QueryKind kQ>
__device__ void score_warpgroup_ring(const IndexerProblem& p, int64_t row, int64_t first,
                                     int64_t count, const IndexLaunch& launch, uint8_t* shared,
                                     uint32_t* out, bool wide, const KeyPages& pages,
                                     uint32_t* first_level, bool remainder) {
  constexpr bool kE4M3 = kQ == QueryKind::kE4M3;
  constexpr KeyFormat kFormat = kE4M3 ? KeyFormat::kFP8 : KeyFormat::kMXFP4;
  constexpr int kTileBytes = kE4M3 ? kFp8KeyTileBytes : kMxfp4KeyTileBytes;
  const int warpgroup = threadIdx.x / 128, thread = threadIdx.x % 128;
  const int t = threadIdx.x & 3;
  const int upper = wgmma_d_coord(thread, 0).row;  // this thread's rows: upper and upper + 8
  const Fp8StagedQuery staged = fp8_staged_query(shared, launch);
  uint8_t* codes = shared + launch.key_ring + warpgroup * kFp8KeyStages * kTileBytes;
  // 4 bytes an entry: E4M3's fp32 scale, MXFP4's 4 UE8M0 group scales.
  uint32_t* scales = reinterpret_cast<uint32_t*>(shared + launch.key_ring +
                                                 kWarpgroups * kFp8KeyStages * kTileBytes) +
                     warpgroup * kFp8KeyStages * kFp8TileEntries;
  const int64_t tiles = ceil_div(count, int64_t{kFp8TileEntries});
  const int64_t own_tiles =
      tiles > warpgroup ? ceil_div(tiles - warpgroup, int64_t{kWarpgroups}) : 0;
  const int barrier = hdk::detail::kFirstNamedBarrier + warpgroup;

  // The warpgroup's k-th tile into stage k % kFp8KeyStages: thread pairs take an entry each
  // (one lookup of its page a thread), the pair's copy i being chunks 2 i and 2 i + 1, so a warp's
  // copy reads 16 entries' whole 32-byte sectors; the even thread also copies the scales. Past
  // the end of the segment the pair copies entry `first` (its score is dropped). Every thread
  // commits one group a call, empty or not, so the waits count tiles.
  const int copy_entry = thread / 2, copy_half = thread % 2;
  constexpr int64_t kDataBytes = key_data_bytes(kFormat);
  constexpr int kCopies = static_cast<int>(kDataBytes / 32);  // 16-byte chunks a thread copies
  auto chunk_offset_of = [](int entry, int chunk) {
    return kE4M3 ? fp8_key_chunk_offset(entry, chunk) : mxfp4_key_chunk_offset(entry, chunk);
  };
  int chunk_offset[kCopies];
#pragma unroll
  for (int i = 0; i < kCopies; ++i)
    chunk_offset[i] = chunk_offset_of(copy_entry, copy_half + 2 * i);
  const int64_t scale_offset = p.keys.block_size * kDataBytes;
  auto issue = [&](int64_t k) {
    if (k < own_tiles) {
      const int stage = static_cast<int>(k % kFp8KeyStages);
      const int64_t e = (warpgroup + k * kWarpgroups) * kFp8TileEntries + copy_entry;
      const EntryPlace place = place_of(p, row, first + (e < count ? e : 0), pages);
      const uint8_t* source = place.page + place.offset * kDataBytes + 16 * copy_half;
      uint8_t* target = codes + stage * kTileBytes;
#pragma unroll
      for (int i = 0; i < kCopies; ++i) {
        if (wide) {
          hdk::detail::cp_async_16(target + chunk_offset[i], source + 32 * i);
        } else {
#pragma unroll
          for (int w = 0; w < 4; ++w)
            hdk::detail::cp_async_4(target + chunk_offset[i] + 4 * w, source + 32 * i + 4 * w);
        }
      }
      if (copy_half == 0) {
        hdk::detail::cp_async_4(scales + stage * kFp8TileEntries + copy_entry,
                                place.page + scale_offset + place.offset * 4);
      }
    }
    hdk::detail::cp_async_commit();
  };
  // The weights of this thread's 16 heads of a 64-head tile (accumulator i: head col(i), weight
  // (i / 4) * 2 + i % 2), reloaded per head tile only when there are several.
  float weights[16];
  auto load_weights = [&](int head_tile) {
#pragma unroll
    for (int j = 0; j < 16; ++j)
      weights[j] =
          staged.weights[head_tile * kFp8HeadTile + wgmma_d_coord(thread, 4 * (j / 2) + j % 2).col];
  };
  load_weights(0);
#pragma unroll
  for (int k = 0; k < kFp8KeyStages - 1; ++k)
    issue(k);

  for (int64_t k = 0; k < own_tiles; ++k) {
    // Tile k has landed for every thread; tile k - 1 is done with, so its stage takes the next.
    hdk::detail::cp_async_wait<kFp8KeyStages - 2>();
    fence_shared_for_wgmma();
    hdk::detail::named_barrier_sync(barrier, 128);
    issue(k + kFp8KeyStages - 1);
    const int stage = static_cast<int>(k % kFp8KeyStages);
    const uint32_t* tile_scales = scales + stage * kFp8TileEntries;
    const uint32_t scale_words[2] = {tile_scales[upper], tile_scales[upper + 8]};
    const uint8_t* tile = codes + stage * kTileBytes;
    float sum[2] = {0.0f, 0.0f};
    if constexpr (kE4M3) {
      const float key_scale[2] = {__uint_as_float(scale_words[0]), __uint_as_float(scale_words[1])};
      // This thread's two entries' bytes 32 t .. 32 t + 31 (chunks 2 t and 2 t + 1, which the
      // swizzle puts in distinct banks for the 8 lanes of a load phase).
      uint32_t words[2][8];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint4 v = *reinterpret_cast<const uint4*>(
              tile + fp8_key_chunk_offset(upper + 8 * r, 2 * t + half));
          words[r][4 * half] = v.x, words[r][4 * half + 1] = v.y;
          words[r][4 * half + 2] = v.z, words[r][4 * half + 3] = v.w;
        }
      }
      uint32_t a[kFp8Steps][4];
      fp8_step_fragments<kQ>(words[0], words[1], a);
      for (int head_tile = 0; head_tile < staged.head_tiles; ++head_tile) {
        const uint64_t q_tile =
            wgmma_descriptor_advance(staged.q_tile0, head_tile * kFp8HeadTileBytes);
        // Accumulator i is row upper + 8 ((i / 2) % 2), head 64 head_tile + col(i).
        float dot[32];
        wgmma_fence();
#pragma unroll
        for (int step = 0; step < kFp8Steps; ++step) {
          wgmma_m64n64k32_e4m3_a_registers(
              dot, a[step],
              wgmma_descriptor_advance(q_tile, scores_operand(step, kFp8HeadTile).start), step > 0);
        }
        wgmma_commit();
        if (staged.head_tiles > 1) load_weights(head_tile);
        wgmma_wait<0>();
        wgmma_fence_accumulators(dot);
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          sum[(i / 2) % 2] +=
              relu_keep_nan(dot[i] * key_scale[(i / 2) % 2]) * weights[(i / 4) * 2 + i % 2];
        }
      }
    } else {
      float key_scale[2][kFp8Steps];  // per row, its 4 group scales
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int g = 0; g < kFp8Steps; ++g)
          key_scale[r][g] = mxfp4_group_scale(scale_words[r], g);
      }
      // Word t of each scale group's chunk of the thread's two entries: the key's words 4 g + t.
      uint32_t words[2][4];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int g = 0; g < kFp8Steps; ++g) {
          words[r][g] = *reinterpret_cast<const uint32_t*>(
              tile + mxfp4_key_chunk_offset(upper + 8 * r, g) + 4 * t);
        }
      }
      uint32_t a[kFp8Steps][4];
      fp8_step_fragments<kQ>(words[0], words[1], a);
      for (int head_tile = 0; head_tile < staged.head_tiles; ++head_tile) {
        const uint64_t q_tile =
            wgmma_descriptor_advance(staged.q_tile0, head_tile * kFp8HeadTileBytes);
        if (staged.head_tiles > 1) load_weights(head_tile);
        // Accumulator i is row upper + 8 ((i / 2) % 2), head 64 head_tile + col(i).
        float dot[32];
#pragma unroll
        for (int step = 0; step < kFp8Steps; ++step) {
          float group[32];
          wgmma_fence();
          wgmma_m64n64k32_e4m3_a_registers(
              group, a[step],
              wgmma_descriptor_advance(q_tile, scores_operand(step, kFp8HeadTile).start), false);
          wgmma_commit();
          wgmma_wait<0>();
          wgmma_fence_accumulators(group);
          add_scaled_group(dot, group, step, key_scale, remainder, staged.multipliers, head_tile,
                           thread);
        }
#pragma unroll
        for (int i = 0; i < 32; ++i)
          sum[(i / 2) % 2] += relu_keep_nan(dot[i]) * weights[(i / 4) * 2 + i % 2];
      }
    }
    write_quad_rows(sum, (warpgroup + k * kWarpgroups) * kFp8TileEntries, upper, t, count, out,
                    first_level, [](float total) { return total; });
  }
  // The ring is free again for the next call (a chunked segment scores again on every pass).
  hdk::detail::cp_async_wait<0>();
  hdk::detail::named_barrier_sync(barrier, 128);
}

// FP8 tensor cores, E4M3 q and kFP8 keys: an entry's 32 bytes for quad lane t (dims 32t ..
// 32t + 31) and its scale.
struct Fp8KeyPiece {
  uint32_t words[8];
  float scale;
};

// MXFP4 q and kMXFP4 keys: the entry's words 4g + t (g = 0..3: one word of each scale group) and
// its 4 scale bytes.
struct Mxfp4KeyPiece {
  uint32_t words[4];
  uint32_t scales;
};

template <QueryKind kQ>
using Fp8ScoringPiece = std::conditional_t<kQ == QueryKind::kE4M3, Fp8KeyPiece, Mxfp4KeyPiece>;

// Loads entry s of the row for quad lane t (index_fp8_layout.h). Like load_raw_piece, the callers
// load entry `first` past a segment's end and drop its score.
template <QueryKind kQ>
__device__ __forceinline__ Fp8ScoringPiece<kQ> load_fp8_piece(const IndexerProblem& p, int64_t row,
                                                              int64_t s, int t, bool wide,
                                                              const KeyPages& pages) {
  const EntryPlace place = place_of(p, row, s, pages);
  constexpr KeyFormat kFormat = kQ == QueryKind::kE4M3 ? KeyFormat::kFP8 : KeyFormat::kMXFP4;
  constexpr int64_t kDataBytes = key_data_bytes(kFormat);
  const uint8_t* data = place.page + place.offset * kDataBytes;
  const uint8_t* scales = place.page + p.keys.block_size * kDataBytes + place.offset * 4;
  Fp8ScoringPiece<kQ> piece;
  if constexpr (kQ == QueryKind::kE4M3) {
    const uint8_t* bytes = data + 32 * t;
    if (wide) {
      const uint4 a = __ldg(reinterpret_cast<const uint4*>(bytes));
      const uint4 b = __ldg(reinterpret_cast<const uint4*>(bytes) + 1);
      piece.words[0] = a.x, piece.words[1] = a.y, piece.words[2] = a.z, piece.words[3] = a.w;
      piece.words[4] = b.x, piece.words[5] = b.y, piece.words[6] = b.z, piece.words[7] = b.w;
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i)
        piece.words[i] = __ldg(reinterpret_cast<const uint32_t*>(bytes) + i);
    }
    piece.scale = __ldg(reinterpret_cast<const float*>(scales));
  } else {
#pragma unroll
    for (int g = 0; g < 4; ++g)
      piece.words[g] = __ldg(reinterpret_cast<const uint32_t*>(data) + 4 * g + t);
    piece.scales = __ldg(reinterpret_cast<const uint32_t*>(scales));
  }
  return piece;
}

// FP8 tensor cores, any head count: scores entries first .. first + count - 1 of the row into
// out[0 .. count). As score_warpgroup: warpgroup g takes the 64-entry tiles g, g + 2, ..., a
// thread holds rows r and r + 8 of its warp's 16 with the next kWarpgroupStages tiles' bytes in
// flight; here the A fragments are the stored codes (E4M3) or their E4M3 translation (MXFP4), and
// every staged 64-head tile of q is multiplied by them in turn. E4M3: one chain of 4 k-steps, the
// sum times the key's scale. MXFP4: each k-step (scale group) into accumulators of its own, the
// groups' sums times the key's scale and the rest of q's (`remainder`: some q multiplier is not
// 1) added in group order.
template <QueryKind kQ>
__device__ void score_warpgroup_fp8(const IndexerProblem& p, int64_t row, int64_t first,
                                    int64_t count, const IndexLaunch& launch, const uint8_t* shared,
                                    uint32_t* out, bool wide, const KeyPages& pages,
                                    uint32_t* first_level, bool remainder) {
  const int warpgroup = threadIdx.x / 128, thread = threadIdx.x % 128;
  const int lane = threadIdx.x & 31, t = lane & 3;
  const int upper = wgmma_d_coord(thread, 0).row;  // this thread's rows: upper and upper + 8
  const Fp8StagedQuery staged = fp8_staged_query(shared, launch);
  const int64_t tiles = ceil_div(count, kWarpgroupEntries);

  using Piece = Fp8ScoringPiece<kQ>;
  auto load = [&](int64_t tile, Piece(&rows)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t e = tile * kWarpgroupEntries + upper + 8 * r;
      rows[r] = load_fp8_piece<kQ>(p, row, first + (e < count ? e : 0), t, wide, pages);
    }
  };
  Piece stage[kWarpgroupStages][2];
#pragma unroll
  for (int u = 0; u < kWarpgroupStages; ++u)
    load(warpgroup + u * kWarpgroups, stage[u]);

  constexpr int64_t kStride = int64_t{kWarpgroupStages} * kWarpgroups;
  for (int64_t base = warpgroup; base < tiles; base += kStride) {
#pragma unroll
    for (int u = 0; u < kWarpgroupStages; ++u) {
      const int64_t tile = base + u * kWarpgroups;
      if (tile >= tiles) break;  // the same for the whole warpgroup
      uint32_t a[kFp8Steps][4];
      // Per row: the key's scale (E4M3), or its 4 group scales (MXFP4).
      float key_scale[2][kQ == QueryKind::kE4M3 ? 1 : kFp8Steps];
      fp8_step_fragments<kQ>(stage[u][0].words, stage[u][1].words, a);
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        if constexpr (kQ == QueryKind::kE4M3) {
          key_scale[r][0] = stage[u][r].scale;
        } else {
#pragma unroll
          for (int g = 0; g < kFp8Steps; ++g)
            key_scale[r][g] = mxfp4_group_scale(stage[u][r].scales, g);
        }
      }
      load(tile + kStride, stage[u]);  // past the end: entry `first`, dropped

      float sum[2] = {0.0f, 0.0f};
      for (int head_tile = 0; head_tile < staged.head_tiles; ++head_tile) {
        const uint64_t q_tile =
            wgmma_descriptor_advance(staged.q_tile0, head_tile * kFp8HeadTileBytes);
        // Accumulator i is row upper + 8 ((i / 2) % 2), head 64 head_tile + col(i).
        float dot[32];
        if constexpr (kQ == QueryKind::kE4M3) {
          wgmma_fence();
#pragma unroll
          for (int step = 0; step < kFp8Steps; ++step) {
            wgmma_m64n64k32_e4m3_a_registers(
                dot, a[step],
                wgmma_descriptor_advance(q_tile, scores_operand(step, kFp8HeadTile).start),
                step > 0);
          }
          wgmma_commit();
          wgmma_wait<0>();
          wgmma_fence_accumulators(dot);
#pragma unroll
          for (int i = 0; i < 32; ++i)
            dot[i] *= key_scale[(i / 2) % 2][0];
        } else {
#pragma unroll
          for (int pair = 0; pair < kFp8Steps / 2; ++pair) {
            float group[2][32];
            wgmma_fence();
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int step = 2 * pair + j;
              wgmma_m64n64k32_e4m3_a_registers(
                  group[j], a[step],
                  wgmma_descriptor_advance(q_tile, scores_operand(step, kFp8HeadTile).start),
                  false);
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_accumulators(group[0]);
            wgmma_fence_accumulators(group[1]);
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              add_scaled_group(dot, group[j], 2 * pair + j, key_scale, remainder,
                               staged.multipliers, head_tile, thread);
            }
          }
        }
#pragma unroll
        for (int i = 0; i < 32; ++i) {
          const float w = staged.weights[head_tile * kFp8HeadTile + wgmma_d_coord(thread, i).col];
          sum[(i / 2) % 2] += relu_keep_nan(dot[i]) * w;
        }
      }
      write_quad_rows(sum, tile * kWarpgroupEntries, upper, t, count, out, first_level,
                      [](float total) { return total; });
    }
  }
}

// The key values a lane holds on CUDA cores: dims 4 lane .. 4 lane + 3 of the entry at `place`,
// decoded like the CPU backend decodes them.
template <KeyFormat kFormat>
__device__ __forceinline__ void decode_lane_key(const IndexerProblem& p, const EntryPlace& place,
                                                int lane, float (&key)[4]) {
  constexpr int64_t kDataBytes = key_data_bytes(kFormat);
  const uint8_t* data = place.page + place.offset * kDataBytes;
  const uint8_t* scales =
      place.page + p.keys.block_size * kDataBytes + place.offset * key_scale_bytes(kFormat);
  if constexpr (kFormat == KeyFormat::kFP8) {
    const float scale = *reinterpret_cast<const float*>(scales);
    for (int i = 0; i < 4; ++i)
      key[i] = decode_e4m3(data[4 * lane + i]) * scale;
  } else {
    const float scale = kFormat == KeyFormat::kMXFP4 ? decode_ue8m0(scales[lane / 8])
                                                     : decode_e4m3(scales[lane / 4]);
    for (int i = 0; i < 4; ++i) {
      const uint8_t byte = data[2 * lane + i / 2];
      key[i] = decode_e2m1(static_cast<uint8_t>((byte >> (4 * (i & 1))) & 0xf)) * scale;
    }
  }
}

// CUDA cores, the plain way: one warp per entry, lane l holds dims 4l .. 4l + 3 (decoded like
// the CPU backend does), fp32 dot per head, heads summed in order. For MXFP4 q the dot is the
// CPU's: each scale group's (8 lanes) sum, exact, then the groups added in order.
template <QueryKind kQ, KeyFormat kFormat>
__device__ void score_cuda_core(const IndexerProblem& p, int64_t row, int64_t first, int64_t count,
                                const IndexLaunch& launch, const uint8_t* shared, uint32_t* out,
                                const KeyPages& pages) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const float* q = reinterpret_cast<const float*>(shared + launch.q);
  const float* weights = reinterpret_cast<const float*>(shared + launch.weights);
  for (int64_t e = warp; e < count; e += kWarps) {
    float key[4];
    decode_lane_key<kFormat>(p, place_of(p, row, first + e, pages), lane, key);
    float score = 0.0f;
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const float* qh = q + h * kIndexerKeyDim + 4 * lane;
      float dot = 0.0f;
      for (int i = 0; i < 4; ++i)
        dot += qh[i] * key[i];
      if constexpr (kQ == QueryKind::kMXFP4) {
        for (int offset = 4; offset > 0; offset >>= 1)
          dot += __shfl_xor_sync(kFullMask, dot, offset);
        float total = __shfl_sync(kFullMask, dot, 0);
        for (int g = 1; g < 4; ++g)
          total += __shfl_sync(kFullMask, dot, 8 * g);
        dot = total;
      } else {
        for (int offset = 16; offset > 0; offset >>= 1)
          dot += __shfl_xor_sync(kFullMask, dot, offset);
      }
      score += relu(dot) * weights[h];
    }
    if (lane == 0) out[e] = ordered_key(score);
  }
}

// Scores entries first .. first + count - 1 of the row into out[0 .. count) (shared or global
// memory) on the kernel's path; the warpgroup kernel also counts them into `first_level` when
// given.
// `kKeyRing`: the FP8 forms' keys through the launch's key ring (the workspace's scoring kernel).
template <ScoreKernel kScore, QueryKind kQ, KeyFormat kFormat, bool kKeyRing = false>
__device__ __forceinline__ void score_entries(const IndexerProblem& p, int64_t row, int64_t first,
                                              int64_t count, const IndexLaunch& launch,
                                              uint8_t* shared, uint32_t* out, bool wide,
                                              const KeyPages& pages, uint32_t* first_level,
                                              bool remainder) {
  if constexpr (kKeyRing && is_fp8_query(kQ) && kScore != ScoreKernel::kCudaCore) {
    score_warpgroup_ring<kQ>(p, row, first, count, launch, shared, out, wide, pages, first_level,
                             remainder);
  } else if constexpr (is_fp8_query(kQ) && kScore != ScoreKernel::kCudaCore) {
    score_warpgroup_fp8<kQ>(p, row, first, count, launch, shared, out, wide, pages, first_level,
                            remainder);
  } else if constexpr (kScore == ScoreKernel::kWarpgroup) {
    score_warpgroup<kQ, kFormat>(p, row, first, count, launch, shared, out, wide, pages,
                                 first_level);
  } else if constexpr (kScore == ScoreKernel::kWarp) {
    score_warp<kQ, kFormat>(p, row, first, count, launch, shared, out, wide, pages);
  } else {
    score_cuda_core<kQ, kFormat>(p, row, first, count, launch, shared, out, pages);
  }
}

// The dynamic shared memory from its first 1024-byte boundary: wgmma swizzles by shared-address
// bits, and a cluster's select addresses its peers' memory by offsets from there (the same in
// every CTA of the cluster).
__device__ __forceinline__ uint8_t* aligned_shared(uint8_t* bytes) {
  return bytes + (kIndexSharedAlignment - shared_address(bytes) % kIndexSharedAlignment) %
                     kIndexSharedAlignment;
}

// The select's first-level histogram (select_layout's buffer 0) where a kernel counts that level
// while it fills the keys (`counted`), else nullptr.
__device__ __forceinline__ uint32_t* first_level_of(uint8_t* shared, const IndexLaunch& launch,
                                                    bool counted) {
  return counted
             ? reinterpret_cast<uint32_t*>(shared + select_layout(launch.sort_capacity).histogram)
             : nullptr;
}

__device__ __forceinline__ void zero_first_level(uint32_t* first_level) {
  if (first_level == nullptr) return;
  for (int bin = threadIdx.x; bin < hdk::detail::kSelectBins; bin += kThreads)
    first_level[bin] = 0;
}

// A CTA's contiguous share of a row: entries first .. last - 1.
struct Segment {
  int64_t first, last;
};

// Share `part` of a row of `length` entries split evenly over `parts` CTAs (a cluster's).
__device__ __forceinline__ Segment cluster_segment(int64_t length, int parts, int part) {
  const int64_t share = ceil_div(length, parts);
  const int64_t first = min(length, part * share);
  return Segment{first, min(length, first + share)};
}

// 1. Weights and queries to shared memory; the row's validity (finite queries and weights,
// num_entries in range, block ids of the used pages in range), which every CTA of the row reaches
// alike from the same values. `segment_of(length)` is this CTA's share of a row of `length`
// entries: the block ids of its pages are kept in shared memory when they fit (`pages`). Zeroes
// `first_level` when given. Every thread calls it; it ends with a barrier and returns whether the
// row is invalid, with num_entries in `length`.
template <ScoreKernel kScore, QueryKind kQ, typename SegmentOf>
__device__ bool stage_row(const IndexerProblem& p, int64_t row, const IndexLaunch& launch,
                          uint8_t* shared, uint32_t* first_level, SegmentOf&& segment_of,
                          int64_t& length, KeyPages& pages, bool& remainder) {
  const int tid = threadIdx.x;
  float* weights = reinterpret_cast<float*>(shared + launch.weights);
  // A load does not pass a store to shared memory through a generic pointer, so the loads go out
  // in batches ahead of the stores they feed: num_entries, this thread's weight and the block ids
  // of the row's first pages (any page below max_blocks is in the table) together with the
  // queries.
  bool bad = false;
  length = p.num_entries.at(row);
  const float own_weight = tid < p.num_heads
                               ? p.weights[row * p.weights_row_stride + tid * p.weights_head_stride]
                               : 0.0f;
  constexpr int kPageBatch = 4;  // block ids a thread loads before it checks them
  int64_t blocks[kPageBatch];
  auto load_blocks = [&](int64_t first_page) {
#pragma unroll
    for (int i = 0; i < kPageBatch; ++i) {
      const int64_t page = first_page + tid + i * kThreads;
      blocks[i] = page < p.max_blocks ? p.block_table.at(row, page) : 0;
    }
  };
  load_blocks(0);
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
    const Segment segment = segment_of(length);
    if (segment.last > segment.first) {
      pages.first_cached = segment.first / block_size;
      if ((segment.last - 1) / block_size - pages.first_cached < launch.page_capacity)
        pages.cached = reinterpret_cast<const int32_t*>(shared + launch.pages);
    }
    int32_t* cache = reinterpret_cast<int32_t*>(shared + launch.pages);
    const int64_t page_count = ceil_div(length, block_size);
    for (int64_t base = 0; base < page_count; base += kPageBatch * kThreads) {
      if (base > 0) load_blocks(base);
#pragma unroll
      for (int i = 0; i < kPageBatch; ++i) {
        const int64_t page = base + tid + i * kThreads;
        if (page >= page_count) break;
        const int64_t block = blocks[i];
        bad |= block < 0 || block >= p.keys.num_blocks;
        const int64_t slot = page - pages.first_cached;
        if (pages.cached != nullptr && slot >= 0 && slot < launch.page_capacity)
          cache[slot] = static_cast<int32_t>(block);  // block_table is int32
      }
    }
  }
  // The row's verdicts; also the barrier after staging.
  remainder = kQ == QueryKind::kMXFP4 && __syncthreads_or(own_remainder ? 1 : 0) != 0;
  return __syncthreads_or(bad ? 1 : 0) != 0;
}

// 2 and 3, for the one-launch kernel and the workspace's select kernel alike: every CTA of the
// row's cluster takes its share of the row (cluster_segment), whose keys `fill(first, count, out,
// counts)` puts in out[0 .. count) for entries first .. first + count - 1 (counting each into
// `counts`, the select's first level, when that is not null), and the cluster selects; the leader
// writes the outputs. `length` is 0 for an invalid row (padding only). `first_level`: the
// first-level histogram, zeroed before the caller's last barrier, where `fill` may count it.
template <typename Fill>
__device__ void select_row(const IndexerProblem& p, int64_t row, int64_t length,
                           const IndexLaunch& launch, uint8_t* shared, uint32_t* first_level,
                           Fill&& fill) {
  cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int tid = threadIdx.x;
  uint32_t* scores = reinterpret_cast<uint32_t*>(shared + launch.scores);

  const int64_t want = length < p.top_k ? length : p.top_k;
  int32_t* out_indices = p.topk_indices + row * p.topk_indices_row_stride;
  float* out_scores =
      p.topk_scores != nullptr ? p.topk_scores + row * p.topk_scores_row_stride : nullptr;
  int32_t* out_slots =
      p.topk_slots != nullptr ? p.topk_slots + row * p.topk_slots_row_stride : nullptr;
  if (want == 0) {  // the same in every CTA of the cluster: none touches another's memory
    if (rank == 0) {
      for (int64_t j = tid; j < p.top_k; j += kThreads) {
        out_indices[j] = -1;
        if (out_scores != nullptr) out_scores[j] = -INFINITY;
        if (out_slots != nullptr) out_slots[j] = -1;
      }
    }
    return;
  }

  // 2. Keys of the segment, kept in shared memory when they fit (always up to 8 x chunk).
  const Segment segment = cluster_segment(length, cluster_size, rank);
  const int64_t begin = segment.first;
  const int64_t size = segment.last - segment.first;
  const bool resident = size <= launch.chunk;
  // Counted while filled only when every key is filled once, before the select.
  uint32_t* const counts = resident ? first_level : nullptr;
  if (resident && size > 0) fill(begin, size, scores, counts);
  __syncthreads();

  // 3. The cluster's select over the keys; rounds of one key per thread.
  auto for_each_entry = [&](bool /*first*/, auto&& visit) {
    for (int64_t chunk = 0; chunk < size; chunk += launch.chunk) {
      const int count = static_cast<int>(min(launch.chunk, size - chunk));
      if (!resident) {
        __syncthreads();  // the previous chunk's keys are all visited
        fill(begin + chunk, count, scores, nullptr);
        __syncthreads();
      }
      for (int base = 0; base < count; base += kThreads) {
        const int i = base + tid;
        visit(scores[min(i, count - 1)], static_cast<uint32_t>(begin + chunk + i), i < count);
      }
    }
  };
  // Winners and candidates go to the leader in batches of 4 rounds (cluster_select.cuh): the
  // select runs after the scoring, whose registers it reuses.
  if (!cluster_select<4>(shared, launch.sort_capacity, want, length, for_each_entry,
                         counts != nullptr)) {
    return;
  }

  // The slots of a batch of outputs are looked up before any output is written: the compiler
  // cannot tell the stores from the block-table loads, and a loop of one of each waited a
  // memory latency an output.
  const uint64_t* sorted =
      reinterpret_cast<const uint64_t*>(shared + select_layout(launch.sort_capacity).sorted);
  constexpr int kOutputBatch = 4;
  for (int64_t base = tid; base < p.top_k; base += kOutputBatch * kThreads) {
    uint64_t entry[kOutputBatch];
    int64_t slot[kOutputBatch];
#pragma unroll
    for (int b = 0; b < kOutputBatch; ++b) {
      const int64_t j = base + b * kThreads;
      entry[b] = j < want ? sorted[j] : 0;
      // The key cache's slot of the entry: validation checked that every slot fits int32.
      slot[b] = j < want && out_slots != nullptr ? p.slot(row, column_of(entry[b])) : -1;
    }
#pragma unroll
    for (int b = 0; b < kOutputBatch; ++b) {
      const int64_t j = base + b * kThreads;
      if (j >= p.top_k) break;
      const bool found = j < want;
      out_indices[j] = found ? static_cast<int32_t>(column_of(entry[b])) : -1;
      if (out_scores != nullptr)
        out_scores[j] = found ? value_of_key(static_cast<uint32_t>(entry[b] >> 32)) : -INFINITY;
      if (out_slots != nullptr) out_slots[j] = static_cast<int32_t>(slot[b]);
    }
  }
}

// The one-launch kernel: a cluster per row stages, scores its segments into shared memory (again
// on every pass of the select where they do not fit) and selects.
template <ScoreKernel kScore, QueryKind kQ, KeyFormat kFormat>
__global__ void __launch_bounds__(kThreads, 1)
    index_topk_kernel(IndexerProblem p, IndexLaunch launch, FastDivide page_divide, bool wide) {
  hdk::detail::begin_dependent_kernel();
  cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / cluster_size;
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  uint8_t* shared = aligned_shared(shared_bytes);
  // The warpgroup kernel counts the select's first level while it scores, where the plan keeps
  // that histogram apart from the staged data.
  uint32_t* const first_level =
      first_level_of(shared, launch, kScore == ScoreKernel::kWarpgroup && launch.count_first_level);
  KeyPages pages;
  pages.divide = page_divide;
  int64_t length = 0;
  bool remainder = false;
  const bool bad = stage_row<kScore, kQ>(
      p, row, launch, shared, first_level,
      [&](int64_t entries) { return cluster_segment(entries, cluster_size, rank); }, length, pages,
      remainder);
  if (bad) {
    length = 0;
    if (rank == 0 && threadIdx.x == 0) count_invalid(p.invalid_count);
  }
  select_row(p, row, length, launch, shared, first_level,
             [&](int64_t first, int64_t count, uint32_t* out, uint32_t* counts) {
               score_entries<kScore, kQ, kFormat>(p, row, first, count, launch, shared, out, wide,
                                                  pages, counts, remainder);
             });
}

// Scoring through the workspace, over every SM: CTA `segment` of the row's `segments` scores its
// share (index_score_segment) straight into the row's workspace keys; segment 0 writes the row's
// invalid flag, the only word of the row that every call writes whatever the row holds. A launch
// takes rows row_base .., the workspace's row r holding row row_base + r. `kKeyRing`: the FP8
// forms' keys through the launch's key ring in shared memory, not registers, two CTAs an SM.
template <ScoreKernel kScore, QueryKind kQ, KeyFormat kFormat, bool kKeyRing>
__global__ void __launch_bounds__(kThreads, kKeyRing ? 2 : 1)
    index_score_kernel(IndexerProblem p, IndexLaunch launch, IndexWorkspaceLayout layout,
                       int segments, int64_t row_base, FastDivide page_divide, bool wide) {
  hdk::detail::begin_dependent_kernel();
  const int64_t local_row = blockIdx.x / segments;
  const int64_t row = row_base + local_row;
  const int segment = static_cast<int>(blockIdx.x % segments);
  auto segment_of = [&](int64_t entries) {
    const int64_t share = index_score_segment(entries, segments);
    const int64_t first = min(entries, segment * share);
    return Segment{first, min(entries, first + share)};
  };
  // A CTA past the row's entries has nothing to do (segment 0 always runs, for the flag); one
  // with entries stages and checks the row itself rather than wait for segment 0's verdict.
  const int64_t entries = p.num_entries.at(row);
  if (segment > 0 && (entries < 0 || entries > p.max_blocks * p.keys.block_size ||
                      segment_of(entries).first >= entries)) {
    return;
  }
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  uint8_t* shared = aligned_shared(shared_bytes);
  KeyPages pages;
  pages.divide = page_divide;
  int64_t length = 0;
  bool remainder = false;
  const bool bad =
      stage_row<kScore, kQ>(p, row, launch, shared, nullptr, segment_of, length, pages, remainder);
  if (segment == 0 && threadIdx.x == 0)
    reinterpret_cast<int32_t*>(p.workspace + layout.flags_offset)[local_row] = bad ? 1 : 0;
  if (bad) return;
  const Segment share = segment_of(length);
  if (share.last <= share.first) return;
  uint32_t* keys =
      reinterpret_cast<uint32_t*>(p.workspace + layout.keys_offset) + local_row * layout.row_stride;
  score_entries<kScore, kQ, kFormat, kKeyRing>(p, row, share.first, share.last - share.first,
                                               launch, shared, keys + share.first, wide, pages,
                                               nullptr, remainder);
}

// Workspace keys a select thread has in flight at once.
constexpr int kFillBatch = 16;

// The select through the workspace: a cluster per row loads its segments' keys from the row's
// workspace keys in place of scoring them (counting the first level as it goes) and selects
// as the one-launch kernel does.
__global__ void __launch_bounds__(kThreads, 1)
    index_select_kernel(IndexerProblem p, IndexLaunch launch, IndexWorkspaceLayout layout,
                        int64_t row_base) {
  // Waits, but never lets the next kernel start early, though its grid is small: sparse_decode
  // scheduled during the select ran slower by more than the launch it hid (Flash CSA step at
  // N = 2 and 4, 65536 context, H200: 77.7 and 79.8 us with the early start, 69.4 and 71.5
  // without; no step cell slower, docs/dsv4-attention.md).
  hdk::detail::wait_for_prior_grid();
  cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t local_row = blockIdx.x / cluster_size;
  const int64_t row = row_base + local_row;
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  uint8_t* shared = aligned_shared(shared_bytes);
  uint32_t* const first_level = first_level_of(shared, launch, launch.count_first_level);
  zero_first_level(first_level);
  // Both loads go out together (num_entries is read even for an invalid row).
  const int32_t flag =
      reinterpret_cast<const int32_t*>(p.workspace + layout.flags_offset)[local_row];
  const int64_t entries = p.num_entries.at(row);
  const bool bad = flag != 0;
  const int64_t length = bad ? 0 : entries;
  if (bad && rank == 0 && threadIdx.x == 0) count_invalid(p.invalid_count);
  __syncthreads();  // the histogram is zero before any count
  const uint32_t* keys = reinterpret_cast<const uint32_t*>(p.workspace + layout.keys_offset) +
                         local_row * layout.row_stride;
  select_row(p, row, length, launch, shared, first_level,
             [&](int64_t first, int64_t count, uint32_t* out, uint32_t* counts) {
               // kFillBatch loads a thread before any store: the compiler cannot tell the
               // shared stores from the workspace loads, so a loop of one of each waited a
               // memory latency a key.
               for (int64_t base = 0; base < count; base += kFillBatch * kThreads) {
                 uint32_t key[kFillBatch];
#pragma unroll
                 for (int j = 0; j < kFillBatch; ++j) {
                   const int64_t i = base + threadIdx.x + j * kThreads;
                   key[j] = i < count ? keys[first + i] : 0u;
                 }
#pragma unroll
                 for (int j = 0; j < kFillBatch; ++j) {
                   const int64_t i = base + threadIdx.x + j * kThreads;
                   if (i >= count) break;
                   out[i] = key[j];
                   if (counts != nullptr)
                     atomicAdd(&counts[key[j] >> (32 - hdk::detail::kSelectDigitBits)], 1u);
                 }
               }
             });
}

using OneLaunchKernel = void (*)(IndexerProblem, IndexLaunch, FastDivide, bool);
using ScoringKernel = void (*)(IndexerProblem, IndexLaunch, IndexWorkspaceLayout, int, int64_t,
                               FastDivide, bool);

// The kernels of one scoring path, query dtype and key format.
// `scoring`: the workspace's scoring kernel that reads keys into registers; `scoring_ring`: the
// one that streams them through the key ring (the FP8 forms on tensor cores; E4M3 keys always
// take it, MXFP4 keys where index_mxfp4_ring_pays), nullptr for the other forms.
struct Kernels {
  OneLaunchKernel one_launch;
  ScoringKernel scoring;
  ScoringKernel scoring_ring;
};

template <ScoreKernel kScore, QueryKind kQ, KeyFormat kFormat>
Kernels kernels_of() {
  constexpr bool kRing = is_fp8_query(kQ) && kScore != ScoreKernel::kCudaCore;
  if constexpr (kRing && kQ == QueryKind::kE4M3) {
    return Kernels{index_topk_kernel<kScore, kQ, kFormat>, nullptr,
                   index_score_kernel<kScore, kQ, kFormat, true>};
  } else if constexpr (kRing) {
    return Kernels{index_topk_kernel<kScore, kQ, kFormat>,
                   index_score_kernel<kScore, kQ, kFormat, false>,
                   index_score_kernel<kScore, kQ, kFormat, true>};
  } else {
    return Kernels{index_topk_kernel<kScore, kQ, kFormat>,
                   index_score_kernel<kScore, kQ, kFormat, false>, nullptr};
  }
}

// The exact forms' kernels (bf16 tensor cores or CUDA cores).
template <ScoreKernel kScore>
Kernels pick_kernels(QueryKind query, KeyFormat format) {
  if (query == QueryKind::kFp32) {
    return format == KeyFormat::kMXFP4 ? kernels_of<kScore, QueryKind::kFp32, KeyFormat::kMXFP4>()
                                       : kernels_of<kScore, QueryKind::kFp32, KeyFormat::kNVFP4>();
  }
  return format == KeyFormat::kMXFP4 ? kernels_of<kScore, QueryKind::kBf16, KeyFormat::kMXFP4>()
                                     : kernels_of<kScore, QueryKind::kBf16, KeyFormat::kNVFP4>();
}

// The FP8 forms run on FP8 tensor cores at any head count (kWarpgroup, whatever the path asks
// for) or, asked for, on CUDA cores.
Kernels pick_kernels(ScoreKernel score, QueryKind query, KeyFormat format) {
  if (query == QueryKind::kE4M3) {
    return score == ScoreKernel::kCudaCore
               ? kernels_of<ScoreKernel::kCudaCore, QueryKind::kE4M3, KeyFormat::kFP8>()
               : kernels_of<ScoreKernel::kWarpgroup, QueryKind::kE4M3, KeyFormat::kFP8>();
  }
  if (query == QueryKind::kMXFP4) {
    return score == ScoreKernel::kCudaCore
               ? kernels_of<ScoreKernel::kCudaCore, QueryKind::kMXFP4, KeyFormat::kMXFP4>()
               : kernels_of<ScoreKernel::kWarpgroup, QueryKind::kMXFP4, KeyFormat::kMXFP4>();
  }
  switch (score) {
    case ScoreKernel::kWarpgroup:
      return pick_kernels<ScoreKernel::kWarpgroup>(query, format);
    case ScoreKernel::kWarp:
      return pick_kernels<ScoreKernel::kWarp>(query, format);
    case ScoreKernel::kCudaCore:
      break;
  }
  return pick_kernels<ScoreKernel::kCudaCore>(query, format);
}

QueryKind query_kind(const IndexerProblem& p) {
  switch (p.q_form) {
    case IndexQueryForm::kE4M3:
      return QueryKind::kE4M3;
    case IndexQueryForm::kMXFP4:
      return QueryKind::kMXFP4;
    case IndexQueryForm::kExact:
      break;
  }
  return p.q.dtype == DType::kFloat32 ? QueryKind::kFp32 : QueryKind::kBf16;
}

}  // namespace

void set_index_score_path(IndexScorePath path) {
  g_score_path.store(static_cast<int>(path), std::memory_order_relaxed);
}

IndexScorePath index_score_path() {
  return static_cast<IndexScorePath>(g_score_path.load(std::memory_order_relaxed));
}

namespace {

// What a call launches: the kernels of its scoring path, the one-launch plan and, with a
// workspace, the workspace plan (segments > 0 where it is used).
struct IndexLaunchChoice {
  Kernels kernels;
  IndexLaunchPlan plan;
  IndexWorkspacePlan workspace;
  FastDivide pages;
  bool wide = false;
};

IndexLaunchChoice choose_launch(const IndexerProblem& p, int device) {
  const int64_t block_size = p.keys.block_size;
  const int64_t capacity = p.max_blocks * block_size;
  if (capacity > INT_MAX) {
    throw Error(std::string(kOperation) + ": block_table's " + std::to_string(p.max_blocks) +
                " pages of " + std::to_string(block_size) + " entries exceed the " +
                std::to_string(INT_MAX) + " entries per row the int32 indices can name");
  }
  // Key pages hold 4-byte (MXFP4, FP8) or 8-byte (NVFP4) scale words read whole (as the KV cache
  // kernels do); 16-byte code loads when the pool allows them.
  const int64_t alignment = key_scale_bytes(p.format);
  const uintptr_t base = reinterpret_cast<uintptr_t>(p.keys.data);
  if (base % alignment != 0 || p.keys.page_stride % alignment != 0) {
    throw Error(std::string(kOperation) + ": argument 'key_cache' must be " +
                std::to_string(alignment) +
                "-byte aligned with a page stride that is a multiple of " +
                std::to_string(alignment) + " bytes on CUDA");
  }
  IndexLaunchChoice choice;
  choice.wide = base % 16 == 0 && p.keys.page_stride % 16 == 0;
  const IndexScorePath path = index_score_path();
  const bool tensor = path != IndexScorePath::kCudaCore;
  const ScoreKernel score =
      path == IndexScorePath::kCudaCore ? ScoreKernel::kCudaCore
      : path == IndexScorePath::kTensorCore && warpgroup_scoring_fits(p.num_heads)
          ? ScoreKernel::kWarpgroup
          : ScoreKernel::kWarp;
  const QueryKind query = query_kind(p);
  const bool fp32_q = query == QueryKind::kFp32;
  // The FP8 kernel stages whole tiles of 64 heads (codes, then MXFP4's multipliers: less than
  // the bf16 bytes the plan keeps for as many heads).
  const int64_t planned_heads = is_fp8_query(query) && tensor
                                    ? ceil_div(p.num_heads, kFp8HeadTile) * kFp8HeadTile
                                    : p.num_heads;

  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  const int shared_limit = hdk::detail::cached_device_attribute(
      cudaDevAttrMaxSharedMemoryPerBlockOptin, device, kOperation);

  choice.kernels = pick_kernels(score, query, p.format);
  // The kernels run one CTA per SM (their registers), whatever shared memory they take.
  hdk::detail::allow_dynamic_shared_memory(choice.kernels.one_launch, shared_limit, device,
                                           kOperation);
  // Every size; above 8 the non-portable sizes, 0 where the device does not run them.
  const hdk::detail::ResidentClusterCounts& clusters = hdk::detail::resident_clusters(
      choice.kernels.one_launch, kThreads, static_cast<size_t>(shared_limit), device, kOperation);
  choice.plan = plan_index_launch(p.num_rows, planned_heads, capacity, p.top_k, tensor, fp32_q,
                                  sm_count, shared_limit, clusters);
  if (p.workspace != nullptr) {
    hdk::detail::allow_dynamic_shared_memory(index_select_kernel, shared_limit, device, kOperation);
    const hdk::detail::ResidentClusterCounts& select_clusters = hdk::detail::resident_clusters(
        index_select_kernel, kThreads, static_cast<size_t>(shared_limit), device, kOperation);
    // The FP8 forms' scoring kernel's key ring (index_score_kernel).
    const bool mxfp4_ring =
        query == QueryKind::kMXFP4 && index_mxfp4_ring_pays(p.num_rows, capacity);
    const size_t key_ring_bytes = !tensor                     ? 0
                                  : query == QueryKind::kE4M3 ? fp8_key_ring_bytes(kWarpgroups)
                                  : mxfp4_ring                ? mxfp4_key_ring_bytes(kWarpgroups)
                                                              : 0;
    choice.workspace =
        plan_index_workspace(p.num_rows, planned_heads, capacity, p.top_k, tensor, fp32_q, sm_count,
                             shared_limit, choice.plan, select_clusters, key_ring_bytes);
    // The scoring kernel's shared memory has a ring exactly when the plan gave it one.
    if (key_ring_bytes > 0) choice.kernels.scoring = choice.kernels.scoring_ring;
    if (choice.workspace.segments > 0) {
      if (choice.kernels.scoring == nullptr) {
        throw Error(std::string(kOperation) + ": internal error: no scoring kernel for the plan");
      }
      hdk::detail::allow_dynamic_shared_memory(choice.kernels.scoring, shared_limit, device,
                                               kOperation);
    }
  }
  // Entry ordinals are below capacity <= INT_MAX; a larger block size comes only with no pages
  // (nothing is ever located then).
  choice.pages = FastDivide(static_cast<uint32_t>(std::min<int64_t>(block_size, INT_MAX)));
  const int cluster_size = choice.plan.cluster_size;
  if (p.num_rows > INT_MAX / cluster_size) {
    throw Error(std::string(kOperation) + ": the CUDA backend takes at most " +
                std::to_string(INT_MAX / cluster_size) + " rows per call, got " +
                std::to_string(p.num_rows));
  }
  return choice;
}

}  // namespace

IndexLaunchReport index_topk_launch_report(const IndexerProblem& p, int device) {
  IndexLaunchReport report;
  if (p.num_rows == 0) return report;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const IndexLaunchChoice choice = choose_launch(p, device);
  report.segments = choice.workspace.segments;
  report.cluster_size =
      report.segments > 0 ? choice.workspace.select.cluster_size : choice.plan.cluster_size;
  return report;
}

void index_topk_cuda(const IndexerProblem& p, int device, CudaStream stream) {
  if (p.num_rows == 0) return;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const IndexLaunchChoice choice = choose_launch(p, device);
  const cudaStream_t cuda_stream = reinterpret_cast<cudaStream_t>(stream);
  const IndexWorkspacePlan& workspace = choice.workspace;
  if (workspace.segments > 0) {
    // attention.cpp checked that the workspace holds index_topk_workspace_bytes. Each pair of
    // launches takes the next rows_per_launch rows; the select never lets the next kernel start
    // before it ends, so the next scoring writes the workspace after it is read.
    const IndexLaunchPlan& select = workspace.select;
    for (int64_t base = 0; base < p.num_rows; base += workspace.rows_per_launch) {
      const int64_t rows = std::min(workspace.rows_per_launch, p.num_rows - base);
      hdk::detail::check_launch(
          hdk::detail::launch_dependent(
              choice.kernels.scoring, static_cast<unsigned>(rows * workspace.segments), kThreads,
              workspace.score.bytes, cuda_stream, p, workspace.score, workspace.layout,
              static_cast<int>(workspace.segments), base, choice.pages, choice.wide),
          kOperation, "launching index_score_kernel");
      hdk::detail::check_launch(
          hdk::detail::launch_in_clusters(
              index_select_kernel, static_cast<unsigned>(rows * select.cluster_size), kThreads,
              select.launch.bytes, cuda_stream, static_cast<unsigned>(select.cluster_size), p,
              select.launch, workspace.layout, base),
          kOperation, "launching index_select_kernel");
    }
    return;
  }
  const IndexLaunchPlan& plan = choice.plan;
  hdk::detail::check_launch(
      hdk::detail::launch_in_clusters(
          choice.kernels.one_launch, static_cast<unsigned>(p.num_rows * plan.cluster_size),
          kThreads, plan.launch.bytes, cuda_stream, static_cast<unsigned>(plan.cluster_size), p,
          plan.launch, choice.pages, choice.wide),
      kOperation, "launching index_topk_kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
