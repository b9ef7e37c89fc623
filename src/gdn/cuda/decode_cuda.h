// The CUDA backend of GDN decode (compiled only with HDK_WITH_CUDA).
#pragma once

#include <cstdint>

#include "gdn/decode_problem.h"
#include "hdk/cuda_stream.h"
#include "hdk/gdn/decode.h"

namespace hdk {
namespace gdn {
namespace detail {

// Checks what the CUDA kernels need beyond the shared validation (head sizes, V multiple of 8,
// 16-byte alignment), honours params.check_indices, then launches on `stream`.
void decode_cuda(const DecodeProblem& problem, const DecodeParams& params, CudaStream stream);

// Which decode kernel a launch uses.
enum class DecodeKernel {
  kVK,        // [V, K] state, any number of tokens per request (decode_kernel_vk.cuh)
  kVKSingle,  // [V, K] state, one token per request (decode_kernel_vk_single.cuh)
  kKV,        // [K, V] state (decode_kernel_kv.cuh)
};

// The short name hdk-bench prints: "vk", "vk1" or "kv".
const char* decode_kernel_name(DecodeKernel kernel);

// Launch geometry the dispatcher picks, exposed for hdk-bench's tuning sweep.
struct LaunchPlan {
  DecodeKernel kernel = DecodeKernel::kVK;
  int warps_per_cta = 0;
  int rows_per_thread = 0;
  int64_t tiles_per_head = 0;
  int64_t ctas = 0;
};

LaunchPlan plan_launch(const DecodeProblem& problem, int sm_count);

// Forces the VK kernel's warps per CTA and rows per thread (0 = the dispatcher's choice). A
// tuning aid for hdk-bench's sweeps; it affects every later call in the process.
void set_launch_override(int warps, int rows_per_thread);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
