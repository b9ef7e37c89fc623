// Scoring on bf16 tensor cores, keys converted in registers (bf16 or fp32 q, hi then lo): the
// warpgroup kernel (wgmma m64n64k16, up to 64 heads; its MXFP4 keys loaded into registers or, in
// the workspace's scoring kernel, streamed through the key ring) and the warp kernel (mma.sync
// m16n8k16, any head count).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16_pairs.h"
#include "core/ceil_div.h"
#include "core/cuda/gate_mma.cuh"
#include "core/cuda/shared_address.cuh"
#include "core/cuda/wgmma.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/cuda/index_key_loads.cuh"
#include "dsv4/index_topk/cuda/index_key_ring.cuh"
#include "dsv4/index_topk/cuda/index_topk_device.cuh"
#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "dsv4/index_topk/index_mma_layout.h"
#include "dsv4/index_topk/index_wgmma_layout.h"
#include "dsv4/kv_cache/kv_formats.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

// The A fragments of a tile's k-steps from this thread's pieces of its two MXFP4 entries (rows
// upper and upper + 8 of its warp's 16: words of dims 32t .. 32t + 31 and their scale bytes).
// Scale bytes above 136 (scales above 2^9, NaN) take two multiplies; a warp that has one converts
// every piece that way (the same exact values).
__device__ __forceinline__ void mxfp4_rows_fragments(const uint32_t (&upper)[4],
                                                     const uint32_t (&lower)[4],
                                                     const uint32_t (&scale_bytes)[2],
                                                     uint32_t (&a)[2][16]) {
  if (__any_sync(kFullMask,
                 mxfp4_needs_two_steps(scale_bytes[0]) || mxfp4_needs_two_steps(scale_bytes[1]))) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t scale = scale_pair(decode_ue8m0(static_cast<uint8_t>(scale_bytes[r])));
      entry_fragments<true>(r == 0 ? upper : lower, scale, scale, a[r]);
    }
  } else {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const uint32_t scale = mxfp4_placed_multiplier(scale_bytes[r]);
      entry_fragments<false>(r == 0 ? upper : lower, scale, scale, a[r]);
    }
  }
}

// A warpgroup kernel's staged q as a thread uses it: the weights of its accumulator columns
// (heads 8 j + 2t + (0, 1)), for good, and the B descriptors of k-step 0 (the other steps' are
// fixed byte offsets from them).
struct WarpgroupQuery {
  float weight[kWarpgroupHeads / 4];
  uint64_t q_hi, q_lo;
};
__device__ __forceinline__ WarpgroupQuery warpgroup_query(const uint8_t* shared,
                                                          const IndexLaunch& launch, int thread) {
  WarpgroupQuery query;
  const float* staged_weights = reinterpret_cast<const float*>(shared + launch.weights);
#pragma unroll
  for (int i = 0; i < kWarpgroupHeads / 4; ++i)
    query.weight[i] = staged_weights[wgmma_d_coord(thread, 4 * (i / 2) + i % 2).col];
  query.q_hi =
      wgmma_descriptor(shared_address(shared + launch.q), scores_operand(0, kWarpgroupHeads));
  query.q_lo =
      wgmma_descriptor(shared_address(shared + launch.q_lo), scores_operand(0, kWarpgroupHeads));
  return query;
}

// D = A x q for a tile (accumulator i: row upper + 8 ((i / 2) % 2), head wgmma_d_coord(thread,
// i).col): 8 k-steps of wgmma m64n64k16 against the staged q (`q_hi`'s descriptor; fp32 q adds
// its lo half), waited for.
template <bool kFp32Q>
__device__ __forceinline__ void multiply_tile(float (&d)[32], const uint32_t (&a)[2][16],
                                              uint64_t q_hi, uint64_t q_lo) {
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
}

// The thread's two rows' sums over its 16 heads of relu(D) x weight (NaN kept).
__device__ __forceinline__ void weighted_rows(const float (&d)[32],
                                              const float (&weight)[kWarpgroupHeads / 4],
                                              float (&sum)[2]) {
#pragma unroll
  for (int i = 0; i < 32; ++i)
    sum[(i / 2) % 2] += relu_keep_nan(d[i]) * weight[2 * (i / 4) + i % 2];
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
  const int thread = threadIdx.x % 128;
  const int t = threadIdx.x & 3;
  const int upper = wgmma_d_coord(thread, 0).row;  // this thread's rows: upper and upper + 8
  const WarpgroupQuery query = warpgroup_query(shared, launch, thread);
  struct Fragments {
    uint32_t a[2][16];
  };
  for_each_register_tile<RawPiece>(
      first, count, upper,
      [&](int64_t s) { return load_raw_piece<kFormat>(p, row, s, t, wide, pages); },
      [&](const RawPiece(&rows)[2]) {
        Fragments f;
        if (kFormat == KeyFormat::kMXFP4) {
          const uint32_t scale_bytes[2] = {rows[0].scale_bytes, rows[1].scale_bytes};
          mxfp4_rows_fragments(rows[0].words, rows[1].words, scale_bytes, f.a);
        } else {
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const uint32_t bytes = rows[r].scale_bytes;
            entry_fragments<false>(
                rows[r].words,
                nvfp4_placed_multiplier(decode_e4m3(static_cast<uint8_t>(bytes & 0xffu))),
                nvfp4_placed_multiplier(decode_e4m3(static_cast<uint8_t>(bytes >> 8))), f.a[r]);
          }
        }
        return f;
      },
      [&](int64_t tile, const Fragments& f) {
        float d[32];
        multiply_tile<kFp32Q>(d, f.a, query.q_hi, query.q_lo);
        float sum[2] = {0.0f, 0.0f};
        weighted_rows(d, query.weight, sum);
        // A carried 2^-kPlacedShift: exact back (a power of two), not folded into the weights,
        // which could then overflow.
        write_quad_rows(sum, tile * kWarpgroupEntries, upper, t, count, out, first_level,
                        [](float total) { return total * kPlacedScoreFactor; });
      });
}

// The exact q (bf16, or fp32 as hi + lo) over MXFP4 keys, up to 64 heads, the workspace's scoring
// kernel: score_warpgroup's products and scores, bit for bit, with the keys' stored bytes streamed
// through the key ring (stream_key_ring) instead of loaded into registers, so that a warpgroup
// keeps three tiles in flight and two CTAs share an SM. Thread t reads chunk t (scale group t)
// of its two entries, the 16 bytes score_warpgroup loads from memory (mxfp4_key_chunk_offset puts
// the 8 lanes of a 16-byte load phase, two entries' 4 chunks, in distinct banks).
template <QueryKind kQ>
__device__ void score_warpgroup_ring_exact(const IndexerProblem& p, int64_t row, int64_t first,
                                           int64_t count, const IndexLaunch& launch,
                                           uint8_t* shared, uint32_t* out, bool wide,
                                           const KeyPages& pages, uint32_t* first_level) {
  constexpr bool kFp32Q = kQ == QueryKind::kFp32;
  static_assert(kQ == QueryKind::kBf16 || kFp32Q, "the exact q forms");
  const int thread = threadIdx.x % 128;
  const int t = threadIdx.x & 3;
  const int upper = wgmma_d_coord(thread, 0).row;  // this thread's rows: upper and upper + 8
  const WarpgroupQuery query = warpgroup_query(shared, launch, thread);
  stream_key_ring<IndexQueryForm::kExact>(
      p, row, first, count, launch, shared, wide, pages, [&](const KeyRingTile& tile) {
        uint32_t words[2][4];
        uint32_t scale_bytes[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const uint4 v = *reinterpret_cast<const uint4*>(tile.codes +
                                                          mxfp4_key_chunk_offset(upper + 8 * r, t));
          words[r][0] = v.x, words[r][1] = v.y, words[r][2] = v.z, words[r][3] = v.w;
          scale_bytes[r] = (tile.scales[upper + 8 * r] >> (8 * t)) & 0xffu;
        }
        uint32_t a[2][16];
        mxfp4_rows_fragments(words[0], words[1], scale_bytes, a);
        float d[32];
        multiply_tile<kFp32Q>(d, a, query.q_hi, query.q_lo);
        float sum[2] = {0.0f, 0.0f};
        weighted_rows(d, query.weight, sum);
        write_quad_rows(sum, tile.entry, upper, t, count, out, first_level,
                        [](float total) { return total * kPlacedScoreFactor; });
      });
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

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
