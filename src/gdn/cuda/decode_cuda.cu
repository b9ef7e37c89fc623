// CUDA entry of GDN decode: backend capability checks, the optional host-side index check, the
// launch plan, and the launch. Kernels: decode_kernel_vk_short.cuh, decode_kernel_vk_general.cuh,
// decode_kernel_vk_one_token_sweep.cuh, decode_kernel_kv.cuh; the choices and the measurements
// behind them: docs/gdn-cuda-dispatch.md.
#include "gdn/cuda/decode_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "core/argument_checks.h"
#include "core/ceil_div.h"
#include "core/cuda/index_view_to_host.h"
#include "core/cuda_helpers.h"
#include "gdn/common_decode_problem.h"
#include "gdn/cuda/built_kernels.h"
#include "gdn/cuda/decode_launch.h"
#include "gdn/decode_validation.h"
#include "gdn/short_kernel_fit.h"
#include "hdk/error.h"

namespace hdk {
namespace gdn {
namespace detail {
namespace {

using hdk::detail::ArgumentChecks;
using hdk::detail::ceil_div;

constexpr const char* kOperation = "hdk::gdn::decode";

int multiprocessor_count(int device) {
  return hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
}

void check_capabilities(const DecodeProblem& p) {
  const ArgumentChecks check(kOperation);
  if (p.head_k != 64 && p.head_k != 128 && p.head_k != 256) {
    check.fail("the CUDA backend supports K = 64, 128 or 256 (dim 3 of 'q'), got " +
               std::to_string(p.head_k) + "; CPU tensors accept any K");
  }
  if (p.head_v % 8 != 0) {
    check.fail("the CUDA backend needs V (dim 3 of 'v') to be a multiple of 8, got " +
               std::to_string(p.head_v));
  }
  const auto element = static_cast<int64_t>(dtype_size(p.state_dtype));
  auto aligned = [](const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; };
  if (!aligned(p.state) || (p.slot_pitch * element) % 16 != 0) {
    check.fail(
        "argument 'state' must be 16-byte aligned with a slot pitch that is a multiple of "
        "16 bytes for the CUDA backend (pointer " +
        std::to_string(reinterpret_cast<uintptr_t>(p.state)) + ", pitch " +
        std::to_string(p.slot_pitch * element) + " bytes)");
  }
  if (p.intermediate_states != nullptr &&
      (!aligned(p.intermediate_states) || (p.intermediate_stride_request * element) % 16 != 0 ||
       (p.intermediate_stride_token * element) % 16 != 0)) {
    check.fail(
        "argument 'intermediate_states' must be 16-byte aligned with strides that are "
        "multiples of 16 bytes for the CUDA backend, got pointer " +
        std::to_string(reinterpret_cast<uintptr_t>(p.intermediate_states)) +
        " and strides of dims 0 and 1 of " + std::to_string(p.intermediate_stride_request) +
        " and " + std::to_string(p.intermediate_stride_token) + " elements");
  }
}

// check_indices: the index tensors copied to the host (synchronizing `stream`), then checked.
void check_indices_on_host(const DecodeProblem& problem, int device, CudaStream stream) {
  constexpr const char* kCopy = "hdk::gdn::decode (check_indices)";
  DecodeProblem host = problem;
  std::vector<uint8_t> indices, outputs, accepted, offsets;
  const int64_t B = problem.num_requests;
  const int64_t columns = problem.index_mode == IndexMode::kPerToken ? problem.index_columns : 1;
  auto stage = [&](IndexView& view, int64_t rows, int64_t view_columns,
                   std::vector<uint8_t>& storage) {
    if (view.given()) {
      view = hdk::detail::copy_indices_to_host(view, rows, view_columns, storage, device, stream,
                                               kCopy);
    }
  };
  stage(host.state_indices, B, columns, indices);
  stage(host.output_state_indices, B, 1, outputs);
  stage(host.num_accepted_tokens, B, 1, accepted);
  stage(host.cu_seqlens, B + 1, 1, offsets);
  check_index_data(host);
}

}  // namespace

void check_row_coverage(const DecodeProblem& problem, int warps_per_cta, int rows_per_warp,
                        int64_t tiles_per_head) {
  if (int64_t{warps_per_cta} * rows_per_warp * tiles_per_head >= problem.head_v) return;
  throw Error("hdk::gdn::decode: internal launch plan error: " + std::to_string(tiles_per_head) +
              " tiles of " + std::to_string(warps_per_cta) + " x " + std::to_string(rows_per_warp) +
              " rows do not cover V = " + std::to_string(problem.head_v));
}

int kv_columns_per_cta(DType state_dtype) {
  return 8 * (state_dtype == DType::kFloat32 ? 4 : 8);
}

const char* decode_kernel_name(DecodeKernel kernel) {
  switch (kernel) {
    case DecodeKernel::kVKOneTokenSweep:
      return "vk1";
    case DecodeKernel::kKV:
      return "kv";
    case DecodeKernel::kVKShort:
      return "vks";
    case DecodeKernel::kVKGeneral:
      break;
  }
  return "vkg";
}

LaunchPlan plan_launch(const DecodeProblem& p, const DeviceInfo& device,
                       const LaunchOverride& tuning) {
  // Every choice below is a row of the dispatch table in docs/gdn-cuda-dispatch.md, with the
  // measurements behind it; the SM count sizes the waves of the one rule that depends on them
  // (the fp32 one-token load order). Forced choices (tuning) override each.
  LaunchPlan plan;
  const int64_t heads = p.num_requests * p.num_v_heads;
  if (p.layout == StateLayout::kKV) {
    plan.kernel = DecodeKernel::kKV;
    plan.warps_per_cta = static_cast<int>(p.head_k / 32);
    plan.rows_per_thread = 8;
    plan.tiles_per_head = ceil_div(p.head_v, kv_columns_per_cta(p.state_dtype));
    plan.ctas = heads * plan.tiles_per_head;
    return plan;
  }
  // One token per request: the short kernel's builds serve every such call (the one-token
  // sweep kernel was slower at every batch), as 1-warp CTAs above kShortOneTokenMaxHeads,
  // where a CTA's granule no longer matters and finer CTAs fill the SMs' warp slots better.
  const bool one_token = p.token_capacity == 1 || p.tokens_per_request == 1;
  const bool one_token_sweep = one_token && tuning.one_token_sweep;
  const int state_bytes = static_cast<int>(dtype_size(p.state_dtype));
  const int full_lanes = full_lanes_per_row(state_bytes, p.head_k);
  const int forced_rows = tuning.rows_per_thread;
  const int forced_lanes = tuning.lanes_per_row;
  if (!one_token_sweep) {
    // The short and general kernels: independent warps. The short one (fewer live values)
    // serves every call but fp32 verify with a cache of more than two tokens above
    // kShortFp32VerifyMaxHeads, where the general kernel's extra registers pay for the cache
    // writes. The short kernel holds one token per lane: longer requests run the general one,
    // and so do calls whose grid would exceed its (tile, head, request) limits.
    const VKKernel forced_kernel = tuning.vk_kernel;
    const int64_t most_tokens = most_tokens_per_request(p);
    const bool verify_cache = p.intermediate_states != nullptr;
    const bool short_by_default = one_token || p.state_dtype == DType::kBFloat16 ||
                                  most_tokens <= 2 || !verify_cache ||
                                  heads <= kShortFp32VerifyMaxHeads;
    const bool short_kernel =
        forced_kernel == VKKernel::kShort || (forced_kernel == VKKernel::kAuto && short_by_default);
    plan.lanes_per_row = forced_lanes > 0 ? forced_lanes : full_lanes;
    plan.rows_per_thread = forced_rows > 0 ? forced_rows : vk_default_rows(state_bytes, p.head_k);
    const int rows_per_warp = vk_rows_per_warp(plan.lanes_per_row, plan.rows_per_thread);
    plan.tiles_per_head = ceil_div(p.head_v, rows_per_warp);
    plan.kernel = DecodeKernel::kVKGeneral;
    plan.warps_per_cta = kVKWarpsPerCta;
    const bool short_grid_fits = p.num_requests <= kMaxGridYZ && p.num_v_heads <= kMaxGridYZ &&
                                 plan.tiles_per_head <= kMaxGridX;
    if (short_kernel && most_tokens <= kShortMaxTokens && short_grid_fits) {
      plan.kernel = DecodeKernel::kVKShort;
      plan.narrow_offsets = !tuning.wide_offsets && token_offsets_fit_32_bits(p);
      // Calls of the common form (fixed length, or SGLang's one-token decode step with
      // cu_seqlens) take the compact parameter block where an instance for it is built: each
      // distinct parameter line a cold warp reads is a dependent memory round trip. Its
      // instances also take a head's rows as whole warp tiles, without a bounds check per row
      // (one address register and immediate offsets, which let the fp32 one-token build fit 64
      // registers).
      const bool bf16_input = p.q.dtype == DType::kBFloat16;
      plan.common_form = !tuning.full_problem && plan.narrow_offsets &&
                         common_form_built(state_bytes, p.head_k, plan.lanes_per_row,
                                           plan.rows_per_thread, bf16_input) &&
                         p.head_v % rows_per_warp == 0 &&
                         common_form_fits(p, short_input_piece_bytes(state_bytes, 2));
      // The build without a token loop (one-token calls) needs fewer registers, so more warps
      // hide the state's latency: on the common form at every size; on the full parameter
      // block (bf16 state only) above kShortTokenLoopBuildMaxHeads, below which its longer
      // prologue is not hidden.
      const ShortBuild forced_build = tuning.short_build;
      const bool bf16_state = p.state_dtype == DType::kBFloat16;
      const bool one_token_build_exists = one_token && (bf16_state || plan.common_form);
      const bool one_token_build_pays = plan.common_form || heads > kShortTokenLoopBuildMaxHeads;
      plan.one_token_build =
          one_token_build_exists && (forced_build == ShortBuild::kOneToken ||
                                     (forced_build == ShortBuild::kAuto && one_token_build_pays));
      // The state before the token's inputs, with fp32 state on the common form's one-token
      // build, unless the grid fills more than half of the warp slots without exceeding them
      // (short_fp32_state_first_pays): then every warp issues its loads together and the
      // inputs' loads would wait behind all of the state's.
      const ShortLoadOrder forced_order = tuning.load_order;
      const int64_t grid_warps = heads * plan.tiles_per_head;
      plan.state_first = plan.common_form &&
                         short_state_first_built(state_bytes, plan.one_token_build) &&
                         (forced_order == ShortLoadOrder::kStateFirst ||
                          (forced_order == ShortLoadOrder::kAuto &&
                           short_fp32_state_first_pays(grid_warps, device.sm_count)));
      if (one_token && heads > kShortOneTokenMaxHeads) plan.warps_per_cta = 1;
      const int forced_warps = tuning.warps;
      if (forced_warps >= 1 && forced_warps <= kVKWarpsPerCta) {
        plan.warps_per_cta = forced_warps;
      }
      plan.ctas = heads * ceil_div(plan.tiles_per_head, plan.warps_per_cta);
      return plan;
    }
    plan.ctas = ceil_div(heads * plan.tiles_per_head, plan.warps_per_cta);
    return plan;
  }
  // One-token sweep kernel, 2 warps per CTA, capped at 64 registers (32 warps per SM): fp32 state
  // 8 rows per thread, which fit the cap except at K = 256; bf16 4 rows, which fit it, where 8
  // would need 124 (H100, B = 256: bf16 R=4 82.5% of copy vs R=8 74.0%; fp32 R=8 96.2%).
  plan.kernel = DecodeKernel::kVKOneTokenSweep;
  plan.lanes_per_row = full_lanes;
  const bool eight_fit = p.state_dtype == DType::kFloat32 && p.head_k <= 128;
  plan.rows_per_thread = eight_fit ? 8 : 4;
  plan.warps_per_cta = 2;
  const bool eight_possible = !(p.state_dtype == DType::kBFloat16 && p.head_k == 64);
  if (forced_rows == 4 || (forced_rows >= 8 && eight_possible)) {
    plan.rows_per_thread = forced_rows;
  }
  if (const int forced = tuning.warps; forced >= 1 && forced <= 8) {
    plan.warps_per_cta = forced;
  }
  const int rows_per_warp = vk_rows_per_warp(plan.lanes_per_row, plan.rows_per_thread);
  plan.tiles_per_head = ceil_div(p.head_v, int64_t{plan.warps_per_cta} * rows_per_warp);
  plan.ctas = heads * plan.tiles_per_head;
  return plan;
}

bool launch_plan_built(const DecodeProblem& problem, const LaunchPlan& plan) {
  switch (plan.kernel) {
    case DecodeKernel::kKV:
      return true;
    case DecodeKernel::kVKOneTokenSweep:
      return kOneTokenSweepKernelBuilt;
    case DecodeKernel::kVKGeneral:
    case DecodeKernel::kVKShort:
      break;
  }
  const VKShapeEntry* entry =
      find_vk_shape(static_cast<int>(dtype_size(problem.state_dtype)), problem.head_k,
                    plan.lanes_per_row, plan.rows_per_thread);
  return entry != nullptr && vk_shape_entry_built(*entry);
}

LaunchPlan decode_cuda(const DecodeProblem& problem, int device, bool check_indices,
                       CudaStream stream, const LaunchOverride& tuning) {
  check_capabilities(problem);
  const hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  if (check_indices) check_indices_on_host(problem, device, stream);
  const bool no_tokens = !problem.variable_length && problem.tokens_per_request == 0;
  if (problem.num_requests == 0 || no_tokens) return LaunchPlan();

  const LaunchPlan plan = plan_launch(problem, DeviceInfo{multiprocessor_count(device)}, tuning);
  if (!launch_plan_built(problem, plan)) {
    throw Error(std::string("hdk::gdn::decode: the forced launch (") +
                decode_kernel_name(plan.kernel) + " kernel, " + std::to_string(plan.lanes_per_row) +
                " lanes per row, " + std::to_string(plan.rows_per_thread) +
                " rows per thread) has no kernel in this build: tuning-sweep kernels are built "
                "with -DHDK_GDN_SWEEP_KERNELS=ON");
  }
  if (plan.kernel != DecodeKernel::kVKShort && plan.ctas > kMaxGridX) {
    throw Error("hdk::gdn::decode: " + std::to_string(plan.ctas) +
                " CTAs exceed the CUDA grid limit; split the batch");
  }
  const bool fp32 = problem.state_dtype == DType::kFloat32;
  if (plan.kernel == DecodeKernel::kVKOneTokenSweep) {
    if (fp32) {
      launch_decode_vk_one_token_sweep<float>(problem, plan.warps_per_cta, plan.rows_per_thread,
                                              plan.tiles_per_head, cuda_stream);
    } else {
      launch_decode_vk_one_token_sweep<__nv_bfloat16>(
          problem, plan.warps_per_cta, plan.rows_per_thread, plan.tiles_per_head, cuda_stream);
    }
  } else if (plan.kernel == DecodeKernel::kVKShort) {
    ShortLaunch launch;
    launch.warps_per_cta = plan.warps_per_cta;
    launch.lanes_per_row = plan.lanes_per_row;
    launch.rows_per_thread = plan.rows_per_thread;
    launch.tiles_per_head = plan.tiles_per_head;
    launch.narrow_offsets = plan.narrow_offsets;
    launch.one_token = plan.one_token_build;
    launch.common_form = plan.common_form;
    launch.state_first = plan.state_first;
    if (fp32) {
      launch_decode_vk_short<float>(problem, launch, cuda_stream);
    } else {
      launch_decode_vk_short<__nv_bfloat16>(problem, launch, cuda_stream);
    }
  } else if (plan.kernel == DecodeKernel::kVKGeneral) {
    if (fp32) {
      launch_decode_vk_general<float>(problem, plan.lanes_per_row, plan.rows_per_thread,
                                      plan.tiles_per_head, cuda_stream);
    } else {
      launch_decode_vk_general<__nv_bfloat16>(problem, plan.lanes_per_row, plan.rows_per_thread,
                                              plan.tiles_per_head, cuda_stream);
    }
  } else if (fp32) {
    launch_decode_kv<float>(problem, plan.tiles_per_head, cuda_stream);
  } else {
    launch_decode_kv<__nv_bfloat16>(problem, plan.tiles_per_head, cuda_stream);
  }
  hdk::detail::check_cuda(cudaGetLastError(), kOperation, "launching the decode kernel");
  return plan;
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
