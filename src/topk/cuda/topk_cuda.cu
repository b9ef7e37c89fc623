// CUDA backend of hdk::topk: one launch, a cluster of C CTAs per row (C = 1..8: enough to keep
// a row's keys in shared memory, and to use the SMs when rows are few), each CTA owning a
// contiguous segment of the row. Entries are 64-bit ranked entries (order-preserving key, then
// the inverted column), so they are unique, the k-th largest is exact and ties go to the lower
// column by construction. The selection is a radix select with 11-bit digits from the top:
//  1. Cluster levels, over the whole segment: each CTA histograms the digit of the entries that
//     match the prefix chosen so far (2048 bins in shared memory), the cluster sums its
//     histograms through distributed shared memory, and every CTA finds the bin that holds the
//     k-th entry. Usually one level suffices: it stops as soon as the chosen bin is needed whole
//     or holds at most kCandidates entries.
//  2. One pass over the segment appends the entries above the chosen bin (winners) and those in
//     it (candidates) to the leader CTA's shared memory (one remote atomic per warp).
//  3. The leader alone finishes the radix select on the candidates (shared memory and
//     __syncthreads only: no more passes over the row, no more cluster barriers), appends the
//     ones it needs, sorts the exactly min(k, length) winners (bitonic) and writes them.
// The first version ran every 8-bit level over the whole row with cluster barriers between
// them; tied values push the select into the column bits, so it often took all 8 levels (137 us
// for N = 64, L = 65536, k = 512 on an H100).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <string>

#include "core/cuda_helpers.h"
#include "topk/cuda/topk_cuda.h"
#include "topk/topk_key.h"

namespace hdk {
namespace detail {
namespace {

namespace cg = cooperative_groups;

constexpr const char* kOperation = "hdk::topk";
constexpr int kMaxCluster = 8;
constexpr int64_t kCachedKeys = 32768;  // 128 KiB of shared memory per CTA
constexpr int kDigitBits = 11;
constexpr int kBins = 1 << kDigitBits;
constexpr int kCandidates = 4096;  // the leader's buffer for the entries of the chosen bin
constexpr int kBatch = 16;  // entries per thread loaded before any is used (memory parallelism)
constexpr int kMaxThreads = 512;
constexpr unsigned kFullMask = 0xffffffffu;

// What one level decided; written by one thread, read by all after a barrier.
struct Control {
  unsigned int bin;         // the bin that holds the entry of rank `need`
  unsigned int above;       // entries in higher bins
  unsigned int count;       // entries in the chosen bin
  unsigned int winners;     // leader only: entries appended to `sorted` so far
  unsigned int candidates;  // leader only: entries appended to `candidate` so far
  unsigned int unused[3];
};

struct SharedLayout {
  size_t sorted, candidate, histogram, totals, warp_sums, keys, bytes;
};

// Offsets are multiples of 16 bytes given a 32-byte control block.
__host__ __device__ inline SharedLayout shared_layout(int sort_capacity, int64_t cached_keys) {
  SharedLayout layout;
  layout.sorted = 32;
  layout.candidate = layout.sorted + static_cast<size_t>(sort_capacity) * 8;
  layout.histogram = layout.candidate + static_cast<size_t>(kCandidates) * 8;
  layout.totals = layout.histogram + 2 * kBins * 4;
  layout.warp_sums = layout.totals + kBins * 4;
  layout.keys = layout.warp_sums + 32 * 4;
  layout.bytes = layout.keys + static_cast<size_t>(cached_keys) * 4;
  return layout;
}

// The digit of a level: bits [shift, shift + width) of the entry, taken from the top.
struct Digit {
  int width, shift;
};
__device__ __forceinline__ Digit digit_after(int prefix_bits) {
  const int width = 64 - prefix_bits < kDigitBits ? 64 - prefix_bits : kDigitBits;
  return Digit{width, 64 - prefix_bits - width};
}

// The entry's top `bits` bits (bits > 0).
__device__ __forceinline__ uint64_t top_bits(uint64_t entry, int bits) {
  return entry >> (64 - bits);
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

// Finds the bin (of kBins, higher bins hold larger entries) where the count of entries in
// higher bins first reaches `need`, and writes it with its counts to *control. Every thread of
// the block calls it; blockDim.x is a power of two from 64 to kMaxThreads. The caller
// synchronizes before reading *control.
__device__ void find_threshold_bin(const uint32_t* totals, unsigned int need, uint32_t* warp_sums,
                                   Control* control) {
  const int threads = blockDim.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int per_thread = kBins / threads;
  const int top = kBins - 1 - per_thread * tid;  // this thread's bins: top, top - 1, ...
  uint32_t local = 0;
  for (int b = 0; b < per_thread; ++b)
    local += totals[top - b];
  uint32_t inclusive = local;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t value = __shfl_up_sync(kFullMask, inclusive, offset);
    if (lane >= offset) inclusive += value;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  uint32_t before = 0;
  for (int w = 0; w < warp; ++w)
    before += warp_sums[w];
  uint32_t above = before + inclusive - local;
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

__global__ void __launch_bounds__(kMaxThreads)
    topk_kernel(TopkProblem p, int64_t cached_keys, int sort_capacity) {
  cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / cluster_size;
  const int64_t length = p.length_of(row);
  const int64_t want = length < p.k ? length : p.k;
  const float* __restrict__ values = p.values + row * p.values_row_stride;
  float* out_values = p.out_values + row * p.out_values_row_stride;
  int32_t* out_indices = p.out_indices + row * p.out_indices_row_stride;
  const int threads = blockDim.x;
  const int tid = threadIdx.x;
  const int lane = tid & 31;

  if (want == 0) {  // uniform across the cluster: no CTA touches another's shared memory
    if (rank == 0) {
      for (int64_t j = tid; j < p.k; j += threads) {
        out_values[j] = -INFINITY;
        out_indices[j] = -1;
      }
    }
    return;
  }

  extern __shared__ __align__(16) uint8_t shared[];
  const SharedLayout layout = shared_layout(sort_capacity, cached_keys);
  Control* control = reinterpret_cast<Control*>(shared);
  uint64_t* sorted = reinterpret_cast<uint64_t*>(shared + layout.sorted);
  uint64_t* candidate = reinterpret_cast<uint64_t*>(shared + layout.candidate);
  uint32_t* histogram = reinterpret_cast<uint32_t*>(shared + layout.histogram);
  uint32_t* totals = reinterpret_cast<uint32_t*>(shared + layout.totals);
  uint32_t* warp_sums = reinterpret_cast<uint32_t*>(shared + layout.warp_sums);
  uint32_t* keys = reinterpret_cast<uint32_t*>(shared + layout.keys);
  const bool cached = cached_keys > 0;

  const int64_t segment = (length + cluster_size - 1) / cluster_size;
  const int64_t begin = min(length, rank * segment);
  const int64_t end = min(length, begin + segment);

  for (int i = tid; i < 2 * kBins; i += threads)
    histogram[i] = 0;
  if (tid == 0) {
    control->winners = 0;
    control->candidates = 0;
  }
  cluster.sync();  // the cluster runs and every counter is zero before any remote access

  // Calls visit(key, column, in_range) for every entry of the segment, in batches of kBatch per
  // thread whose loads are all issued first. The trip count is the same for every thread, so
  // visit may use warp collectives. First use (from_global) fills the key cache. Offsets within
  // the segment are 32-bit (L < 2^31): the per-entry work is a handful of instructions.
  const float* __restrict__ segment_values = values + begin;
  const int segment_size = static_cast<int>(end - begin);
  auto for_each_entry = [&](bool from_global, auto&& visit) {
    for (int base = 0; base < segment_size; base += threads * kBatch) {
      uint32_t batch[kBatch];
      if (from_global) {
        // Unconditional loads from clamped offsets: a load under a branch is issued only when
        // the previous one has been used, which made this pass one DRAM latency per entry.
        float loaded[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = min(base + u * threads + tid, segment_size - 1);
          loaded[u] = __ldg(segment_values + i);
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int i = base + u * threads + tid;
          batch[u] = ordered_key(loaded[u]);
          if (cached && i < segment_size) keys[i] = batch[u];
        }
      } else {
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
          batch[u] = keys[min(base + u * threads + tid, segment_size - 1)];
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * threads + tid;
        visit(batch[u], static_cast<uint32_t>(begin + i), i < segment_size);
      }
    }
  };

  // 1. Cluster levels until the chosen bin is needed whole (done) or fits the leader's buffer.
  const bool select_all = want == length;
  uint64_t prefix = 0;
  int prefix_bits = 0;
  unsigned int need = static_cast<unsigned int>(want);
  bool done = select_all;
  for (int level = 0; !done; ++level) {
    uint32_t* counts = histogram + (level & 1) * kBins;
    const Digit digit = digit_after(prefix_bits);
    for_each_entry(level == 0 || !cached, [&](uint32_t key, uint32_t column, bool in_range) {
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
    cluster.sync();  // every CTA's histogram of this level is complete
    for (int bin = tid; bin < kBins; bin += threads) {
      uint32_t total = 0;
      for (int source = 0; source < cluster_size; ++source) {
        total += cluster.map_shared_rank(counts, source)[bin];
      }
      totals[bin] = total;
      // The other buffer was last read remotely during the previous level, which every CTA
      // finished before the cluster.sync above.
      histogram[((level + 1) & 1) * kBins + bin] = 0;
    }
    __syncthreads();
    find_threshold_bin(totals, need, warp_sums, control);
    __syncthreads();
    prefix = (prefix << digit.width) | control->bin;
    prefix_bits += digit.width;
    need -= control->above;
    // Entries are unique, so at 64 bits the bin holds one entry and it is needed.
    done = control->count == need;
    if (control->count <= static_cast<unsigned int>(kCandidates)) break;
  }

  // 2. Winners and candidates to the leader.
  unsigned int* leader_winners = cluster.map_shared_rank(&control->winners, 0);
  unsigned int* leader_candidates = cluster.map_shared_rank(&control->candidates, 0);
  uint64_t* leader_sorted = cluster.map_shared_rank(sorted, 0);
  uint64_t* leader_candidate = cluster.map_shared_rank(candidate, 0);
  for_each_entry(!cached || select_all, [&](uint32_t key, uint32_t column, bool in_range) {
    const uint64_t entry = ranked_entry(key, column);
    const uint64_t top = select_all ? 0 : top_bits(entry, prefix_bits);
    const bool win = in_range && (select_all || top > prefix || (done && top == prefix));
    const bool maybe = in_range && !done && top == prefix;
    if (__ballot_sync(kFullMask, win || maybe) == 0) return;  // most warps, most of the time
    warp_append(leader_sorted, leader_winners, win, entry, lane);
    warp_append(leader_candidate, leader_candidates, maybe, entry, lane);
  });
  cluster.sync();  // the leader's buffers are complete; the other CTAs are done
  if (rank != 0) return;

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

  // Sort the exactly `want` winners, largest first.
  const int count = static_cast<int>(want);
  int size = 1;
  while (size < count)
    size <<= 1;
  __syncthreads();
  for (int i = count + tid; i < size; i += threads)
    sorted[i] = 0;
  __syncthreads();
  for (int width = 2; width <= size; width <<= 1) {
    for (int stride = width >> 1; stride > 0; stride >>= 1) {
      for (int i = tid; i < size / 2; i += threads) {
        const int lo = 2 * i - (i & (stride - 1));
        const int hi = lo + stride;
        const bool descending = (lo & width) == 0;
        const uint64_t a = sorted[lo];
        const uint64_t b = sorted[hi];
        if ((a < b) == descending) {
          sorted[lo] = b;
          sorted[hi] = a;
        }
      }
      __syncthreads();
    }
  }
  for (int64_t j = tid; j < p.k; j += threads) {
    if (j < count) {
      const uint32_t column = column_of(sorted[j]);
      out_values[j] = values[column];
      out_indices[j] = static_cast<int32_t>(column);
    } else {
      out_values[j] = -INFINITY;
      out_indices[j] = -1;
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

void topk_cuda(const TopkProblem& p, int device, CudaStream stream) {
  if (p.num_rows == 0 || p.k == 0) return;
  CudaDeviceGuard guard(device, kOperation);
  const int sm_count = cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  const int64_t L = p.row_size;

  // Enough CTAs per row to keep its keys in shared memory, and, for few rows, to use the SMs
  // without a second wave (the CTAs of a cluster run at once and take one SM each).
  int cluster_size = 1;
  while (cluster_size < kMaxCluster && ceil_div(L, cluster_size) > kCachedKeys)
    cluster_size *= 2;
  while (cluster_size < kMaxCluster && p.num_rows * cluster_size * 2 <= sm_count &&
         ceil_div(L, 2 * cluster_size) >= 4096)
    cluster_size *= 2;
  const int64_t segment = ceil_div(L, cluster_size);
  const int64_t cached_keys = segment <= kCachedKeys ? segment : 0;
  const int threads = segment >= 4096 ? 512 : segment >= 1024 ? 256 : 128;
  int sort_capacity = 1;
  while (sort_capacity < std::min<int64_t>(p.k, std::max<int64_t>(L, 1)))
    sort_capacity <<= 1;
  const size_t bytes = shared_layout(sort_capacity, cached_keys).bytes;
  if (p.num_rows > INT_MAX / cluster_size) {
    throw Error(std::string(kOperation) + ": the CUDA backend handles at most " +
                std::to_string(INT_MAX / cluster_size) + " rows of this length per call, got " +
                std::to_string(p.num_rows));
  }
  allow_dynamic_shared_memory(topk_kernel, static_cast<int>(bytes), device, kOperation);

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(p.num_rows * cluster_size), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(threads), 1, 1);
  config.dynamicSmemBytes = bytes;
  config.stream = reinterpret_cast<cudaStream_t>(stream);
  cudaLaunchAttribute attributes[1];
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = static_cast<unsigned>(cluster_size);
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  config.attrs = attributes;
  config.numAttrs = 1;
  check_launch(cudaLaunchKernelEx(&config, topk_kernel, p, cached_keys, sort_capacity), kOperation,
               "launching the top-k kernel");
}

}  // namespace detail
}  // namespace hdk
