// The key ring of the workspace's scoring kernel: each warpgroup streams the stored bytes of its
// 64-entry tiles, as they are, into kFp8KeyStages tiles of its own in shared memory
// (launch.key_ring; index_fp8_layout.h), and a consumer multiplies each tile once it has landed
// while the next three are in flight. No register holds a tile in flight, so the kernel fits two
// CTAs an SM, and a warpgroup keeps three tiles of bytes in flight where the register-fed kernels
// keep what their registers hold. The consumers: score_warpgroup_ring (the FP8 forms,
// index_score_fp8.cuh) and score_warpgroup_ring_exact (bf16 or fp32 q over MXFP4 keys,
// index_score_bf16.cuh).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ceil_div.h"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/mbarrier.cuh"
#include "core/cuda/named_barrier.cuh"
#include "core/cuda/shared_address.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/cuda/index_key_loads.cuh"
#include "dsv4/index_topk/cuda/index_topk_device.cuh"
#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

// A landed tile as its consumer sees it.
struct KeyRingTile {
  // 64 entries' codes (E4M3: 128 bytes an entry, MXFP4: 64), in 16-byte chunks placed by
  // fp8_key_chunk_offset / mxfp4_key_chunk_offset, or as stored (`whole_pages`: E4M3 tiles
  // copied as whole pieces of their pages, 128 bytes an entry).
  const uint8_t* codes;
  const uint32_t* scales;  // the entries' scale words: E4M3's fp32 scale, MXFP4's 4 UE8M0 bytes
  int64_t entry;           // the tile's first entry, counted from the segment's first
  bool whole_pages;
};

// Streams entries first .. first + count - 1 of the row through the calling warpgroup's part of
// the ring, calling consume(KeyRingTile) on each of its tiles (warpgroup g takes the tiles g,
// g + kWarpgroups, ...) in order; every thread of the warpgroup calls it. Past the end of the
// segment a tile's entries are entry `first` again (their scores are to be dropped). kForm is the
// consumer's q: E4M3 over FP8 keys, the packed or the exact q over MXFP4 keys.
template <IndexQueryForm kForm, typename Consume>
__device__ __forceinline__ void stream_key_ring(const IndexerProblem& p, int64_t row, int64_t first,
                                                int64_t count, const IndexLaunch& launch,
                                                uint8_t* shared, bool wide, const KeyPages& pages,
                                                Consume&& consume) {
  constexpr bool kE4M3 = kForm == IndexQueryForm::kE4M3;
  constexpr KeyFormat kFormat = kE4M3 ? KeyFormat::kFP8 : KeyFormat::kMXFP4;
  constexpr int kTileBytes = kE4M3 ? kFp8KeyTileBytes : kMxfp4KeyTileBytes;
  const int warpgroup = threadIdx.x / 128, thread = threadIdx.x % 128;
  uint8_t* codes = shared + launch.key_ring + warpgroup * kFp8KeyStages * kTileBytes;
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
  // Tiles that are whole pieces of a page (block_size a multiple of 64, the segment on a tile
  // boundary, 16-byte aligned pages: the scoring kernel's segments start on multiples of 64; E4M3
  // keys and the packed q, index_key_ring_whole_pages) come as two bulk copies by one thread,
  // codes and scales, completing on the stage's barrier: no page lookup or copy by the other 127
  // threads. The codes then sit in the tile as stored, without the swizzle (bank conflicts: E4M3's
  // 8 lanes of a load phase read two entries' same chunks, 2-way; the packed q's loads of a group
  // 4-way, mxfp4_key_word_offset), and every thread builds the same fragments from them. A
  // warpgroup with one tile copies it by thread pairs: there the one thread's lookup, copies and
  // barriers came to more than they saved (H200, one row of 16384 E4M3 keys, 128 entries a CTA:
  // 24.0 -> 24.8 us).
  // The form is settled before any runtime test: tested at run time first, the same code for the
  // exact q (which never takes whole pages) was scheduled otherwise, 0.97x with fp32 q.
  constexpr bool kWholePageForm = index_form_takes_whole_pages(kForm);
  const bool whole_pages = kWholePageForm &&
                           index_key_ring_whole_pages(kForm, wide, p.keys.block_size) &&
                           first % kFp8TileEntries == 0 && own_tiles >= 2;
  const int barriers =
      kE4M3 ? fp8_key_ring_barriers(kWarpgroups) : mxfp4_key_ring_barriers(kWarpgroups);
  uint64_t* const tile_landed =
      reinterpret_cast<uint64_t*>(shared + launch.key_ring + barriers) + warpgroup * kFp8KeyStages;
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
  // The pairs' entries in 32 bits (a row's entries are below 2^31, checked on the host): 64-bit
  // compares and adds take the ALU pipe, which the MXFP4 placement keeps busy.
  const uint32_t first_entry = static_cast<uint32_t>(first);
  const uint32_t entries = static_cast<uint32_t>(count);
  auto issue = [&](int64_t k) {
    if (whole_pages) {
      if (thread == 0) issue_whole_page(k);
      return;
    }
    if (k < own_tiles) {
      const int stage = static_cast<int>(k % kFp8KeyStages);
      const uint32_t e = static_cast<uint32_t>((warpgroup + k * kWarpgroups) * kFp8TileEntries) +
                         static_cast<uint32_t>(copy_entry);
      const EntryPlace place = place_of(p, row, first_entry + (e < entries ? e : 0u), pages);
      const uint8_t* source =
          place.page + static_cast<uint32_t>(place.offset * kDataBytes + 16 * copy_half);
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
        hdk::detail::cp_async_4(
            scales + stage * kFp8TileEntries + copy_entry,
            place.page + scale_offset + static_cast<uint32_t>(place.offset * 4));
      }
    }
    hdk::detail::cp_async_commit();
  };
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

  for (int64_t k = 0; k < own_tiles; ++k) {
    // Tile k has landed for every thread; tile k - 1 is done with, so its stage takes the next.
    // Every consumer reads the ring by ordinary shared loads (its fragments go to the tensor
    // cores from registers), so the barrier orders the copies before them without a proxy fence.
    if (whole_pages) {
      hdk::detail::mbarrier_wait(tile_landed + k % kFp8KeyStages,
                                 static_cast<uint32_t>((k / kFp8KeyStages) & 1));
    } else {
      hdk::detail::cp_async_wait<kFp8KeyStages - 2>();
    }
    hdk::detail::named_barrier_sync(barrier, 128);
    issue(k + kFp8KeyStages - 1);
    const int stage = static_cast<int>(k % kFp8KeyStages);
    consume(KeyRingTile{codes + stage * kTileBytes, scales + stage * kFp8TileEntries,
                        (warpgroup + k * kWarpgroups) * kFp8TileEntries, whole_pages});
  }
  // The ring is free again for the next call (a chunked segment scores again on every pass).
  hdk::detail::cp_async_wait<0>();
  hdk::detail::named_barrier_sync(barrier, 128);
  if (whole_pages && thread == 0) {  // every copy issued has landed and been waited for
    for (int stage = 0; stage < kFp8KeyStages; ++stage)
      hdk::detail::mbarrier_invalidate(tile_landed + stage);
  }
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
