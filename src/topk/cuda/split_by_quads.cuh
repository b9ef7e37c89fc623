// The select's pass over keys that sit in shared memory (cta_select's whole row, or a cluster
// CTA's resident segment in cluster_select) once the prefix is chosen: the keys above it are
// winners, those in it candidates (or winners, when the select is done). A thread takes 16-byte
// quads of keys (q, q + threads, ...), marks its own in a bit a key, and writes them at its place
// from a prefix sum over the CTA: no atomic a warp on a shared counter, and for a cluster one
// remote atomic a chunk and list in place of one a warp every few rounds.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/block_scan.cuh"
#include "topk/split_bounds.h"
#include "topk/topk_key.h"

namespace hdk {
namespace detail {

// Quads a thread classifies before the CTA's prefix sum: 32 bits of marks.
constexpr int kSplitQuads = 8;

// Where a chunk's winners and candidates start in their lists.
struct SplitPlaces {
  uint32_t winners, candidates;
};

// Splits keys[0 .. length) (16-byte aligned, readable up to the next multiple of 4; the column
// of keys[i] is first_column + i) by `bounds` into winners[...] and candidates[...]. Every thread
// of the CTA calls it; `threads` is blockDim.x. For each chunk of kSplitQuads x threads quads,
// every thread calls place(chunk_winners, chunk_candidates), the CTA's totals, which returns
// where the chunk's entries start, the same in every thread; it must begin with a block barrier
// (warp_sums is written again by the next chunk).
template <typename Place>
__device__ __forceinline__ void split_by_quads(const uint32_t* keys, int length,
                                               uint32_t first_column, int threads,
                                               const SplitBounds& bounds, uint64_t* winners,
                                               uint64_t* candidates, uint32_t* warp_sums,
                                               Place&& place) {
  const int tid = threadIdx.x;
  const int quads = (length + 3) / 4;
  const int rounded_quads = (quads + threads - 1) / threads * threads;
  const uint4* key_quads = reinterpret_cast<const uint4*>(keys);
  for (int chunk = 0; chunk < rounded_quads; chunk += kSplitQuads * threads) {
    uint32_t win_bits = 0, maybe_bits = 0;
    // Keys that tie through 32 bits (a wide prefix) take a rolled loop of their own: a form
    // unrolled for each kind of comparison (24 KB more code) had made rows of 2048-8192 MXFP4
    // keys about 3 us slower (H200), likely the instruction fetch of a CTA alone on its SM after
    // an L2 flush.
#pragma unroll 1
    for (int r = 0; r < kSplitQuads && chunk + r * threads < rounded_quads; ++r) {
      const int q = chunk + r * threads + tid;
      const uint4 four = q < quads ? key_quads[q] : make_uint4(0u, 0u, 0u, 0u);
      const uint32_t key[4] = {four.x, four.y, four.z, four.w};
      uint32_t win4 = 0, maybe4 = 0;
      if (!bounds.wide()) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const SplitVerdict verdict = bounds.of_key(key[c]);
          win4 |= static_cast<uint32_t>(verdict.win) << c;
          maybe4 |= static_cast<uint32_t>(verdict.maybe) << c;
        }
      } else {
#pragma unroll 1
        for (int c = 0; c < 4; ++c) {
          // Picked by selects: an index into key[] would put the quad in local memory.
          const uint32_t k = c == 0 ? key[0] : c == 1 ? key[1] : c == 2 ? key[2] : key[3];
          const SplitVerdict verdict =
              bounds.of_entry(ranked_entry(k, first_column + static_cast<uint32_t>(4 * q + c)));
          win4 |= static_cast<uint32_t>(verdict.win) << c;
          maybe4 |= static_cast<uint32_t>(verdict.maybe) << c;
        }
      }
      // The last quad may carry keys past the end: never taken.
      const int real = length - 4 * q;
      const uint32_t real4 = real >= 4 ? 0xfu : (real <= 0 ? 0u : (1u << real) - 1u);
      win_bits |= (win4 & real4) << (4 * r);
      maybe_bits |= (maybe4 & real4) << (4 * r);
    }
    // Counts of at most 32 each, packed: winners in the high half, candidates in the low.
    uint32_t total = 0;
    const uint32_t offset = block_exclusive_sum(
        static_cast<uint32_t>(__popc(win_bits)) << 16 | static_cast<uint32_t>(__popc(maybe_bits)),
        warp_sums, &total);
    const SplitPlaces at = place(total >> 16, total & 0xffffu);
    auto index_of_bit = [&](uint32_t bits) {
      const int b = __ffs(bits) - 1;
      return 4 * (chunk + (b >> 2) * threads + tid) + (b & 3);
    };
    uint32_t win_at = at.winners + (offset >> 16);
    for (uint32_t bits = win_bits; bits != 0; bits &= bits - 1) {
      const int i = index_of_bit(bits);
      winners[win_at++] = ranked_entry(keys[i], first_column + static_cast<uint32_t>(i));
    }
    uint32_t maybe_at = at.candidates + (offset & 0xffffu);
    for (uint32_t bits = maybe_bits; bits != 0; bits &= bits - 1) {
      const int i = index_of_bit(bits);
      candidates[maybe_at++] = ranked_entry(keys[i], first_column + static_cast<uint32_t>(i));
    }
  }
}

}  // namespace detail
}  // namespace hdk
