// The router's CUDA kernels as seen by the dispatcher in router_cuda.cu. The gate GEMM lives in
// its own translation unit (router_gate_gemm.cu) so nvcc compiles it in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsv4/router_problem.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// logits_workspace[n, e] = hidden[n] · gate_weight[e] in fp32 (bf16 tensor-core MMA). Each
// cluster of kGateSplits CTAs owns 32 experts and splits D between its CTAs, so every SM streams
// a slice of gate_weight once; the cluster sums its partial logits through distributed shared
// memory in a fixed order (deterministic) and writes them. Rows beyond 64 run as further grid
// rows that re-read gate_weight from L2. Lets the epilogue launch early (programmatic launch).
constexpr int kGateSplits = 8;
void launch_gate_gemm(const RouterProblem& problem, int device, cudaStream_t stream);

// Largest D the gate GEMM accepts (its per-CTA hidden slice must fit in shared memory).
int64_t gate_gemm_max_hidden_size(int device);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
