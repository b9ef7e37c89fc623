// Steps 2 and 3 of the one launch and the workspace's select kernel: a row's keys to its cluster's
// shared memory and hdk::topk's cluster select over them; the leader writes the outputs.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/cuda/index_topk_device.cuh"
#include "dsv4/index_topk/index_launch_plan.h"
#include "topk/cuda/cluster_select.cuh"
#include "topk/cuda/cta_select.cuh"
#include "topk/select_layout.h"
#include "topk/topk_key.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

// The score a ranked key stands for (ordered_key's inverse; -0 comes back as +0).
__device__ __forceinline__ float value_of_key(uint32_t key) {
  if (key == 0u) return __uint_as_float(0x7fc00000u);
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// 2 and 3, for the one-launch kernel and the workspace's select kernel alike: every CTA of the
// row's cluster takes its share of the row (cluster_segment), whose keys `fill(first, count, out,
// counts)` puts in out[0 .. count) for entries first .. first + count - 1 (counting each into
// `counts`, the select's first level, when that is not null), and the cluster selects; the leader
// writes the outputs. `length` is 0 for an invalid row (padding only). `first_level`: the
// first-level histogram, zeroed before the caller's last barrier, where `fill` may count it.
// kCtaThreads: the CTA's threads (kThreads in the one launch, kSelectThreads or
// kCtaSelectThreads in the select kernel). kOneCta: the CTA is alone with the row (no cluster),
// which the plan gives only where the whole row fits its shared memory; it selects by cta_select.
// kShareGranule: cluster_segment's granule (the one launch scores its shares with 1).
template <int kCtaThreads = kThreads, bool kOneCta = false, int kShareGranule = 1, typename Fill>
__device__ void select_row(const IndexerProblem& p, int64_t row, int64_t length,
                           const IndexLaunch& launch, uint8_t* shared, uint32_t* first_level,
                           Fill&& fill) {
  const ClusterPlace place = cluster_place<kOneCta>();
  const int cluster_size = place.size;
  const int rank = place.rank;
  const int tid = threadIdx.x;
  uint32_t* scores = reinterpret_cast<uint32_t*>(shared + launch.scores);

  const int64_t want = length < p.top_k ? length : p.top_k;
  int32_t* out_indices = p.topk_indices + row * p.topk_indices_row_stride;
  float* out_scores =
      p.topk_scores != nullptr ? p.topk_scores + row * p.topk_scores_row_stride : nullptr;
  int32_t* out_slots =
      p.topk_slots != nullptr ? p.topk_slots + row * p.topk_slots_row_stride : nullptr;
  if (want == 0) {  // the same in every CTA of the cluster: none touches another's memory
    if (rank == 0) {
      for (int64_t j = tid; j < p.top_k; j += kCtaThreads) {
        out_indices[j] = -1;
        if (out_scores != nullptr) out_scores[j] = -INFINITY;
        if (out_slots != nullptr) out_slots[j] = -1;
      }
    }
    return;
  }

  // 2. Keys of the segment, kept in shared memory when they fit (always up to 8 x chunk).
  const Segment segment = cluster_segment(length, cluster_size, rank, kShareGranule);
  const int64_t begin = segment.first;
  const int64_t size = segment.last - segment.first;
  const bool resident = size <= launch.chunk;
  // Counted while filled only when every key is filled once, before the select.
  uint32_t* const counts = resident ? first_level : nullptr;
  if (resident && size > 0) fill(begin, size, scores, counts);
  __syncthreads();

  // 3. The select over the keys; in a cluster, rounds of one key per thread.
  if constexpr (kOneCta) {
    hdk::detail::cta_select<kCtaThreads>(shared, launch.sort_capacity, scores,
                                         static_cast<int>(size), static_cast<int>(want),
                                         counts != nullptr);
  } else {
    auto for_each_entry = [&](bool /*first*/, auto&& visit) {
      for (int64_t chunk = 0; chunk < size; chunk += launch.chunk) {
        const int count = static_cast<int>(min(launch.chunk, size - chunk));
        if (!resident) {
          __syncthreads();  // the previous chunk's keys are all visited
          fill(begin + chunk, count, scores, nullptr);
          __syncthreads();
        }
        for (int base = 0; base < count; base += kCtaThreads) {
          const int i = base + tid;
          visit(scores[min(i, count - 1)], static_cast<uint32_t>(begin + chunk + i), i < count);
        }
      }
    };
    // Resident keys go to the leader by split_by_quads. The others in batches of 4 rounds
    // (cluster_select.cuh): the select runs after the scoring, whose registers it reuses.
    const hdk::detail::ResidentSegment segment_keys =
        resident ? hdk::detail::ResidentSegment{scores, static_cast<uint32_t>(begin),
                                                static_cast<int>(size)}
                 : hdk::detail::ResidentSegment{};
    if (!cluster_select<4>(shared, launch.sort_capacity, want, length, for_each_entry,
                           counts != nullptr, segment_keys)) {
      return;
    }
  }

  // The slots of a batch of outputs are looked up before any output is written: the compiler
  // cannot tell the stores from the block-table loads, and a loop of one of each waited a
  // memory latency an output.
  const uint64_t* sorted =
      reinterpret_cast<const uint64_t*>(shared + select_layout(launch.sort_capacity).sorted);
  constexpr int kOutputBatch = 4;
  for (int64_t base = tid; base < p.top_k; base += kOutputBatch * kCtaThreads) {
    uint64_t entry[kOutputBatch];
    int64_t slot[kOutputBatch];
#pragma unroll
    for (int b = 0; b < kOutputBatch; ++b) {
      const int64_t j = base + b * kCtaThreads;
      entry[b] = j < want ? sorted[j] : 0;
      // The key cache's slot of the entry: validation checked that every slot fits int32.
      slot[b] = j < want && out_slots != nullptr ? p.slot(row, column_of(entry[b])) : -1;
    }
#pragma unroll
    for (int b = 0; b < kOutputBatch; ++b) {
      const int64_t j = base + b * kCtaThreads;
      if (j >= p.top_k) break;
      const bool found = j < want;
      out_indices[j] = found ? static_cast<int32_t>(column_of(entry[b])) : -1;
      if (out_scores != nullptr)
        out_scores[j] = found ? value_of_key(static_cast<uint32_t>(entry[b] >> 32)) : -INFINITY;
      if (out_slots != nullptr) out_slots[j] = static_cast<int32_t>(slot[b]);
    }
  }
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
