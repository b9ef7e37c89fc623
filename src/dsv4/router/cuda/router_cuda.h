// The CUDA backend of the DeepSeek-V4 router (compiled only with HDK_WITH_CUDA).
#pragma once

#include "dsv4/router/router_problem.h"
#include "hdk/cuda_stream.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Checks what the kernels need beyond the shared validation (16-byte alignment of the fused
// gate's rows, sizes), then enqueues on `stream`: the fused gate GEMM (when hidden + gate_weight
// are given) and the per-row epilogue. No allocation, no synchronization.
void route_cuda(const RouterProblem& problem, int device, CudaStream stream);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
