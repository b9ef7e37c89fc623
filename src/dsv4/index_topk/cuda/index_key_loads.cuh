// Where a row's entry lives in the paged key cache (its page, through the block ids a CTA keeps in
// shared memory when they fit) and how the scoring kernels load its stored bytes: raw, for the
// tensor-core kernels to convert, or as a lane's piece of the key.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/ceil_div.h"
#include "core/fast_divide.h"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/cuda/index_topk_device.cuh"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

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

// The register-fed warpgroup kernels' walk over a segment's 64-entry tiles (score_warpgroup,
// score_warpgroup_fp8; the key ring's is stream_key_ring): warpgroup g takes the tiles g,
// g + kWarpgroups, ..., a thread the entries upper and upper + 8 of each, their pieces
// (load_piece(s): entry s of the row) requested kWarpgroupStages tiles ahead. For each tile
// prepare(pieces) turns its two pieces into what its products take, before their registers
// receive the pieces kWarpgroupStages tiles on, and finish(tile, prepared) multiplies and writes.
// Past the end of the segment the pieces are entry `first` again (their scores are dropped).
template <typename Piece, typename LoadPiece, typename Prepare, typename Finish>
__device__ __forceinline__ void for_each_register_tile(int64_t first, int64_t count, int upper,
                                                       LoadPiece&& load_piece, Prepare&& prepare,
                                                       Finish&& finish) {
  const int warpgroup = threadIdx.x / 128;
  const int64_t tiles = ceil_div(count, kWarpgroupEntries);
  auto load = [&](int64_t tile, Piece(&rows)[2]) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int64_t e = tile * kWarpgroupEntries + upper + 8 * r;
      rows[r] = load_piece(first + (e < count ? e : 0));
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
      const auto prepared = prepare(stage[u]);
      load(tile + kStride, stage[u]);
      finish(tile, prepared);
    }
  }
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
