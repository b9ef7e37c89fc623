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
  int lanes_per_row = 0;       // lanes sharing one state row (kVK kernels)
  int64_t tiles_per_head = 0;  // row tiles of one head: CTAs (vk1, kv) or warps (vk)
  int64_t ctas = 0;
};

LaunchPlan plan_launch(const DecodeProblem& problem, int sm_count);

// Which kernel serves one-token calls: the dispatcher's choice, or one of the two forced.
enum class OneTokenKernel { kAuto, kOneToken, kMultiToken };

// Tuning and test aid, affecting every later call in the process: forces the VK kernels' warps
// per CTA (one-token kernel), rows per thread and lanes per row (0 = the
// dispatcher's choice), and the kernel of one-token calls (the tests run both). A combination
// no kernel was built for is an error at launch.
struct LaunchOverride {
  int warps = 0;
  int rows_per_thread = 0;
  int lanes_per_row = 0;
  OneTokenKernel one_token_kernel = OneTokenKernel::kAuto;
};
void set_launch_override(const LaunchOverride& forced);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
