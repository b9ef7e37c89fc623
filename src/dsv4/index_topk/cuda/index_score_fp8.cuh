// Scoring on FP8 tensor cores (E4M3 q over FP8 keys, packed MXFP4 q over MXFP4 keys, wgmma
// m64n64k32): the keys in registers (the one launch, score_warpgroup_fp8) or streamed through the
// key ring in shared memory (the workspace's scoring kernel, score_warpgroup_ring), the same
// fragments and the same scores either way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/mbarrier.cuh"
#include "core/cuda/named_barrier.cuh"
#include "core/cuda/wgmma.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/cuda/index_key_loads.cuh"
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
  // E4M3 tiles that are whole pieces of a page (block_size a multiple of 64, the segment on a
  // tile boundary, 16-byte aligned pages: the scoring kernel's segments start on multiples of 64)
  // come as two bulk copies by one thread, codes and scales, completing on the stage's barrier:
  // no page lookup or copy by the other 127 threads. The codes then sit in the tile as stored,
  // 128 bytes an entry, without the swizzle (the 8 lanes of a load phase read two entries' same
  // chunks: 2-way bank conflicts), and every thread builds the same fragments from them. A
  // warpgroup with one tile copies it by thread pairs: there the one thread's lookup, copies and
  // barriers came to more than they saved (H200, one row of 16384 keys, 128 entries a CTA: 24.0
  // -> 24.8 us).
  const bool whole_pages =
      kE4M3 && index_key_ring_whole_pages(IndexQueryForm::kE4M3, wide, p.keys.block_size) &&
      first % kFp8TileEntries == 0 && own_tiles >= 2;
  uint64_t* const tile_landed =
      reinterpret_cast<uint64_t*>(shared + launch.key_ring + fp8_key_ring_barriers(kWarpgroups)) +
      warpgroup * kFp8KeyStages;
  auto issue_whole_page = [&](int64_t k) {
    if (k >= own_tiles) return;
    const int stage = static_cast<int>(k % kFp8KeyStages);
    const EntryPlace place =
        place_of(p, row, first + (warpgroup + k * kWarpgroups) * kFp8TileEntries, pages);
    // The warpgroup's reads of the stage's last tile (ordered before this by the named barrier)
    // come before the copy's writes through the async proxy.
    hdk::detail::fence_shared_for_async_proxy();
    uint64_t* landed = tile_landed + stage;
    hdk::detail::mbarrier_arrive_expect_bytes(landed, kTileBytes + kFp8TileEntries * 4);
    hdk::detail::bulk_copy_from_global(shared_address(codes + stage * kTileBytes),
                                       place.page + place.offset * kDataBytes, kTileBytes,
                                       shared_address(landed));
    hdk::detail::bulk_copy_from_global(shared_address(scales + stage * kFp8TileEntries),
                                       place.page + scale_offset + place.offset * 4,
                                       kFp8TileEntries * 4, shared_address(landed));
  };
  auto issue = [&](int64_t k) {
    if (whole_pages) {
      if (thread == 0) issue_whole_page(k);
      return;
    }
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
  if (whole_pages) {
    if (thread == 0) {
      for (int stage = 0; stage < kFp8KeyStages; ++stage)
        hdk::detail::mbarrier_init(tile_landed + stage, 1);
    }
    hdk::detail::named_barrier_sync(barrier, 128);  // the barriers are initialized
  }
#pragma unroll
  for (int k = 0; k < kFp8KeyStages - 1; ++k)
    issue(k);
  // Where this thread reads its two entries' bytes 32 t .. 32 t + 31 in a tile (chunks 2 t and
  // 2 t + 1 of rows upper and upper + 8).
  int piece_offset[2][2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      piece_offset[r][half] =
          whole_pages ? (upper + 8 * r) * static_cast<int>(kDataBytes) + 16 * (2 * t + half)
                      : fp8_key_chunk_offset(upper + 8 * r, 2 * t + half);
    }
  }

  for (int64_t k = 0; k < own_tiles; ++k) {
    // Tile k has landed for every thread; tile k - 1 is done with, so its stage takes the next.
    if (whole_pages) {
      hdk::detail::mbarrier_wait(tile_landed + k % kFp8KeyStages,
                                 static_cast<uint32_t>((k / kFp8KeyStages) & 1));
    } else {
      hdk::detail::cp_async_wait<kFp8KeyStages - 2>();
    }
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
      // swizzle of the copies by thread pairs puts in distinct banks for the 8 lanes of a load
      // phase).
      uint32_t words[2][8];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const uint4 v = *reinterpret_cast<const uint4*>(tile + piece_offset[r][half]);
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
  if (whole_pages && thread == 0) {  // every copy issued has landed and been waited for
    for (int stage = 0; stage < kFp8KeyStages; ++stage)
      hdk::detail::mbarrier_invalidate(tile_landed + stage);
  }
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

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
