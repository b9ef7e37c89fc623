// The router's CUDA kernels as seen by the dispatcher in router_cuda.cu. The gate GEMM lives in
// its own translation unit (router_gate_gemm.cu) so nvcc compiles it in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsv4/router/router_problem.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// What both gate-product kernels read and write: logits[n, e] = hidden[n] · gate_weight[e].
struct GateOperands {
  const uint16_t* hidden;  // bf16 bits
  int64_t hidden_stride;
  const uint16_t* weight;
  int64_t weight_stride;
  float* logits;
  int64_t logits_stride;
  int64_t N, E, D;
};

inline GateOperands gate_operands(const RouterProblem& p) {
  return GateOperands{
      p.hidden,           p.hidden_row_stride,           p.gate_weight, p.gate_weight_row_stride,
      p.logits_workspace, p.logits_workspace_row_stride, p.num_tokens,  p.num_experts,
      p.hidden_size};
}

// Which gate product runs (router_cuda.cu): the CUDA-core GEMV for N <= kGemvMaxRows, the
// cluster-reduced GEMM up to kClusterGateMaxRows, the split GEMM beyond. All three write the
// fp32 products into logits_workspace and are deterministic.

// N <= kClusterGateMaxRows: slab 0 of logits_workspace = hidden · gate_weightᵀ in fp32 (bf16
// tensor-core MMA). Each cluster of kGateSplits CTAs owns 16 experts and splits D between its
// CTAs, so every SM streams a slice of gate_weight once; the cluster sums its partial logits
// through distributed shared memory in a fixed order and writes them. Lets the epilogue launch
// early (programmatic launch). Any D that is a multiple of 8.
constexpr int kGateSplits = 8;
constexpr int kClusterGateMaxRows = 16;
void launch_gate_gemm(const RouterProblem& problem, cudaStream_t stream);

// N > kClusterGateMaxRows (router_gate_split.cu): CTAs own 32 or 48 experts and one slice of D
// and write their partial logits to their own slab of logits_workspace ([slabs, N, E]); no
// cluster, no atomics. Returns the number of slabs written, which the epilogue adds in slab
// order, at most kWorkspaceMaxSlabs (router_problem.h). Any D that is a multiple of 8, any N.
int launch_gate_split(const RouterProblem& problem, int device, cudaStream_t stream);

// N <= kGemvMaxRows with E <= 4 experts per SM: the gate product on the CUDA cores, whole
// experts per CTA and no cluster (router_gate_gemv.cu); faster than the GEMM for a few rows.
constexpr int kGemvMaxRows = 4;
bool gate_gemv_applies(const RouterProblem& problem, int device);
void launch_gate_gemv(const RouterProblem& problem, int device, cudaStream_t stream);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
