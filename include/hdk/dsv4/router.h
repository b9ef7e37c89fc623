// DeepSeek-V4 MoE routing for the decode path: the sqrt-softplus router and the hash router.
// The contract, case by case: docs/dsv4-router.md; the math (docs/spec.md, section Router):
//
//   s        = sqrt(softplus(logits))         logits = hidden · gate_weightᵀ (fp32) or given
//   selected = top_k of (s + bias)            or tid2eid[token_id] for hash routing
//   weights  = s[selected] / sum(s[selected]) * route_scale
#pragma once

#include <cstdint>

#include "hdk/cuda_stream.h"
#include "hdk/tensor_view.h"

namespace hdk {
namespace dsv4 {

struct RouterParams {
  // Scores: give `logits`, or `hidden` with `gate_weight` (the fused path computes the gate
  // GEMM itself, in fp32).
  TensorView logits;       // [N, E] fp32 or bf16, last dim contiguous
  TensorView hidden;       // [N, D] bf16, last dim contiguous
  TensorView gate_weight;  // [E, D] bf16, last dim contiguous

  // Optional [E] fp32 selection bias: added to s to choose the experts, never to the weights.
  // Dense routing only.
  TensorView bias;

  // Hash routing (both or neither): row n uses the experts tid2eid[token_ids[n], :].
  TensorView token_ids;  // [N] int32/int64
  TensorView tid2eid;    // [vocab, top_k] int32

  // Outputs.
  TensorView topk_ids;      // [N, top_k] int32, last dim contiguous
  TensorView topk_weights;  // [N, top_k] fp32, last dim contiguous

  // [S, N, E] fp32 with S >= route_workspace_slabs(N), last dim contiguous; only with hidden +
  // gate_weight. Required on CUDA, where it is the scratch between the gate GEMM (spread over
  // every SM, which writes one slab of partial logits per slice of D) and the per-row epilogue
  // (which sums the slabs in order): hdk allocates nothing on the call path. After the call,
  // slab 0 holds the fp32 logits. Optional on the CPU.
  TensorView logits_workspace;

  // Optional [1] or scalar int32/int64 counter. Each row that gets ids -1 and weights 0 (NaN
  // logits, weights that cannot be formed, and on CUDA a token id or table entry out of range)
  // adds 1 here. hdk adds to it and never clears it.
  TensorView invalid_count;

  int64_t top_k = 6;         // 1 .. min(E, 2048)
  float route_scale = 1.0f;  // finite
};

// The number of slabs `logits_workspace` needs for N rows: 16 up to 64 rows, then 16 / ceil(N /
// 64), at least 1 (so at most max(1024, N) * E floats). The same on every device and backend.
int64_t route_workspace_slabs(int64_t num_tokens);

// Runs on the device the tensors live on (all on the CPU, or all on one CUDA device).
// CUDA work is enqueued on the legacy default stream.
void route(const RouterParams& params);

// Same, with CUDA work enqueued on `stream` (ignored for CPU tensors). No allocation, no host
// synchronization and no JIT: the call can be captured in a CUDA graph.
void route(const RouterParams& params, CudaStream stream);

}  // namespace dsv4
}  // namespace hdk
