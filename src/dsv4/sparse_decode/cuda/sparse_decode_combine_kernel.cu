// sparse_decode's combine of list splits through the caller's workspace: a tensor-core kernel
// whose plan splits a row outside its cluster (SparsePlan::through_workspace) leaves each CTA's
// partial result there, and this kernel, launched behind it (a programmatic dependent launch by
// default), finishes the row. Design: docs/dsv4-attention.md ("sparse_decode on CUDA").
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "core/cuda/count_invalid.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_device.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_kernels.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Adds `splits` partial results of kColumns columns, each times its split's weight
// (weights[s * weight_step]), in split order, with kBatch splits' loads in flight before the
// first of them is summed.
template <int kBatch, typename Record, int kColumns>
__device__ __forceinline__ void add_partials(float (&sum)[kColumns], const Record* o,
                                             int64_t o_step, const float* weights, int weight_step,
                                             int splits) {
  using Columns = PartialColumns<Record, kColumns>;
  using Load = typename Columns::Load;
#pragma unroll 1
  for (int first = 0; first < splits; first += kBatch) {
    Load v[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (first + b < splits) v[b] = *reinterpret_cast<const Load*>(o + (first + b) * o_step);
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      if (first + b < splits) Columns::add(sum, weights[(first + b) * weight_step], v[b]);
    }
  }
}

// The combine's jobs over column slice `slice` of `slices` of one head group: kColumns columns of
// one head a job, each the sum of the splits' partials (`o_first`: split 0's record of the group,
// `o_step` a split further) times their weights, stored to the output.
template <int kGroupHeads, typename Record, int kColumns>
__device__ __forceinline__ void combine_columns(const SparseDecodeProblem& p, const Record* o_first,
                                                int64_t o_step, const float* split_stats,
                                                int splits, int64_t n, int64_t head0, int slice,
                                                int slices, bool row_bad, bool out_vector,
                                                int tid) {
  constexpr int kStatsPerSplit = 2 * kGroupHeads;  // a split's maxima (weights), then sums
  const int units = static_cast<int>(kHeadDim / kColumns) / slices;  // column units of the slice
#pragma unroll 1
  for (int job = tid; job < kGroupHeads * units; job += kSparseCombineThreads) {
    const int h = job / units;
    const int col = kColumns * (slice * units + job % units);
    const int64_t head = head0 + h;
    if (head >= p.num_heads) continue;
    float sum[kColumns] = {};
    if (!row_bad) {
      const Record* o = o_first + h * kHeadDim + col;
      // Batches of 16 splits' loads (one round for up to 16 splits: the pipelined kernel's 16,
      // Flash CSA's 10 one-tile splits; two or three for 18-33) where a loop unrolled by 4 had
      // kept two in flight: 16 splits 1.02-1.06x, one-tile splits 1.04-1.14x (H200). Rows of at
      // most 8 splits take batches of 4: with 16 their predicated-off loads and sums cost 3-4%
      // at 2 and 4 splits.
      const float* weights = split_stats + h;
      if (splits > 8) {
        add_partials<16>(sum, o, o_step, weights, kStatsPerSplit, splits);
      } else {
        add_partials<4>(sum, o, o_step, weights, kStatsPerSplit, splits);
      }
    }
    const int64_t offset = n * p.out_row_stride + head * p.out_head_stride + col;
#pragma unroll
    for (int c = 0; c < kColumns; c += 4) {
      store_output4(p, offset + c, make_float4(sum[c], sum[c + 1], sum[c + 2], sum[c + 3]),
                    out_vector);
    }
  }
}

namespace {

// Finishes column slice `slice` of `slices` of one head group of one row from the partial results
// its splits left in the workspace: the row's validity (every CTA's flag, which includes its
// heads' sinks), each split's weight per head, lse, then each output column summed over the
// splits in split order. The same arithmetic as finish_row's. kGroupHeads: the heads of a group
// (SparsePlan::group_heads), of a record in the workspace.
// Its time is latency: the flags, the sinks and every split's statistics go out in one round,
// then the partials in batches of 16 splits (4 in rows of up to 8), in short code (32-bit block
// indices, the statistics' loop unrolled by 4 only, one copy of the output loop). The same round
// with every load unrolled (53 KB) was 1.00-1.13x after the mma kernel but 0.89-0.96x after the
// pipelined one, whose larger code, we read, leaves this kernel's to be fetched again (H200;
// docs/dsv4-attention.md, "sparse_decode through the workspace").
// kBf16Records: the records hold bf16 partials (bf16 outputs, finish_row), read eight columns a
// job; an instance of its own keeps each loop's registers and code apart.
template <int kGroupHeads, bool kBf16Records>
__global__ void __launch_bounds__(kSparseCombineThreads)
    sparse_decode_combine_kernel(SparseDecodeProblem p, SparsePlan plan, int slices,
                                 bool out_vector) {
  // Every split's statistics as its record holds them ([split][maxima, sums] of kGroupHeads
  // each); the maxima become the splits' weights.
  __shared__ float split_stats[kSparseMaxWorkspaceSplits * 2 * kGroupHeads];
  constexpr int kStatsPerSplit = 2 * kGroupHeads;
  constexpr int kBatch = 8;  // statistics a thread loads before it stores the first
  const int tid = threadIdx.x;
  // 32-bit: the grid has fewer than 2^31 CTAs.
  const int block = static_cast<int>(blockIdx.x);
  const int slice = block % slices;
  const int group = (block / slices) % plan.groups;
  const int64_t n = block / (slices * plan.groups);
  const int64_t head0 = int64_t{group} * kGroupHeads;
  const bool has_head = tid < kGroupHeads && head0 + tid < p.num_heads;
  const SparseWorkspaceLayout layout =
      sparse_workspace_layout(p.num_rows, plan.groups, plan.splits, kGroupHeads);
  const float* o_records = reinterpret_cast<const float*>(p.workspace + layout.o_offset);
  const int* flags = reinterpret_cast<const int*>(p.workspace + layout.flags_offset);
  // Split s's statistics are kStatsPerSplit floats at s * split_step from the first split's.
  const float* stats = reinterpret_cast<const float*>(p.workspace + layout.stats_offset) +
                       sparse_record(n, 0, group, plan.splits, plan.groups) * kStatsPerSplit;
  const int64_t split_step = int64_t{plan.groups} * kStatsPerSplit;
  hdk::detail::begin_dependent_kernel();  // waits for the splits' partial results

  // One round: the flags, the sinks and this thread's statistics all go out before any is used.
  // (The same flags read by a loop of one pass: 0.89-1.02x where this form is 1.01-1.09x, H200.)
  static_assert(kSparseCombineThreads >= kSparseMaxWorkspaceRowCtas, "one flag a thread");
  const int bad = tid < plan.row_ctas() ? flags[n * plan.row_ctas() + tid] : 0;
  const float sink = p.sink != nullptr && has_head ? p.sink[(head0 + tid) * p.sink_stride] : 0.0f;
  const int stat_count = plan.splits * kStatsPerSplit;
#pragma unroll 1
  for (int first = 0; first < stat_count; first += kBatch * kSparseCombineThreads) {
    float value[kBatch];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int k = first + tid + b * kSparseCombineThreads;
      if (k < stat_count) value[b] = stats[k / kStatsPerSplit * split_step + k % kStatsPerSplit];
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int k = first + tid + b * kSparseCombineThreads;
      if (k < stat_count) split_stats[k] = value[b];
    }
  }
  const bool row_bad = __syncthreads_or(bad) != 0;  // also: the statistics are in

  if (tid < kGroupHeads) {
    const int h = tid;
    float* weight = split_stats + h;                   // [s * kStatsPerSplit]: maxima, weights
    const float* sum = split_stats + kGroupHeads + h;  // [s * kStatsPerSplit]
    float top = -INFINITY;
#pragma unroll 4
    for (int s = 0; s < plan.splits; ++s)
      top = fmaxf(top, weight[s * kStatsPerSplit]);
    const float sink_log2 = p.sink != nullptr && has_head ? sink * kLog2e : -INFINITY;
    const float list_top = top;
    top = fmaxf(top, sink_log2);
    float lse = -INFINITY;
    float list_sum = 0.0f;  // the list's own sum, for lse without the sink
    if (!p.lse_includes_sink) {
#pragma unroll 4
      for (int s = 0; s < plan.splits; ++s)
        list_sum += sum[s * kStatsPerSplit] * exp2f(weight[s * kStatsPerSplit] - list_top);
    }
    if (top == -INFINITY) {
#pragma unroll 4
      for (int s = 0; s < plan.splits; ++s)
        weight[s * kStatsPerSplit] = 0.0f;
    } else {
      float denominator = exp2f(sink_log2 - top);
#pragma unroll 4
      for (int s = 0; s < plan.splits; ++s) {
        const float w = exp2f(weight[s * kStatsPerSplit] - top);
        denominator += sum[s * kStatsPerSplit] * w;
        weight[s * kStatsPerSplit] = w;
      }
#pragma unroll 4
      for (int s = 0; s < plan.splits; ++s)
        weight[s * kStatsPerSplit] /= denominator;
      lse = list_top == -INFINITY ? sink : (top + log2f(denominator)) * kLn2;
    }
    if (!p.lse_includes_sink) {
      lse = list_top == -INFINITY ? -INFINITY : (list_top + log2f(list_sum)) * kLn2;
    }
    if (slice == 0 && has_head && p.lse != nullptr) {
      p.lse[n * p.lse_row_stride + (head0 + h) * p.lse_head_stride] = row_bad ? NAN : lse;
    }
  }
  __syncthreads();  // the weights are complete

  // One split's record further.
  const int64_t o_step = int64_t{plan.groups} * kGroupHeads * kHeadDim;
  const int64_t first_record =
      sparse_record(n, 0, group, plan.splits, plan.groups) * kGroupHeads * kHeadDim;
  if constexpr (kBf16Records) {
    const uint16_t* o_first =
        reinterpret_cast<const uint16_t*>(p.workspace + layout.o_offset) + first_record;
    combine_columns<kGroupHeads, uint16_t, 8>(p, o_first, o_step, split_stats, plan.splits, n,
                                              head0, slice, slices, row_bad, out_vector, tid);
  } else {
    combine_columns<kGroupHeads, float, 4>(p, o_records + first_record, o_step, split_stats,
                                           plan.splits, n, head0, slice, slices, row_bad,
                                           out_vector, tid);
  }
  if (slice == 0 && group == 0 && tid == 0 && row_bad) count_invalid(p.invalid_count, 1);
}

// The combine's instances of one record type, by group size (nullptr: none for that size).
template <bool kBf16Records>
CombineKernel combine_instance(int group_heads) {
  switch (group_heads) {
    case kHeads / 4:
      return sparse_decode_combine_kernel<kHeads / 4, kBf16Records>;
    case kHeads / 2:
      return sparse_decode_combine_kernel<kHeads / 2, kBf16Records>;
    case kHeads:
      return sparse_decode_combine_kernel<kHeads, kBf16Records>;
    default:
      return nullptr;
  }
}

}  // namespace

CombineKernel sparse_decode_combine_instance(int group_heads, bool bf16_records) {
  const CombineKernel kernel =
      bf16_records ? combine_instance<true>(group_heads) : combine_instance<false>(group_heads);
  if (kernel != nullptr) return kernel;
  throw Error("hdk::dsv4::sparse_decode: no combine instance for groups of " +
              std::to_string(group_heads) + " heads (the plan makes 64, 32 or 16)");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
