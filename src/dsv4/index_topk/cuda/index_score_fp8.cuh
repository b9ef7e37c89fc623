// Scoring on FP8 tensor cores (E4M3 q over FP8 keys, packed MXFP4 q over MXFP4 keys, wgmma
// m64n64k32): the keys in registers (the one launch, score_warpgroup_fp8) or streamed through the
// key ring in shared memory (the workspace's scoring kernel, score_warpgroup_ring), the same
// fragments and the same scores either way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "core/ceil_div.h"
#include "core/cuda/shared_address.cuh"
#include "core/cuda/wgmma.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/cuda/index_key_loads.cuh"
#include "dsv4/index_topk/cuda/index_key_ring.cuh"
#include "dsv4/index_topk/cuda/index_topk_device.cuh"
#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "dsv4/index_topk/index_wgmma_layout.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

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
// upper + 8): E4M3 codes as they are, MXFP4 codes turned into the E4M3 codes of 2^-6 times their
// values.
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

// An entry's score from its weighted sum over the heads: the MXFP4 form's key codes hold 2^-6
// times their values (kMxfp4KeyCodeScale), so its sum is multiplied by 2^6 once.
template <QueryKind kQ>
__device__ __forceinline__ float fp8_entry_score(float total) {
  return kQ == QueryKind::kMXFP4 ? total * kMxfp4KeyCodeScale : total;
}

// The product of MXFP4 scale group `step` (exact in `group`) times both its scales, the key's
// (`key_scale`, per row) and, where the row has one (kRemainder), the head's multiplier, added to
// `dot` in group order: the one arithmetic of both FP8 tensor-core kernels, which give the same
// scores bit for bit. A group's scaled product is exact (a power of two times an exact sum, in
// fp32's normal range), so one fused multiply-add rounds as the product and the sum would: one
// FFMA an accumulator where an FMUL and an FADD had each taken the FMA pipe. The remainder is a
// template argument so that a caller can choose it once for many groups: chosen per group, the
// compiler merged group 0's two multiplies behind the branch and copied the key's scale into 32
// registers for it (32 moves a tile).
template <bool kRemainder>
__device__ __forceinline__ void add_scaled_group(float (&dot)[32], const float (&group)[32],
                                                 int step, const float (&key_scale)[2][kFp8Steps],
                                                 const float* multipliers, int head_tile,
                                                 int thread) {
#pragma unroll
  for (int i = 0; i < 32; ++i) {
    float scale = key_scale[(i / 2) % 2][step];
    if constexpr (kRemainder) {
      const int head = head_tile * kFp8HeadTile + wgmma_d_coord(thread, i).col;
      scale *= multipliers[4 * head + step];
    }
    dot[i] = step == 0 ? group[i] * scale : fmaf(group[i], scale, dot[i]);
  }
}

// The FP8 forms on FP8 tensor cores, the workspace's scoring kernel (E4M3 q over kFP8 keys, packed
// MXFP4 q over kMXFP4 keys): scores entries first .. first + count - 1 of the row into
// out[0 .. count), any head count, their stored bytes streamed through the key ring
// (stream_key_ring, index_key_ring.cuh). With no tile in registers the kernel takes 118 (E4M3) or
// 128 (MXFP4) registers where score_warpgroup_fp8 takes 226-254, and two CTAs share an SM. Each
// thread loads from the tile the very pieces score_warpgroup_fp8 loads from memory and builds the
// same A fragments, so both give the same scores bit for bit. E4M3: per staged 64-head tile of q
// one chain of 4 k-steps, the key's scale, relu (NaN kept), the heads' weights and the quad's sum.
// MXFP4: each k-step (scale group) alone into one set of accumulators (score_warpgroup_fp8 takes
// two at a time; a group's product is exact either way), times both scales, the groups added in
// order.
template <QueryKind kQ>
__device__ void score_warpgroup_ring(const IndexerProblem& p, int64_t row, int64_t first,
                                     int64_t count, const IndexLaunch& launch, uint8_t* shared,
                                     uint32_t* out, bool wide, const KeyPages& pages,
                                     uint32_t* first_level, bool remainder) {
  constexpr bool kE4M3 = kQ == QueryKind::kE4M3;
  constexpr IndexQueryForm kForm = kE4M3 ? IndexQueryForm::kE4M3 : IndexQueryForm::kMXFP4;
  const int thread = threadIdx.x % 128;
  const int t = threadIdx.x & 3;
  const int upper = wgmma_d_coord(thread, 0).row;  // this thread's rows: upper and upper + 8
  const Fp8StagedQuery staged = fp8_staged_query(shared, launch);
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
  stream_key_ring<
      kForm>(p, row, first, count, launch, shared, wide, pages, [&](const KeyRingTile& tile) {
    const uint32_t scale_words[2] = {tile.scales[upper], tile.scales[upper + 8]};
    float sum[2] = {0.0f, 0.0f};
    if constexpr (kE4M3) {
      const float key_scale[2] = {__uint_as_float(scale_words[0]), __uint_as_float(scale_words[1])};
      // This thread's two entries' bytes 32 t .. 32 t + 31 (chunks 2 t and 2 t + 1, which the
      // swizzle of the copies by thread pairs puts in distinct banks for the 8 lanes of a load
      // phase).
      uint32_t words[2][8];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int offset = fp8_key_piece_offset(upper + 8 * r, 2 * t + half, tile.whole_pages);
          const uint4 v = *reinterpret_cast<const uint4*>(tile.codes + offset);
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
              tile.codes + mxfp4_key_word_offset(upper + 8 * r, g, t, tile.whole_pages));
        }
      }
      uint32_t a[kFp8Steps][4];
      fp8_step_fragments<kQ>(words[0], words[1], a);
      // The row's remainder is chosen once a tile, for all its groups (add_scaled_group).
      auto multiply_head_tiles = [&](auto remainder) {
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
            add_scaled_group<decltype(remainder)::value>(dot, group, step, key_scale,
                                                         staged.multipliers, head_tile, thread);
          }
#pragma unroll
          for (int i = 0; i < 32; ++i)
            sum[(i / 2) % 2] += relu_keep_nan(dot[i]) * weights[(i / 4) * 2 + i % 2];
        }
      };
      if (remainder) {
        multiply_head_tiles(std::true_type{});
      } else {
        multiply_head_tiles(std::false_type{});
      }
    }
    write_quad_rows(sum, tile.entry, upper, t, count, out, first_level,
                    [](float total) { return fp8_entry_score<kQ>(total); });
  });
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
  const int thread = threadIdx.x % 128;
  const int t = threadIdx.x & 3;
  const int upper = wgmma_d_coord(thread, 0).row;  // this thread's rows: upper and upper + 8
  const Fp8StagedQuery staged = fp8_staged_query(shared, launch);
  using Piece = Fp8ScoringPiece<kQ>;
  struct Fragments {
    uint32_t a[kFp8Steps][4];
    // Per row: the key's scale (E4M3), or its 4 group scales (MXFP4).
    float key_scale[2][kQ == QueryKind::kE4M3 ? 1 : kFp8Steps];
  };
  for_each_register_tile<Piece>(
      first, count, upper, [&](int64_t s) { return load_fp8_piece<kQ>(p, row, s, t, wide, pages); },
      [&](const Piece(&rows)[2]) {
        Fragments f;
        fp8_step_fragments<kQ>(rows[0].words, rows[1].words, f.a);
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          if constexpr (kQ == QueryKind::kE4M3) {
            f.key_scale[r][0] = rows[r].scale;
          } else {
#pragma unroll
            for (int g = 0; g < kFp8Steps; ++g)
              f.key_scale[r][g] = mxfp4_group_scale(rows[r].scales, g);
          }
        }
        return f;
      },
      [&](int64_t tile, const Fragments& f) {
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
                  dot, f.a[step],
                  wgmma_descriptor_advance(q_tile, scores_operand(step, kFp8HeadTile).start),
                  step > 0);
            }
            wgmma_commit();
            wgmma_wait<0>();
            wgmma_fence_accumulators(dot);
#pragma unroll
            for (int i = 0; i < 32; ++i)
              dot[i] *= f.key_scale[(i / 2) % 2][0];
          } else {
#pragma unroll
            for (int pair = 0; pair < kFp8Steps / 2; ++pair) {
              float group[2][32];
              wgmma_fence();
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                const int step = 2 * pair + j;
                wgmma_m64n64k32_e4m3_a_registers(
                    group[j], f.a[step],
                    wgmma_descriptor_advance(q_tile, scores_operand(step, kFp8HeadTile).start),
                    false);
              }
              wgmma_commit();
              wgmma_wait<0>();
              wgmma_fence_accumulators(group[0]);
              wgmma_fence_accumulators(group[1]);
#pragma unroll
              for (int j = 0; j < 2; ++j) {
                if (remainder) {
                  add_scaled_group<true>(dot, group[j], 2 * pair + j, f.key_scale,
                                         staged.multipliers, head_tile, thread);
                } else {
                  add_scaled_group<false>(dot, group[j], 2 * pair + j, f.key_scale,
                                          staged.multipliers, head_tile, thread);
                }
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
                        [](float total) { return fp8_entry_score<kQ>(total); });
      });
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
