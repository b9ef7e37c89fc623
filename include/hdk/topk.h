// Top-k of each row of a [N, L] fp32 matrix: the selection primitive of the DeepSeek-V4 router
// and indexer. The contract, case by case: docs/dsv4-router.md (section "hdk::topk").
//
//   out_values[n, j], out_indices[n, j] = the j-th largest of values[n, 0 .. len(n))
//
// with len(n) = clamp(row_lengths[n], 0, L) (L when row_lengths is not given), ties toward the
// lower index, NaN below every number, rows with fewer than k entries padded with index -1 and
// value -inf.
#pragma once

#include <cstdint>

#include "hdk/cuda_stream.h"
#include "hdk/tensor_view.h"

namespace hdk {

// The largest kMaxTopK entries per row is what hdk::topk (and the router's top_k) accept.
constexpr int64_t kMaxTopK = 2048;

// values      [N, L]  fp32, last dim contiguous, any row stride
// k           0 .. kMaxTopK (k > L is allowed: the missing entries are padding)
// out_values  [N, k]  fp32, last dim contiguous: descending
// out_indices [N, k]  int32, last dim contiguous: column of each value in its row
// row_lengths [N]     int32/int64, optional: entries at or past a row's length are excluded
// Runs on the device the tensors live on; CUDA work goes to the legacy default stream.
void topk(const TensorView& values, int64_t k, const TensorView& out_values,
          const TensorView& out_indices, const TensorView& row_lengths = TensorView());

// Same, with CUDA work enqueued on `stream` (ignored for CPU tensors): one kernel launch, no
// allocation, no host synchronization, so the call can be captured in a CUDA graph.
void topk(const TensorView& values, int64_t k, const TensorView& out_values,
          const TensorView& out_indices, const TensorView& row_lengths, CudaStream stream);

}  // namespace hdk
