// The CUDA backend of GDN decode (compiled only with HDK_WITH_CUDA).
#pragma once

#include <cstdint>

#include "gdn/decode_problem.h"
#include "hdk/cuda_stream.h"
#include "hdk/gdn/decode.h"

namespace hdk {
namespace gdn {
namespace detail {

// Which decode kernel a launch uses.
enum class DecodeKernel {
  kVKGeneral,        // [V, K] state, any call (decode_kernel_vk_general.cuh)
  kVKShort,          // [V, K] state, up to 32 tokens per request, fewer registers
                     // (decode_kernel_vk_short.cuh)
  kVKOneTokenSweep,  // [V, K] state, one token per request, tuning sweeps only
                     // (decode_kernel_vk_one_token_sweep.cuh)
  kKV,               // [K, V] state (decode_kernel_kv.cuh)
};

// The short name hdk-bench prints: "vkg", "vks", "vk1" or "kv".
const char* decode_kernel_name(DecodeKernel kernel);

// Launch geometry the dispatcher picks, exposed for hdk-bench's tuning sweep.
struct LaunchPlan {
  DecodeKernel kernel = DecodeKernel::kVKGeneral;
  int warps_per_cta = 0;
  int rows_per_thread = 0;
  int lanes_per_row = 0;       // lanes sharing one state row (kVK kernels)
  int64_t tiles_per_head = 0;  // row tiles of one head: CTAs (vk1, kv) or warps (vkg, vks)
  int64_t ctas = 0;
  bool narrow_offsets = false;   // vks: 32-bit token offsets (token_offsets_fit_32_bits)
  bool one_token_build = false;  // vks: the build without a token loop (at most one token each)
  bool common_form = false;      // vks: parameters as CommonDecodeProblem (the call's form fits)
  bool state_first = false;      // vks: the state loaded before the token's inputs
};

// Which build of the short kernel runs a one-token call: the dispatcher's choice, the build with
// the token loop, or the one without (which exists for bf16 state, and for fp32 state in the
// common form only; elsewhere the former runs).
enum class ShortBuild { kAuto, kTokenLoop, kOneToken };

// In which order the short kernel loads a one-token call's data: the dispatcher's choice, the
// token's inputs (q, k, v, gates) before the state, or the state first (built for the common
// form's one-token build with fp32 state only; elsewhere the inputs come first whatever is
// forced).
enum class ShortLoadOrder { kAuto, kInputsFirst, kStateFirst };

// Which kernel runs a [V, K] call that the short and the general kernel can both take: the
// dispatcher's choice, or one of the two (calls of more than 32 tokens per request, or beyond
// the short kernel's grid, run the general kernel whatever is forced).
enum class VKKernel { kAuto, kGeneral, kShort };

// Tuning and test aid, affecting every later call in the process: forces the warps per CTA
// (one-token sweep kernel 1-8, short kernel 1-4), rows per thread and lanes per row of the VK
// kernels (0 = the dispatcher's choice), the one-token sweep kernel for one-token calls and the
// kernel of the other [V, K] calls (the tests run each), and 64-bit token offsets in the short
// kernel where 32 bits would do (so tests cover both of its builds), and which build of the
// short kernel runs one-token calls with bf16 state (so tests cover both), whether calls of the
// common form run on the full problem (so tests cover both), and the short kernel's load order
// (so tests cover both). A combination no kernel was built for is an error at launch.
struct LaunchOverride {
  int warps = 0;
  int rows_per_thread = 0;
  int lanes_per_row = 0;
  bool one_token_sweep = false;
  VKKernel vk_kernel = VKKernel::kAuto;
  bool wide_offsets = false;
  ShortBuild short_build = ShortBuild::kAuto;
  // The short kernel on the full DecodeProblem even where the common form fits.
  bool full_problem = false;
  ShortLoadOrder load_order = ShortLoadOrder::kAuto;
};

// What the launch plan needs to know of the device, read once per device.
struct DeviceInfo {
  int sm_count = 0;
};

// The launch of `problem` on `device` with `tuning`'s forced choices: a pure function of its
// arguments, so the tests plan any call without a GPU.
LaunchPlan plan_launch(const DecodeProblem& problem, const DeviceInfo& device,
                       const LaunchOverride& tuning);

// Whether the plan's kernel and shape are built (built_kernels.h): always for the dispatcher's
// own plans; a forced sweep shape or the one-token sweep kernel needs
// -DHDK_GDN_SWEEP_KERNELS=ON.
bool launch_plan_built(const DecodeProblem& problem, const LaunchPlan& plan);

// Checks what the CUDA kernels need beyond the shared validation (head sizes, V multiple of 8,
// 16-byte alignment), checks a host copy of the indices when `check_indices` (DecodeParams'
// option), then launches plan_launch(problem, device, tuning) on `stream` on CUDA device
// `device`. Returns the plan it launched (nothing launched for an empty call).
LaunchPlan decode_cuda(const DecodeProblem& problem, int device, bool check_indices,
                       CudaStream stream, const LaunchOverride& tuning);

// hdk::gdn::decode for CUDA tensors with tuning's forced choices (hdk-bench's sweeps, the tests
// that run each kernel): the same validation, then decode_cuda. Returns the plan launched.
LaunchPlan decode_tuned(const DecodeParams& params, CudaStream stream,
                        const LaunchOverride& tuning);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
