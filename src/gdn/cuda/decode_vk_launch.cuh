// Launchers of the two VK kernels; decode_vk_*.cu instantiate them once per state dtype, so
// nvcc compiles them in parallel. Only the shapes built_kernels.h lists are instantiated.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gdn/cuda/built_kernels.h"
#include "gdn/cuda/decode_kernel_vk.cuh"
#include "gdn/cuda/decode_kernel_vk_single.cuh"
#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/dispatch.h"
#include "hdk/error.h"

namespace hdk {
namespace gdn {
namespace detail {

template <typename StateT, int K, int kRows, int kLanes, int kMaxRegisters>
void launch_vk_variant(const DecodeProblem& problem, int64_t tiles_per_head, cudaStream_t stream) {
  using Shape = VKShape<StateT, K, kRows, kLanes>;
  check_row_coverage(problem, 1, Shape::kRowsPerWarp, tiles_per_head);
  const int64_t warps = problem.num_requests * problem.num_v_heads * tiles_per_head;
  const int64_t ctas = (warps + kMultiTokenWarpsPerCta - 1) / kMultiTokenWarpsPerCta;
  const dim3 grid(static_cast<unsigned>(ctas)), block(kMultiTokenWarpsPerCta * 32);
  if (problem.q.dtype == DType::kFloat32) {
    gdn_decode_vk_kernel<StateT, K, kRows, kLanes, 4, kMaxRegisters>
        <<<grid, block, 0, stream>>>(problem, tiles_per_head);
  } else {
    gdn_decode_vk_kernel<StateT, K, kRows, kLanes, 2, kMaxRegisters>
        <<<grid, block, 0, stream>>>(problem, tiles_per_head);
  }
}

[[noreturn]] inline void no_kernel_for(const char* kernel, int64_t head_k, int lanes_per_row,
                                       int rows_per_thread) {
  throw Error(std::string("hdk::gdn::decode: internal launch plan error: no ") + kernel +
              " kernel for K = " + std::to_string(head_k) + " with " +
              std::to_string(lanes_per_row) + " lanes per row and " +
              std::to_string(rows_per_thread) + " rows per thread");
}

// The multi-token kernel, at the shapes built_kernels.h lists for the state dtype and K.
template <typename StateT>
void launch_decode_vk(const DecodeProblem& problem, int lanes_per_row, int rows_per_thread,
                      int64_t tiles_per_head, cudaStream_t stream) {
  HDK_DISPATCH_HEAD_K(problem.head_k, [&] {
    auto launch = [&](auto rows, auto lanes) {
      constexpr int kRows = decltype(rows)::value, kLanes = decltype(lanes)::value;
      // A cap of 128 registers: left free, the compiler takes 146-174 for some K = 128 shapes,
      // and fewer warps fit an SM; fp32 K = 256 would spill under it. Lower caps (80, 96)
      // spill and measured slower (docs/gdn-cuda-dispatch.md).
      constexpr int kCap = sizeof(StateT) == 4 && kHeadK == 256 ? 255 : 128;
      launch_vk_variant<StateT, kHeadK, kRows, kLanes, kCap>(problem, tiles_per_head, stream);
    };
    if (!launch_built_vk_shape<sizeof(StateT), kHeadK>(lanes_per_row, rows_per_thread, launch)) {
      no_kernel_for("multi-token", kHeadK, lanes_per_row, rows_per_thread);
    }
  });
}

template <typename StateT, int K, int kRows, int kMaxRegisters>
void launch_vk_single_variant(const DecodeProblem& problem, int warps_per_cta,
                              int64_t tiles_per_head, cudaStream_t stream) {
  check_row_coverage(problem, warps_per_cta, VKShape<StateT, K, kRows>::kRowsPerWarp,
                     tiles_per_head);
  const int64_t ctas = problem.num_requests * problem.num_v_heads * tiles_per_head;
  const dim3 grid(static_cast<unsigned>(ctas)), block(warps_per_cta * 32);
  gdn_decode_vk_single_kernel<StateT, K, kRows, kMaxRegisters>
      <<<grid, block, 0, stream>>>(problem, static_cast<int>(tiles_per_head));
}

// The one-token kernel: rows per thread 4, 8 or 16 (fewer where a row has fewer lanes), each
// with its register cap (single_token_default_registers). Built for tuning sweeps only
// (kOneTokenKernelBuilt); decode_cuda refuses a plan for it otherwise.
template <typename StateT>
void launch_decode_vk_single(const DecodeProblem& problem, int warps_per_cta, int rows_per_thread,
                             int64_t tiles_per_head, cudaStream_t stream) {
  if constexpr (kOneTokenKernelBuilt) {
    HDK_DISPATCH_HEAD_K(problem.head_k, [&] {
      auto launch = [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        launch_vk_single_variant<StateT, kHeadK, kRows,
                                 single_token_default_registers<StateT, kHeadK, kRows>()>(
            problem, warps_per_cta, tiles_per_head, stream);
      };
      constexpr int kMostRows = max_single_token_rows<StateT, kHeadK>();
      if (rows_per_thread >= 16) return launch(std::integral_constant<int, kMostRows>());
      if (rows_per_thread >= 8) {
        return launch(std::integral_constant<int, (kMostRows < 8 ? kMostRows : 8)>());
      }
      return launch(std::integral_constant<int, 4>());
    });
  } else {
    (void)warps_per_cta, (void)rows_per_thread, (void)tiles_per_head, (void)stream;
    no_kernel_for("one-token", problem.head_k, 0, 0);
  }
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
