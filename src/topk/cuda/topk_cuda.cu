// CUDA backend of hdk::topk: one launch, a cluster of C CTAs per row (C = 1..8, more for long
// rows and for few rows), each CTA owning a contiguous segment of the row.
//  1. Radix select over the row's ranked entries (key << 32 | ~column: unique, so the k-th largest
//     is exact and ties go to the lower column by construction), 8 bits per level from the top.
//     Each level histograms the entries that match the prefix so far (shared-memory atomics,
//     aggregated per warp with __match_any_sync because real scores crowd into few top bytes),
//     sums the cluster's histograms through distributed shared memory, and picks the bin that
//     holds the k-th entry. It stops as soon as the chosen bin is needed whole, which for
//     untied data is after 2 or 3 of the 8 possible levels.
//  2. Every entry at or above the final prefix is appended to the leader CTA's buffer (remote
//     shared-memory atomics, one per warp), exactly min(k, length) of them.
//  3. The leader sorts them (bitonic, in shared memory) and writes values and columns.
// A CTA keeps its segment's keys in shared memory (up to 32768 per CTA, i.e. rows up to 262144
// with 8 CTAs) so only the first level reads global memory; longer rows re-read it each level.
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
constexpr int kBins = 256;
constexpr int kBatch = 8;  // entries per thread loaded before any is used (memory parallelism)
constexpr int kMaxThreads = 512;

struct Control {
  unsigned long long prefix;  // the bytes of the k-th entry chosen so far
  unsigned int remaining;     // entries still needed from those that match the prefix
  unsigned int done;          // the last chosen bin is needed whole
  unsigned int selected;      // leader only: entries appended so far
  unsigned int unused;
};

struct SharedLayout {
  size_t sorted, histogram, totals, keys, bytes;
};

// Offsets are multiples of 16 bytes given a 32-byte control block.
__host__ __device__ inline SharedLayout shared_layout(int sort_capacity, int64_t cached_keys) {
  SharedLayout layout;
  layout.sorted = 32;
  layout.histogram = layout.sorted + static_cast<size_t>(sort_capacity) * 8;
  layout.totals = layout.histogram + 2 * kBins * 4;
  layout.keys = layout.totals + kBins * 4;
  layout.bytes = layout.keys + static_cast<size_t>(cached_keys) * 4;
  return layout;
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
  uint32_t* histogram = reinterpret_cast<uint32_t*>(shared + layout.histogram);
  uint32_t* totals = reinterpret_cast<uint32_t*>(shared + layout.totals);
  uint32_t* keys = reinterpret_cast<uint32_t*>(shared + layout.keys);
  const bool cached = cached_keys > 0;

  const int64_t segment = (length + cluster_size - 1) / cluster_size;
  const int64_t begin = min(length, rank * segment);
  const int64_t end = min(length, begin + segment);

  for (int i = tid; i < 2 * kBins; i += threads)
    histogram[i] = 0;
  if (tid == 0) control->selected = 0;
  cluster.sync();  // the cluster runs and every counter is zero before any remote access

  // Calls visit(i, key, in_range) for every entry of the segment, in batches of kBatch per
  // thread whose loads are all issued first. The trip count is the same for every thread, so
  // visit may use warp collectives. First use (from_global) fills the key cache.
  auto for_each_entry = [&](bool from_global, auto&& visit) {
    for (int64_t base = begin; base < end; base += static_cast<int64_t>(threads) * kBatch) {
      uint32_t batch[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * threads + tid;
        batch[u] = 0;
        if (i < end) batch[u] = from_global ? ordered_key(__ldg(values + i)) : keys[i - begin];
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int64_t i = base + static_cast<int64_t>(u) * threads + tid;
        if (from_global && cached && i < end) keys[i - begin] = batch[u];
        visit(i, batch[u], i < end);
      }
    }
  };

  const bool select_all = want == length;
  unsigned long long prefix = 0;
  unsigned int remaining = static_cast<unsigned int>(want);
  int level = 0;
  if (!select_all) {
    for (;; ++level) {
      uint32_t* counts = histogram + (level & 1) * kBins;
      const int shift = 56 - 8 * level;
      for_each_entry(level == 0 || !cached, [&](int64_t i, uint32_t key, bool in_range) {
        const uint64_t entry = ranked_entry(key, static_cast<uint32_t>(i));
        const bool counted = in_range && (level == 0 || (entry >> (shift + 8)) == prefix);
        if (__ballot_sync(0xffffffffu, counted) == 0) return;
        const unsigned int bin =
            counted ? static_cast<unsigned int>(entry >> shift) & 0xffu : 0x100u;
        const unsigned int peers = __match_any_sync(0xffffffffu, bin);
        if (counted && lane == __ffs(peers) - 1) atomicAdd(&counts[bin], __popc(peers));
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
      if (tid < 32) {
        // Lane l holds bins 255 - 8l .. 248 - 8l; an inclusive scan from the top bin down finds
        // the lane, then the bin, where the count of larger entries reaches `remaining`.
        const int top = kBins - 1 - 8 * lane;
        uint32_t local = 0;
#pragma unroll
        for (int b = 0; b < 8; ++b)
          local += totals[top - b];
        uint32_t inclusive = local;
#pragma unroll
        for (int offset = 1; offset < 32; offset <<= 1) {
          const uint32_t value = __shfl_up_sync(0xffffffffu, inclusive, offset);
          if (lane >= offset) inclusive += value;
        }
        uint32_t above = inclusive - local;
        if (above < remaining && remaining <= inclusive) {
          for (int b = 0; b < 8; ++b) {
            const uint32_t count = totals[top - b];
            if (above + count >= remaining) {
              control->prefix = (prefix << 8) | static_cast<unsigned long long>(top - b);
              control->remaining = remaining - above;
              control->done = count == remaining - above ? 1u : 0u;
              break;
            }
            above += count;
          }
        }
      }
      __syncthreads();
      prefix = control->prefix;
      remaining = control->remaining;
      // Entries are unique, so the last level (all 64 bits) always ends it.
      if (control->done || level == 7) break;
    }
  }

  // Append every selected entry to the leader's buffer.
  const int final_shift = 56 - 8 * level;
  unsigned int* leader_count = cluster.map_shared_rank(&control->selected, 0);
  uint64_t* leader_sorted = cluster.map_shared_rank(sorted, 0);
  for_each_entry(!cached || select_all, [&](int64_t i, uint32_t key, bool in_range) {
    const uint64_t entry = ranked_entry(key, static_cast<uint32_t>(i));
    const bool take = in_range && (select_all || (entry >> final_shift) >= prefix);
    const unsigned int ballot = __ballot_sync(0xffffffffu, take);
    if (ballot == 0) return;
    const int first = __ffs(ballot) - 1;
    unsigned int slot = 0;
    if (lane == first) slot = atomicAdd(leader_count, static_cast<unsigned int>(__popc(ballot)));
    slot = __shfl_sync(0xffffffffu, slot, first);
    if (take) leader_sorted[slot + __popc(ballot & ((1u << lane) - 1u))] = entry;
  });
  cluster.sync();  // the leader's buffer is complete; the other CTAs are done
  if (rank != 0) return;

  const int count = static_cast<int>(want);
  int size = 1;
  while (size < count)
    size <<= 1;
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

  // Enough CTAs per row to keep its keys in shared memory, and, for few rows, to use the SMs.
  int cluster_size = 1;
  while (cluster_size < kMaxCluster && ceil_div(L, cluster_size) > kCachedKeys)
    cluster_size *= 2;
  while (cluster_size < kMaxCluster && p.num_rows * cluster_size < sm_count &&
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
