// The launch plan of hdk::topk's CUDA kernel (cuda/topk_cuda.cu): CTAs a row (one cluster),
// threads a CTA and which kernel instance, whether a CTA keeps its keys in shared memory, and the
// shared memory it takes. Plain C++, so that tests/topk/topk_launch_plan_test.cpp checks it on the
// CPU.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/ceil_div.h"
#include "core/host_device.h"
#include "topk/select_layout.h"

namespace hdk {
namespace detail {

constexpr int kTopkMaxCluster = 8;
constexpr int64_t kTopkCachedKeys = 32768;  // 128 KiB of shared memory a CTA
// Threads a CTA: 1024 from segments of 16384 keys, where every pass over the keys then takes half
// the rounds (H200: 1.06-1.22x, 64 x 65536 : 512 48.6 -> 40.0 us); below that 128-512, as many as
// the segment keeps busy (1024 threads on segments of 4096-8192 keys: 0.84-0.95x). The 1024-thread
// kernel is an instance of its own, so the other keeps 512 as its bound.
constexpr int kTopkThreads = 512;
constexpr int kTopkWideThreads = 1024;
constexpr int64_t kTopkWideSegment = 16384;

struct TopkLaunchPlan {
  int cluster_size = 1;
  int threads = 128;
  int64_t cached_keys = 0;  // keys a CTA keeps in shared memory (0: later passes reread the row)
  int sort_capacity = 1;    // power of two >= the most winners a row can have
  size_t shared_bytes = 0;  // the select's layout, then the cached keys
};

// Where a CTA's cached keys start: after the select's shared memory.
HDK_HOST_DEVICE size_t topk_keys_offset(int sort_capacity) {
  return select_layout(sort_capacity).bytes;
}

// For `rows` rows of `row_size` values and k (1 .. kMaxTopK) on a device of `sm_count` SMs:
// enough CTAs a row to keep its keys in shared memory, and, for few rows, more to use the SMs
// without a second wave (a cluster's CTAs run at once, one SM each), each keeping 4096 keys or
// more.
inline TopkLaunchPlan plan_topk_launch(int64_t rows, int64_t row_size, int64_t k, int sm_count) {
  TopkLaunchPlan plan;
  int& cluster_size = plan.cluster_size;
  while (cluster_size < kTopkMaxCluster && ceil_div(row_size, cluster_size) > kTopkCachedKeys)
    cluster_size *= 2;
  while (cluster_size < kTopkMaxCluster && rows * cluster_size * 2 <= sm_count &&
         ceil_div(row_size, 2 * cluster_size) >= 4096)
    cluster_size *= 2;
  const int64_t segment = ceil_div(row_size, cluster_size);
  plan.cached_keys = segment <= kTopkCachedKeys ? segment : 0;
  plan.threads = segment >= kTopkWideSegment ? kTopkWideThreads
                 : segment >= 4096           ? kTopkThreads
                 : segment >= 1024           ? 256
                                             : 128;
  plan.sort_capacity = select_sort_capacity(k, row_size);
  plan.shared_bytes =
      topk_keys_offset(plan.sort_capacity) + static_cast<size_t>(plan.cached_keys) * 4;
  return plan;
}

}  // namespace detail
}  // namespace hdk
