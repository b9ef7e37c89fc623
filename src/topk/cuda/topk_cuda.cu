// CUDA backend of hdk::topk: one launch, a cluster of C CTAs per row (C = 1..8: enough to keep
// a row's keys in shared memory, and to use the SMs when rows are few), each CTA owning a
// contiguous segment of the row. Entries are 64-bit ranked entries (order-preserving key, then
// the inverted column), so they are unique, the k-th largest is exact and ties go to the lower
// column by construction. The selection (cluster_select.cuh, shared with dsv4::index_topk) is a
// radix select with 11-bit digits from the top over the cluster, finished by the row's leader CTA.
// The first version ran every 8-bit level over the whole row with cluster barriers between
// them; tied values push the select into the column bits, so it often took all 8 levels (137 us
// for N = 64, L = 65536, k = 512 on an H100).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <climits>
#include <string>

#include "core/cuda/dependent_launch.cuh"
#include "core/cuda_helpers.h"
#include "topk/cuda/cluster_select.cuh"
#include "topk/cuda/topk_cuda.h"
#include "topk/topk_key.h"
#include "topk/topk_launch_plan.h"

namespace hdk {
namespace detail {
namespace {

namespace cg = cooperative_groups;

constexpr const char* kOperation = "hdk::topk";
constexpr int kBatch = 16;  // entries per thread loaded before any is used (memory parallelism)

template <int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads)
    topk_kernel(TopkProblem p, int64_t cached_keys, int sort_capacity) {
  hdk::detail::begin_dependent_kernel();
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
  uint32_t* keys = reinterpret_cast<uint32_t*>(shared + topk_keys_offset(sort_capacity));
  const bool cached = cached_keys > 0;

  const int64_t segment = (length + cluster_size - 1) / cluster_size;
  const int64_t begin = min(length, rank * segment);
  const int64_t end = min(length, begin + segment);

  // Calls visit(key, column, in_range) for every entry of the segment, in batches of kBatch per
  // thread whose loads are all issued first. The trip count is the same for every thread, so
  // visit may use warp collectives. The first pass fills the key cache; later passes read it
  // (or the row again when it does not fit). Offsets within the segment are 32-bit (L < 2^31):
  // the per-entry work is a handful of instructions.
  const float* __restrict__ segment_values = values + begin;
  const int segment_size = static_cast<int>(end - begin);
  auto for_each_entry = [&](bool first, auto&& visit) {
    const bool from_global = first || !cached;
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

  // One round a batch: a batch held in registers costs this kernel occupancy (cluster_select).
  if (!cluster_select<1>(shared, sort_capacity, want, length, for_each_entry)) return;
  const uint64_t* sorted =
      reinterpret_cast<const uint64_t*>(shared + select_layout(sort_capacity).sorted);
  const int count = static_cast<int>(want);
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

}  // namespace

void topk_cuda(const TopkProblem& p, int device, CudaStream stream) {
  if (p.num_rows == 0 || p.k == 0) return;
  CudaDeviceGuard guard(device, kOperation);
  const int sm_count = cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  const TopkLaunchPlan plan = plan_topk_launch(p.num_rows, p.row_size, p.k, sm_count);
  const int cluster_size = plan.cluster_size;
  const auto kernel =
      plan.threads == kTopkWideThreads ? topk_kernel<kTopkWideThreads> : topk_kernel<kTopkThreads>;
  if (p.num_rows > INT_MAX / cluster_size) {
    throw Error(std::string(kOperation) + ": the CUDA backend handles at most " +
                std::to_string(INT_MAX / cluster_size) + " rows of this length per call, got " +
                std::to_string(p.num_rows));
  }
  allow_dynamic_shared_memory(kernel, static_cast<int>(plan.shared_bytes), device, kOperation);

  check_launch(launch_in_clusters(kernel, static_cast<unsigned>(p.num_rows * cluster_size),
                                  static_cast<unsigned>(plan.threads), plan.shared_bytes,
                                  reinterpret_cast<cudaStream_t>(stream),
                                  static_cast<unsigned>(cluster_size), p, plan.cached_keys,
                                  plan.sort_capacity),
               kOperation, "launching the top-k kernel");
}

}  // namespace detail
}  // namespace hdk
