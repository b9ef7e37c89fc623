// Launcher of the one-token sweep kernel; decode_vk_one_token_sweep_{bf16,float}.cu instantiate
// it once per state dtype.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gdn/cuda/built_kernels.h"
#include "gdn/cuda/decode_kernel_vk_one_token_sweep.cuh"
#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/dispatch.h"

namespace hdk {
namespace gdn {
namespace detail {

template <typename StateT, int K, int kRows, int kMaxRegisters>
void launch_vk_one_token_sweep_shape(const DecodeProblem& problem, int warps_per_cta,
                                     int64_t tiles_per_head, cudaStream_t stream) {
  check_row_coverage(problem, warps_per_cta, VKShape<StateT, K, kRows>::kRowsPerWarp,
                     tiles_per_head);
  const int64_t ctas = problem.num_requests * problem.num_v_heads * tiles_per_head;
  const dim3 grid(static_cast<unsigned>(ctas)), block(warps_per_cta * 32);
  gdn_decode_vk_one_token_sweep_kernel<StateT, K, kRows, kMaxRegisters>
      <<<grid, block, 0, stream>>>(problem, static_cast<int>(tiles_per_head));
}

// The one-token sweep kernel: rows per thread 4, 8 or 16 (fewer where a row has fewer lanes), each
// with its register cap (one_token_sweep_registers). Built for tuning sweeps only
// (kOneTokenSweepKernelBuilt); decode_cuda refuses a plan for it otherwise.
template <typename StateT>
void launch_decode_vk_one_token_sweep(const DecodeProblem& problem, int warps_per_cta,
                                      int rows_per_thread, int64_t tiles_per_head,
                                      cudaStream_t stream) {
  if constexpr (kOneTokenSweepKernelBuilt) {
    HDK_DISPATCH_HEAD_K(problem.head_k, [&] {
      auto launch = [&](auto rows) {
        constexpr int kRows = decltype(rows)::value;
        launch_vk_one_token_sweep_shape<StateT, kHeadK, kRows,
                                        one_token_sweep_registers<StateT, kHeadK, kRows>()>(
            problem, warps_per_cta, tiles_per_head, stream);
      };
      constexpr int kMostRows = max_one_token_sweep_rows<StateT, kHeadK>();
      if (rows_per_thread >= 16) return launch(std::integral_constant<int, kMostRows>());
      if (rows_per_thread >= 8) {
        return launch(std::integral_constant<int, (kMostRows < 8 ? kMostRows : 8)>());
      }
      return launch(std::integral_constant<int, 4>());
    });
  } else {
    (void)warps_per_cta, (void)rows_per_thread, (void)tiles_per_head, (void)stream;
    no_kernel_for("one-token sweep", problem.head_k, 0, 0);
  }
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
