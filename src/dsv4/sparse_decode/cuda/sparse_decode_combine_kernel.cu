// sparse_decode's combine of list splits through the caller's workspace: a tensor-core kernel
// whose plan splits a row outside its cluster (SparsePlan::through_workspace) leaves each CTA's
// partial result there, and this kernel, launched behind it (a programmatic dependent launch by
// default), finishes the row. Design: docs/dsv4-attention.md ("sparse_decode on CUDA").
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/cuda/count_invalid.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_device.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_kernels.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Finishes column slice `slice` of `slices` of one head group of one row from the partial results
// its splits left in the workspace: the row's validity (every CTA's flag, which includes its
// heads' sinks), each split's weight per head, lse, then each output column summed over the
// splits in split order. The same arithmetic as finish_row's.
__global__ void __launch_bounds__(kSparseCombineThreads)
    sparse_decode_combine_kernel(SparseDecodeProblem p, SparsePlan plan, int slices,
                                 bool out_vector) {
  __shared__ float factors[kSparseMaxWorkspaceSplits][kHeads];
  hdk::detail::begin_dependent_kernel();  // waits for the splits' partial results
  const int tid = threadIdx.x;
  const int slice = static_cast<int>(blockIdx.x % slices);
  const int group = static_cast<int>((blockIdx.x / slices) % plan.groups);
  const int64_t n = blockIdx.x / (static_cast<int64_t>(slices) * plan.groups);
  const int64_t head0 = int64_t{group} * kHeads;
  const SparseWorkspaceLayout layout =
      sparse_workspace_layout(p.num_rows, plan.groups, plan.splits);
  const float* o_records = reinterpret_cast<const float*>(p.workspace + layout.o_offset);
  const float* stats = reinterpret_cast<const float*>(p.workspace + layout.stats_offset);
  const int* flags = reinterpret_cast<const int*>(p.workspace + layout.flags_offset);
  auto record = [&](int split) { return sparse_record(n, split, group, plan.splits, plan.groups); };

  int bad = 0;
  for (int r = tid; r < plan.row_ctas(); r += kSparseCombineThreads)
    bad |= flags[n * plan.row_ctas() + r];
  const bool row_bad = __syncthreads_or(bad) != 0;

  if (tid < kHeads) {
    const int h = tid;
    float top = -INFINITY;
    for (int s = 0; s < plan.splits; ++s)
      top = fmaxf(top, stats[record(s) * 2 * kHeads + h]);
    const bool has_head = head0 + h < p.num_heads;
    const float sink =
        p.sink != nullptr && has_head ? p.sink[(head0 + h) * p.sink_stride] * kLog2e : -INFINITY;
    const float list_top = top;
    top = fmaxf(top, sink);
    float lse = -INFINITY;
    if (top == -INFINITY) {
      for (int s = 0; s < plan.splits; ++s)
        factors[s][h] = 0.0f;
    } else {
      float denominator = exp2f(sink - top);
      for (int s = 0; s < plan.splits; ++s) {
        const float* stat = stats + record(s) * 2 * kHeads;
        const float weight = exp2f(stat[h] - top);
        denominator += stat[kHeads + h] * weight;
        factors[s][h] = weight;
      }
      for (int s = 0; s < plan.splits; ++s)
        factors[s][h] /= denominator;
      lse = list_top == -INFINITY ? p.sink[(head0 + h) * p.sink_stride]
                                  : (top + log2f(denominator)) * kLn2;
    }
    if (!p.lse_includes_sink) {
      float list_sum = 0.0f;
      for (int s = 0; s < plan.splits; ++s) {
        const float* stat = stats + record(s) * 2 * kHeads;
        list_sum += stat[kHeads + h] * exp2f(stat[h] - list_top);
      }
      lse = list_top == -INFINITY ? -INFINITY : (list_top + log2f(list_sum)) * kLn2;
    }
    if (slice == 0 && has_head && p.lse != nullptr) {
      p.lse[n * p.lse_row_stride + (head0 + h) * p.lse_head_stride] = row_bad ? NAN : lse;
    }
  }
  __syncthreads();  // factors are complete

  const int quads = static_cast<int>(kHeadDim / 4) / slices;  // column quads of the slice
  for (int job = tid; job < kHeads * quads; job += kSparseCombineThreads) {
    const int h = job / quads;
    const int col = 4 * (slice * quads + job % quads);
    const int64_t head = head0 + h;
    if (head >= p.num_heads) continue;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!row_bad) {
#pragma unroll 4
      for (int s = 0; s < plan.splits; ++s) {
        const float4 v =
            *reinterpret_cast<const float4*>(o_records + (record(s) * kHeads + h) * kHeadDim + col);
        const float f = factors[s][h];
        sum.x += f * v.x, sum.y += f * v.y, sum.z += f * v.z, sum.w += f * v.w;
      }
    }
    store_output4(p, n * p.out_row_stride + head * p.out_head_stride + col, sum, out_vector);
  }
  if (slice == 0 && group == 0 && tid == 0 && row_bad) count_invalid(p.invalid_count, 1);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
