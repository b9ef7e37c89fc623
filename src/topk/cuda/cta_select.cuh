// The select of a row that one CTA holds whole in its shared memory: cluster_select.cuh's steps
// with no cluster and no leader, for rows short enough that one SM's pass over them costs less
// than a cluster's fixed time (cluster barriers, round trips through distributed shared memory,
// the leader's appends). With 512 threads (index_topk's) a pass over 16384 keys is 8 quads a
// thread.
//  1. Levels over the whole row: the digit of the entries that match the prefix chosen so far is
//     counted into one of two histograms (the other is zeroed meanwhile), and the bin of the
//     entry of rank `need` joins the prefix. Digits of 11, 11 and 10 bits cover the key in 32-bit
//     arithmetic. It stops when the chosen bin is needed whole or holds at most kCandidates
//     entries: usually after the first level, which the caller may count while it loads.
//  2. One pass over the row (split_by_quads.cuh) writes the entries above the prefix to `sorted`
//     and those in it to the candidate buffer, each thread at its place from a prefix sum over
//     the CTA.
//  3. Levels over the candidates until the bin is needed whole, then those at or above the
//     prefix join `sorted`: exactly `want` entries.
//  4. cluster_select.cuh's bitonic sort, largest first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "topk/cuda/cluster_select.cuh"
#include "topk/cuda/split_by_quads.cuh"
#include "topk/select_layout.h"
#include "topk/split_bounds.h"
#include "topk/topk_key.h"

namespace hdk {
namespace detail {

namespace cta_select_detail {

using cluster_select_detail::Digit;

// The next digit after `prefix_bits` bits: 11, 11, then the key's last 10 bits, so that keys are
// compared in 32-bit arithmetic; past the key, cluster_select's 64-bit digits over the column.
__device__ __forceinline__ Digit next_digit(int prefix_bits) {
  if (prefix_bits >= 32) return cluster_select_detail::digit_after(prefix_bits);
  const int width = 32 - prefix_bits < kSelectDigitBits ? 32 - prefix_bits : kSelectDigitBits;
  return Digit{width, 64 - prefix_bits - width};
}

}  // namespace cta_select_detail

// Selects the `want` (1 .. sort_capacity) largest ranked entries of keys[0 .. length) (the
// column of keys[i] is i) into select_layout(sort_capacity)'s `sorted`, largest first. Every
// thread of the CTA calls it; kThreads is blockDim.x, a power of two from 64 to 1024. `keys` is
// 16-byte aligned and readable up to the next multiple of 4 (those keys are never taken).
// first_level_counted: the caller has counted the top kSelectDigitBits bits of every key into
// the layout's histogram buffer 0 (zeroed, then one atomicAdd a key, before a barrier that
// precedes this call); otherwise this counts them.
template <int kThreads>
__device__ void cta_select(uint8_t* shared, int sort_capacity, const uint32_t* keys, int length,
                           int want, bool first_level_counted) {
  using namespace cluster_select_detail;
  using cta_select_detail::next_digit;
  const SelectArrays arrays = select_arrays(shared, sort_capacity);
  Control* control = arrays.control;
  uint64_t* sorted = arrays.sorted;
  uint64_t* candidate = arrays.candidate;
  uint32_t* histogram = arrays.histogram;
  uint32_t* warp_sums = arrays.warp_sums;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int rounded = (length + kThreads - 1) / kThreads * kThreads;  // uniform trip count

  for (int i = (first_level_counted ? kBins : 0) + tid; i < 2 * kBins; i += kThreads)
    histogram[i] = 0;
  __syncthreads();

  // A level: after its counts, the bin of the entry of rank `need` becomes part of the prefix;
  // returns the entries in that bin. The other histogram, last read by the previous level's
  // find_threshold_bin (before this level's first barrier), is zeroed for the next level.
  const bool select_all = want == length;
  uint64_t prefix = 0;
  int prefix_bits = 0;
  unsigned int need = static_cast<unsigned int>(want);
  int level = 0;  // alternates the two histograms over both kinds of level
  auto finish_level = [&](const uint32_t* counts, Digit digit) {
    __syncthreads();  // the level's counts are complete
    find_threshold_bin(counts, need, warp_sums, control);
    uint32_t* next = histogram + ((level + 1) & 1) * kBins;
    for (int i = tid; i < kBins; i += kThreads)
      next[i] = 0;
    __syncthreads();  // *control is written; the next level overwrites it after its barrier
    prefix = (prefix << digit.width) | control->bin;
    prefix_bits += digit.width;
    need -= control->above;
    ++level;
    return control->count;
  };

  // 1. Levels over every key until the chosen bin is needed whole (done) or fits the candidate
  // buffer.
  bool done = select_all;
  while (!done) {
    uint32_t* counts = histogram + (level & 1) * kBins;
    const Digit digit = next_digit(prefix_bits);
    const unsigned int mask = (1u << digit.width) - 1u;
    if (prefix_bits == 0) {
      if (!first_level_counted) {
        for (int i = tid; i < rounded; i += kThreads) {
          const uint32_t key = i < length ? keys[i] : 0u;
          histogram_add(counts, i < length, key >> (32 - kDigitBits), lane);
        }
      }
    } else if (prefix_bits < 32) {
      const uint32_t key_prefix = static_cast<uint32_t>(prefix);
      const int shift = digit.shift - 32;
      for (int i = tid; i < rounded; i += kThreads) {
        const uint32_t key = i < length ? keys[i] : 0u;
        const bool counted = i < length && (key >> (32 - prefix_bits)) == key_prefix;
        if (__any_sync(kFullMask, counted))
          histogram_add(counts, counted, (key >> shift) & mask, lane);
      }
    } else {
      for (int i = tid; i < rounded; i += kThreads) {
        const uint64_t entry = ranked_entry(i < length ? keys[i] : 0u, static_cast<uint32_t>(i));
        const bool counted = i < length && top_bits(entry, prefix_bits) == prefix;
        if (__any_sync(kFullMask, counted)) {
          histogram_add(counts, counted, static_cast<unsigned int>(entry >> digit.shift) & mask,
                        lane);
        }
      }
    }
    const unsigned int in_bin = finish_level(counts, digit);
    // Entries are unique, so at 64 bits the bin holds one entry and it is needed.
    done = in_bin == need;
    if (in_bin <= static_cast<unsigned int>(kCandidates)) break;
  }

  // 2. One pass: the entries above the prefix (and in it, when done) are winners, those in it
  // (when not) candidates, each thread's at its place in the CTA's order. A chunk starts where
  // the chunks before it end: `winners` and `candidates` take each chunk's totals (`last`) when
  // the next chunk asks for its place, and after the pass.
  uint32_t winners = 0, candidates = 0;
  SplitPlaces last{0u, 0u};
  split_by_quads(keys, length, 0u, kThreads, SplitBounds(prefix, prefix_bits, done, select_all),
                 sorted, candidate, warp_sums,
                 [&](uint32_t chunk_winners, uint32_t chunk_candidates) {
                   __syncthreads();  // warp_sums may be written again
                   winners += last.winners;
                   candidates += last.candidates;
                   last = SplitPlaces{chunk_winners, chunk_candidates};
                   return SplitPlaces{winners, candidates};
                 });
  winners += last.winners;
  candidates += last.candidates;

  // 3. Levels over the candidates until done, then the candidates at or above the prefix join
  // the winners.
  if (!done) {
    if (tid == 0) control->winners = winners;
    const int rounded_candidates =
        (static_cast<int>(candidates) + kThreads - 1) / kThreads * kThreads;
    __syncthreads();  // the candidates are written
    while (!done) {
      uint32_t* counts = histogram + (level & 1) * kBins;
      const Digit digit = next_digit(prefix_bits);
      const unsigned int mask = (1u << digit.width) - 1u;
      for (int i = tid; i < rounded_candidates; i += kThreads) {
        const bool real = i < static_cast<int>(candidates);
        const uint64_t entry = real ? candidate[i] : 0;
        const bool counted = real && top_bits(entry, prefix_bits) == prefix;
        histogram_add(counts, counted, static_cast<unsigned int>(entry >> digit.shift) & mask,
                      lane);
      }
      done = finish_level(counts, digit) == need;
    }
    for (int i = tid; i < rounded_candidates; i += kThreads) {
      const bool real = i < static_cast<int>(candidates);
      const uint64_t entry = real ? candidate[i] : 0;
      warp_append(sorted, &control->winners, real && top_bits(entry, prefix_bits) >= prefix, entry,
                  lane);
    }
  }

  // 4. Largest first (sort_largest_first begins with a barrier that completes the appends).
  sort_largest_first(sorted, want);
}

}  // namespace detail
}  // namespace hdk
