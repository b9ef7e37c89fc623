// The selection machinery of hdk::topk's CUDA backend, shared with hdk::dsv4::index_topk (which
// selects over scores it computes itself and keeps in shared memory instead of reading a row of
// values): a cluster of CTAs, each owning a contiguous segment of one row, finds the `want`
// largest 64-bit ranked entries (topk_key.h: order-preserving key, then the inverted column, so
// entries are unique, the k-th largest is exact and ties go to the lower column).
//  1. Cluster levels, over the whole segment: each CTA histograms the 11-bit digit of the entries
//     that match the prefix chosen so far (2048 bins in shared memory), the cluster sums its
//     histograms through distributed shared memory, and every CTA finds the bin that holds the
//     k-th entry. Usually one level suffices: it stops as soon as the chosen bin is needed whole
//     or holds at most kCandidates entries. A caller may count the first level itself (see
//     cluster_select's first_level_counted).
//  2. One pass over the segment appends the entries above the chosen bin (winners) and those in
//     it (candidates) to the leader CTA's shared memory: for a segment whose keys sit in shared
//     memory, by split_by_quads (one remote atomic per chunk of the segment and list); otherwise
//     through the visitor, one remote atomic per warp and list for every kAppendBatch rounds that
//     have any (the caller picks the batch).
//  3. The leader alone finishes the radix select on the candidates (shared memory and
//     __syncthreads only), appends the ones it needs and sorts the exactly `want` winners
//     (bitonic), largest first.
// The caller supplies the segment's entries through a visitor (see cluster_select); nothing
// here reads global memory.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/cuda/block_scan.cuh"
#include "core/resident_clusters.h"
#include "topk/cuda/split_by_quads.cuh"
#include "topk/select_layout.h"
#include "topk/split_bounds.h"
#include "topk/topk_key.h"

namespace hdk {
namespace detail {
namespace cluster_select_detail {

constexpr int kDigitBits = kSelectDigitBits;
constexpr int kBins = kSelectBins;
constexpr int kCandidates = kSelectCandidates;
constexpr unsigned kFullMask = 0xffffffffu;

// What one level decided; written by one thread, read by all after a barrier.
struct Control {
  unsigned int bin;         // the bin that holds the entry of rank `need`
  unsigned int above;       // entries in higher bins
  unsigned int count;       // entries in the chosen bin
  unsigned int winners;     // leader only: entries appended to `sorted` so far
  unsigned int candidates;  // leader only: entries appended to `candidate` so far
  SplitPlaces append_at;    // where this CTA's chunk goes in the leader's lists (resident keys)
  unsigned int unused;
};

// The select's arrays in a CTA's shared memory, at select_layout's offsets.
struct SelectArrays {
  Control* control;
  uint64_t* sorted;
  uint64_t* candidate;
  uint32_t* histogram;  // two buffers of kBins
  uint32_t* totals;
  uint32_t* warp_sums;
};
__device__ __forceinline__ SelectArrays select_arrays(uint8_t* shared, int sort_capacity) {
  const SelectLayout layout = select_layout(sort_capacity);
  return SelectArrays{reinterpret_cast<Control*>(shared),
                      reinterpret_cast<uint64_t*>(shared + layout.sorted),
                      reinterpret_cast<uint64_t*>(shared + layout.candidate),
                      reinterpret_cast<uint32_t*>(shared + layout.histogram),
                      reinterpret_cast<uint32_t*>(shared + layout.totals),
                      reinterpret_cast<uint32_t*>(shared + layout.warp_sums)};
}

// The digit of a level: bits [shift, shift + width) of the entry, taken from the top.
struct Digit {
  int width, shift;
};
__device__ __forceinline__ Digit digit_after(int prefix_bits) {
  const int width = 64 - prefix_bits < kDigitBits ? 64 - prefix_bits : kDigitBits;
  return Digit{width, 64 - prefix_bits - width};
}

// Adds one to counts[bin] for every lane with `counted`; all 32 lanes call it. A warp whose 32
// lanes all count into one bin (runs of equal or close values) adds once instead of making 32
// conflicting atomics; otherwise each lane adds on its own (shared atomics resolve moderate
// conflicts in hardware, cheaper than aggregating every warp).
__device__ __forceinline__ void histogram_add(uint32_t* counts, bool counted, unsigned int bin,
                                              int lane) {
  const unsigned int first_bin = __shfl_sync(kFullMask, bin, 0);
  if (__all_sync(kFullMask, counted && bin == first_bin)) {
    if (lane == 0) atomicAdd(&counts[bin], 32u);
  } else if (counted) {
    atomicAdd(&counts[bin], 1u);
  }
}

// Appends `entry` for every lane with `take` to buffer[*count ...]; all 32 lanes call it. One
// atomic per warp (the buffer and count may be in another CTA's shared memory).
__device__ __forceinline__ void warp_append(uint64_t* buffer, unsigned int* count, bool take,
                                            uint64_t entry, int lane) {
  const unsigned int ballot = __ballot_sync(kFullMask, take);
  if (ballot == 0) return;
  const int first = __ffs(ballot) - 1;
  unsigned int slot = 0;
  if (lane == first) slot = atomicAdd(count, static_cast<unsigned int>(__popc(ballot)));
  slot = __shfl_sync(kFullMask, slot, first);
  if (take) buffer[slot + __popc(ballot & ((1u << lane) - 1u))] = entry;
}

// The winners and candidates of up to kBatch rounds of one lane, held in registers so that a
// warp reserves room for all of them with one atomic per list.
template <int kBatch>
struct PendingAppends {
  uint64_t entry[kBatch];
  bool win[kBatch] = {};
  bool maybe[kBatch] = {};
  int filled = 0;  // the same in every lane of the warp
};

// warp_append for the entries of a batch whose flag (`take`) is set: one atomic for the batch.
template <int kBatch>
__device__ __forceinline__ void warp_append_batch(uint64_t* buffer, unsigned int* count,
                                                  const uint64_t (&entry)[kBatch],
                                                  const bool (&take)[kBatch], int lane) {
  unsigned int ballot[kBatch];
  unsigned int total = 0;
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    ballot[j] = __ballot_sync(kFullMask, take[j]);
    total += static_cast<unsigned int>(__popc(ballot[j]));
  }
  if (total == 0) return;
  unsigned int slot = 0;
  if (lane == 0) slot = atomicAdd(count, total);
  slot = __shfl_sync(kFullMask, slot, 0);
  const unsigned int lanes_below = (1u << lane) - 1u;
#pragma unroll
  for (int j = 0; j < kBatch; ++j) {
    if (take[j]) buffer[slot + __popc(ballot[j] & lanes_below)] = entry[j];
    slot += static_cast<unsigned int>(__popc(ballot[j]));
  }
}

// Finds the bin (of kBins, higher bins hold larger entries) where the count of entries in
// higher bins first reaches `need`, and writes it with its counts to *control. Every thread of
// the block calls it; blockDim.x is a power of two from 64 to 1024. The caller synchronizes
// before reading *control.
__device__ inline void find_threshold_bin(const uint32_t* totals, unsigned int need,
                                          uint32_t* warp_sums, Control* control) {
  const int per_thread = kBins / static_cast<int>(blockDim.x);
  const int top = kBins - 1 - per_thread * static_cast<int>(threadIdx.x);  // top, top - 1, ...
  uint32_t local = 0;
  for (int b = 0; b < per_thread; ++b)
    local += totals[top - b];
  uint32_t above = block_exclusive_sum(local, warp_sums, nullptr);
  if (above < need && need <= above + local) {
    for (int b = 0; b < per_thread; ++b) {
      const uint32_t count = totals[top - b];
      if (above + count >= need) {
        control->bin = static_cast<unsigned int>(top - b);
        control->above = above;
        control->count = count;
        break;
      }
      above += count;
    }
  }
}

// The larger entry of each pair (lo, lo + stride) of a bitonic stage goes to lo where the
// `width`-entry run holding lo sorts descending (lo & width == 0), the smaller one elsewhere.
__device__ __forceinline__ void exchange_in_shared(uint64_t* values, int lo, int stride,
                                                   int width) {
  const int hi = lo + stride;
  const bool descending = (lo & width) == 0;
  const uint64_t a = values[lo];
  const uint64_t b = values[hi];
  if ((a < b) == descending) {
    values[lo] = b;
    values[hi] = a;
  }
}

// One bitonic stage of stride 32 or less on a warp's 64-entry run (first entry `run`): lane l
// holds entries run + l (`low`) and run + l + 32 (`high`), so stride 32 is within the thread and
// the others are one shuffle of each 64-bit entry away.
__device__ __forceinline__ void exchange_in_warp(uint64_t& low, uint64_t& high, int run, int lane,
                                                 int stride, int width) {
  if (stride == 32) {
    const bool descending = ((run + lane) & width) == 0;
    if ((low < high) == descending) {
      const uint64_t t = low;
      low = high;
      high = t;
    }
    return;
  }
  const bool is_lo = (lane & stride) == 0;
  auto exchange = [&](uint64_t& x, int index) {
    const uint64_t other = __shfl_xor_sync(kFullMask, x, stride);
    const bool keep_larger = is_lo == ((index & width) == 0);
    x = (x < other) == keep_larger ? other : x;
  };
  exchange(low, run + lane);
  exchange(high, run + lane + 32);
}

// Strides min(32, width / 2) down to 1 of every width from `first_width` to `last_width` on each
// 64-entry run of values[0 .. size), warp w taking runs w, w + warps, ...: no block barrier.
// A warp with two runs sorts them together, so that the shuffles of one run wait while the other's
// are in flight: each stage waits for the last, and one run at a time took an H200 7.2 us to sort
// index_topk's 1024 winners with 8 warps.
__device__ __forceinline__ void bitonic_in_warps(uint64_t* values, int size, int first_width,
                                                 int last_width) {
  const int lane = threadIdx.x & 31;
  const int step = (blockDim.x >> 5) * 64;
  int run = (threadIdx.x >> 5) * 64;
  for (; run + step < size; run += 2 * step) {
    const int other = run + step;
    uint64_t low = values[run + lane], high = values[run + lane + 32];
    uint64_t other_low = values[other + lane], other_high = values[other + lane + 32];
    for (int width = first_width; width <= last_width; width <<= 1) {
      for (int stride = min(32, width >> 1); stride > 0; stride >>= 1) {
        exchange_in_warp(low, high, run, lane, stride, width);
        exchange_in_warp(other_low, other_high, other, lane, stride, width);
      }
    }
    values[run + lane] = low;
    values[run + lane + 32] = high;
    values[other + lane] = other_low;
    values[other + lane + 32] = other_high;
  }
  if (run < size) {
    uint64_t low = values[run + lane], high = values[run + lane + 32];
    for (int width = first_width; width <= last_width; width <<= 1) {
      for (int stride = min(32, width >> 1); stride > 0; stride >>= 1)
        exchange_in_warp(low, high, run, lane, stride, width);
    }
    values[run + lane] = low;
    values[run + lane + 32] = high;
  }
}

// Sorts values[0 .. count) largest first (bitonic, zero-padded to a power of two `size` that the
// buffer must hold). Every thread of the block calls it. Strides of 32 and less run in
// registers, a warp per 64-entry run; only the longer ones go through shared memory with a
// block barrier each: 6 barriers for 512 entries instead of 45 (an H100 sorted 512 entries of
// index_topk's leader in 3.2 us instead of 5.0, 1024 in 7.1 instead of 9.2; globaltimer probes).
__device__ inline void sort_largest_first(uint64_t* values, int count) {
  const int threads = blockDim.x;
  const int tid = threadIdx.x;
  int size = 1;
  while (size < count)
    size <<= 1;
  __syncthreads();
  for (int i = count + tid; i < size; i += threads)
    values[i] = 0;
  __syncthreads();
  if (size < 64) {  // a few stages: all through shared memory
    for (int width = 2; width <= size; width <<= 1) {
      for (int stride = width >> 1; stride > 0; stride >>= 1) {
        for (int i = tid; i < size / 2; i += threads)
          exchange_in_shared(values, 2 * i - (i & (stride - 1)), stride, width);
        __syncthreads();
      }
    }
    return;
  }
  bitonic_in_warps(values, size, 2, 64);
  __syncthreads();
  for (int width = 128; width <= size; width <<= 1) {
    for (int stride = width >> 1; stride >= 64; stride >>= 1) {
      for (int i = tid; i < size / 2; i += threads)
        exchange_in_shared(values, 2 * i - (i & (stride - 1)), stride, width);
      __syncthreads();
    }
    bitonic_in_warps(values, size, width, width);
    __syncthreads();
  }
}

// Clusters up to this size sum every bin over every CTA in each CTA (sum_over_cluster).
constexpr int kDirectSumClusterSize = 4;

// The cluster's sum of every CTA's `counts`, after a cluster barrier that completed every CTA's
// counts; returns, after a block barrier, the array of this CTA's shared memory that holds it:
// `share` or `other`, the buffer the next level counts into (zeroed here when it is not the
// one returned; the caller zeroes it otherwise).
// Clusters of more than kDirectSumClusterSize CTAs sum in two steps: CTA r sums its own share of
// the bins over the cluster into `share`, then, after a second cluster barrier, every CTA gathers
// all shares into `other`, each thread with its remote loads in flight together.
// Summing every bin over every CTA in each CTA made a chain of kBins x cluster size / threads
// remote loads a thread (128 with 16 CTAs of 256 threads): the two steps took index_topk's one
// row of 16384 keys from 29.3 to 26.3 us (H200), but cost smaller clusters their second barrier
// (rows in clusters of 2-4: 1-2% slower). `share` is read remotely until the caller's next
// cluster barrier.
template <typename Cluster>
__device__ inline const uint32_t* sum_over_cluster(Cluster& cluster, const uint32_t* counts,
                                                   uint32_t* share, uint32_t* other) {
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int threads = blockDim.x;
  const int tid = threadIdx.x;
  if (cluster_size <= kDirectSumClusterSize) {
    // A batch of bins from every source a thread, the remote loads in flight together: one at a
    // time waited kBins x cluster size / threads round trips.
    constexpr int kSumBatch = 4;
    for (int base = tid; base < kBins; base += threads * kSumBatch) {
      uint32_t part[kSumBatch][kDirectSumClusterSize];
#pragma unroll
      for (int j = 0; j < kSumBatch; ++j) {
        const int bin = base + j * threads;
#pragma unroll
        for (int source = 0; source < kDirectSumClusterSize; ++source) {
          part[j][source] = bin < kBins && source < cluster_size
                                ? cluster.map_shared_rank(counts, source)[bin]
                                : 0u;
        }
      }
#pragma unroll
      for (int j = 0; j < kSumBatch; ++j) {
        const int bin = base + j * threads;
        if (bin >= kBins) break;
        uint32_t total = 0;
#pragma unroll
        for (int source = 0; source < kDirectSumClusterSize; ++source)
          total += part[j][source];
        share[bin] = total;
        other[bin] = 0;  // the next level's counts
      }
    }
    __syncthreads();
    return share;
  }
  const int rank = static_cast<int>(cluster.block_rank());
  const int share_bins = (kBins + cluster_size - 1) / cluster_size;
  const int first = rank * share_bins;
  const int last = min(first + share_bins, kBins);
  for (int bin = first + tid; bin < last; bin += threads) {
    uint32_t part[kMaxClusterSize];
#pragma unroll
    for (int source = 0; source < kMaxClusterSize; ++source) {
      part[source] = source < cluster_size ? cluster.map_shared_rank(counts, source)[bin] : 0u;
    }
    uint32_t total = 0;
#pragma unroll
    for (int source = 0; source < kMaxClusterSize; ++source)
      total += part[source];
    share[bin] = total;
  }
  cluster.sync();  // every CTA's share is summed
  constexpr int kGatherBatch = 8;
  for (int base = tid; base < kBins; base += threads * kGatherBatch) {
    uint32_t value[kGatherBatch];
#pragma unroll
    for (int j = 0; j < kGatherBatch; ++j) {
      const int bin = base + j * threads;
      value[j] = bin < kBins ? cluster.map_shared_rank(share, bin / share_bins)[bin] : 0u;
    }
#pragma unroll
    for (int j = 0; j < kGatherBatch; ++j) {
      const int bin = base + j * threads;
      if (bin < kBins) other[bin] = value[j];
    }
  }
  __syncthreads();
  return other;
}

}  // namespace cluster_select_detail

// A CTA's segment of the row, when its keys sit whole in shared memory: keys[i] (16-byte aligned,
// readable up to the next multiple of 4) is the key of column first + i, for i < size.
struct ResidentSegment {
  const uint32_t* keys = nullptr;  // null: not resident
  uint32_t first = 0;
  int size = 0;
};

// Selects the `want` (1 .. sort_capacity, the same in every CTA of the cluster) largest ranked
// entries among the segments of the cluster's CTAs; `length` is the row's entry count. Returns
// true in the leader CTA (rank 0), whose shared `sorted` array (select_layout) then holds them,
// largest first; the other CTAs return false having finished every access to the leader's
// memory. Every thread of every CTA of the cluster calls it; blockDim.x is a power of two from
// 64 to 1024.
//
// for_each_entry(first, visit) must call visit(key, column, in_range) for every entry of this
// CTA's segment (key: ordered_key of its value, column: its index in the row), in rounds in
// which every thread of the CTA calls visit the same number of times (extra calls with in_range
// false), so visit may use warp collectives. `first` is true on the first pass over the segment
// (a caller may compute or load its entries then and cache them). It may use __syncthreads but
// no cluster barrier.
//
// kAppendBatch: how many rounds with winners or candidates a warp holds in registers before it
// appends them to the leader (one remote atomic per list for the batch). 4 suits a caller whose
// registers are spent elsewhere (index_topk: 1.01-1.05x); hdk::topk keeps 1, since holding a
// batch took its kernel from 63 to 109 registers and made it 0.85-0.99x (H100, 2026-11-27).
//
// first_level_counted: the caller has already counted the first level, the top kSelectDigitBits
// bits of every key of its segment, into buffer 0 of select_layout's histogram (zeroed, then
// one atomicAdd a key, before this call; index_topk does it while it scores). The select then
// neither zeroes that buffer nor makes that pass (nor tells a later level's pass `first`: the
// caller has its entries at hand).
//
// resident: this CTA's segment, when its keys sit in shared memory (the same as for_each_entry
// visits); the appends then go by split_by_quads instead of the visitor.
template <int kAppendBatch, typename ForEachEntry>
__device__ bool cluster_select(uint8_t* shared, int sort_capacity, int64_t want, int64_t length,
                               ForEachEntry&& for_each_entry, bool first_level_counted = false,
                               ResidentSegment resident = {}) {
  using namespace cluster_select_detail;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int threads = blockDim.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31;

  const SelectArrays arrays = select_arrays(shared, sort_capacity);
  Control* control = arrays.control;
  uint64_t* sorted = arrays.sorted;
  uint64_t* candidate = arrays.candidate;
  uint32_t* histogram = arrays.histogram;
  uint32_t* totals = arrays.totals;
  uint32_t* warp_sums = arrays.warp_sums;

  for (int i = (first_level_counted ? kBins : 0) + tid; i < 2 * kBins; i += threads)
    histogram[i] = 0;
  if (tid == 0) {
    control->winners = 0;
    control->candidates = 0;
  }
  cluster.sync();  // the cluster runs and every counter is zero before any remote access

  // 1. Cluster levels until the chosen bin is needed whole (done) or fits the leader's buffer.
  const bool select_all = want == length;
  uint64_t prefix = 0;
  int prefix_bits = 0;
  unsigned int need = static_cast<unsigned int>(want);
  bool done = select_all;
  for (int level = 0; !done; ++level) {
    uint32_t* counts = histogram + (level & 1) * kBins;
    const Digit digit = digit_after(prefix_bits);
    if (level > 0 || !first_level_counted) {
      for_each_entry(level == 0, [&](uint32_t key, uint32_t column, bool in_range) {
        if (prefix_bits == 0) {  // the first digit lies in the key: no 64-bit entry needed
          histogram_add(counts, in_range, key >> (32 - kDigitBits), lane);
          return;
        }
        const uint64_t entry = ranked_entry(key, column);
        const bool counted = in_range && top_bits(entry, prefix_bits) == prefix;
        const unsigned int bin =
            static_cast<unsigned int>(entry >> digit.shift) & ((1u << digit.width) - 1u);
        histogram_add(counts, counted, bin, lane);
      });
    }
    // The other buffer was last read remotely during the previous level, which every CTA
    // finished before the cluster.sync below.
    uint32_t* other = histogram + ((level + 1) & 1) * kBins;
    cluster.sync();  // every CTA's histogram of this level is complete
    const uint32_t* level_totals = sum_over_cluster(cluster, counts, totals, other);
    find_threshold_bin(level_totals, need, warp_sums, control);
    __syncthreads();
    prefix = (prefix << digit.width) | control->bin;
    prefix_bits += digit.width;
    need -= control->above;
    // Entries are unique, so at 64 bits the bin holds one entry and it is needed.
    done = control->count == need;
    if (control->count <= static_cast<unsigned int>(kCandidates)) break;
    if (level_totals == other) {  // the next level counts into it
      for (int bin = tid; bin < kBins; bin += threads)
        other[bin] = 0;
      __syncthreads();
    }
  }

  // 2. Winners and candidates to the leader. A warp holds the entries of kAppendBatch rounds that
  // have any before it appends them, one remote atomic per list for the batch: where most rounds
  // have some (a row's top 512 of 65536 in an 11-bit bin of up to 4096 candidates), an atomic
  // round trip per round and list was most of the pass.
  unsigned int* leader_winners = cluster.map_shared_rank(&control->winners, 0);
  unsigned int* leader_candidates = cluster.map_shared_rank(&control->candidates, 0);
  uint64_t* leader_sorted = cluster.map_shared_rank(sorted, 0);
  uint64_t* leader_candidate = cluster.map_shared_rank(candidate, 0);
  const SplitBounds bounds(prefix, prefix_bits, done, select_all);
  if (resident.keys != nullptr) {
    // The chunk's place in the leader's lists, one remote atomic a list, for every thread of the
    // CTA through *control.
    split_by_quads(
        resident.keys, resident.size, resident.first, threads, bounds, leader_sorted,
        leader_candidate, warp_sums, [&](uint32_t chunk_winners, uint32_t chunk_candidates) {
          if (tid == 0) {
            control->append_at.winners =
                chunk_winners > 0 ? atomicAdd(leader_winners, chunk_winners) : 0u;
            control->append_at.candidates =
                chunk_candidates > 0 ? atomicAdd(leader_candidates, chunk_candidates) : 0u;
          }
          __syncthreads();  // also: warp_sums may be written again
          return control->append_at;
        });
  } else if constexpr (kAppendBatch == 1) {
    // The entry's verdict is written out in both forms below: shared through a lambda, the
    // one-round form compiled to other code than the one hdk::topk was measured and tested with.
    for_each_entry(select_all, [&](uint32_t key, uint32_t column, bool in_range) {
      const SplitVerdict verdict = bounds.of(key, column);
      const bool win = in_range && verdict.win;
      const bool maybe = in_range && verdict.maybe;
      if (__ballot_sync(kFullMask, win || maybe) == 0) return;  // most warps, most of the time
      const uint64_t entry = ranked_entry(key, column);
      warp_append(leader_sorted, leader_winners, win, entry, lane);
      warp_append(leader_candidate, leader_candidates, maybe, entry, lane);
    });
  } else {
    PendingAppends<kAppendBatch> pending;
    auto append_pending = [&]() {
      warp_append_batch(leader_sorted, leader_winners, pending.entry, pending.win, lane);
      warp_append_batch(leader_candidate, leader_candidates, pending.entry, pending.maybe, lane);
#pragma unroll
      for (int j = 0; j < kAppendBatch; ++j)
        pending.win[j] = pending.maybe[j] = false;
      pending.filled = 0;
    };
    for_each_entry(select_all, [&](uint32_t key, uint32_t column, bool in_range) {
      const SplitVerdict verdict = bounds.of(key, column);
      const bool win = in_range && verdict.win;
      const bool maybe = in_range && verdict.maybe;
      if (__ballot_sync(kFullMask, win || maybe) == 0) return;  // most warps, most of the time
      const uint64_t entry = ranked_entry(key, column);
#pragma unroll
      for (int j = 0; j < kAppendBatch; ++j) {
        if (j == pending.filled) {
          pending.entry[j] = entry;
          pending.win[j] = win;
          pending.maybe[j] = maybe;
        }
      }
      if (++pending.filled == kAppendBatch) append_pending();
    });
    if (pending.filled > 0) append_pending();
  }
  cluster.sync();  // the leader's buffers are complete; the other CTAs are done
  if (rank != 0) return false;

  // 3. The leader finishes the select among the candidates, one digit at a time.
  const int candidates = static_cast<int>(control->candidates);        // 0 when done already
  const int rounded = (candidates + threads - 1) / threads * threads;  // uniform trip count
  for (int level = 0; !done; ++level) {
    uint32_t* counts = histogram + (level & 1) * kBins;
    const Digit digit = digit_after(prefix_bits);
    for (int i = tid; i < kBins; i += threads)
      counts[i] = 0;
    __syncthreads();
    for (int i = tid; i < rounded; i += threads) {
      const uint64_t entry = i < candidates ? candidate[i] : 0;
      const bool counted = i < candidates && top_bits(entry, prefix_bits) == prefix;
      const unsigned int bin =
          static_cast<unsigned int>(entry >> digit.shift) & ((1u << digit.width) - 1u);
      histogram_add(counts, counted, bin, lane);
    }
    __syncthreads();
    find_threshold_bin(counts, need, warp_sums, control);
    __syncthreads();
    prefix = (prefix << digit.width) | control->bin;
    prefix_bits += digit.width;
    need -= control->above;
    done = control->count == need;
    __syncthreads();  // every thread read *control before the next level's bin overwrites it
  }
  for (int i = tid; i < rounded; i += threads) {
    const uint64_t entry = i < candidates ? candidate[i] : 0;
    const bool take = i < candidates && top_bits(entry, prefix_bits) >= prefix;
    warp_append(sorted, &control->winners, take, entry, lane);
  }

  sort_largest_first(sorted, static_cast<int>(want));  // the exactly `want` winners
  return true;
}

}  // namespace detail
}  // namespace hdk
