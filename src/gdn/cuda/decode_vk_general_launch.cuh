// Launcher of the general kernel; decode_vk_general_{bf16,float}.cu instantiate it once per state
// dtype, so nvcc compiles them in parallel. Only the shapes built_kernels.h lists are
// instantiated.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gdn/cuda/built_kernels.h"
#include "gdn/cuda/decode_kernel_vk_general.cuh"
#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/dispatch.h"

namespace hdk {
namespace gdn {
namespace detail {

template <typename StateT, int K, int kRows, int kLanes, int kMaxRegisters>
void launch_vk_general_shape(const DecodeProblem& problem, int64_t tiles_per_head,
                             cudaStream_t stream) {
  using Shape = VKShape<StateT, K, kRows, kLanes>;
  check_row_coverage(problem, 1, Shape::kRowsPerWarp, tiles_per_head);
  const int64_t warps = problem.num_requests * problem.num_v_heads * tiles_per_head;
  const int64_t ctas = (warps + kVKWarpsPerCta - 1) / kVKWarpsPerCta;
  const dim3 grid(static_cast<unsigned>(ctas)), block(kVKWarpsPerCta * 32);
  if (problem.q.dtype == DType::kFloat32) {
    gdn_decode_vk_general_kernel<StateT, K, kRows, kLanes, 4, kMaxRegisters>
        <<<grid, block, 0, stream>>>(problem, tiles_per_head);
  } else {
    gdn_decode_vk_general_kernel<StateT, K, kRows, kLanes, 2, kMaxRegisters>
        <<<grid, block, 0, stream>>>(problem, tiles_per_head);
  }
}

// The general kernel, at the shapes built_kernels.h lists for the state dtype and K.
template <typename StateT>
void launch_decode_vk_general(const DecodeProblem& problem, int lanes_per_row, int rows_per_thread,
                              int64_t tiles_per_head, cudaStream_t stream) {
  HDK_DISPATCH_HEAD_K(problem.head_k, [&] {
    auto launch = [&](auto rows, auto lanes) {
      constexpr int kRows = decltype(rows)::value, kLanes = decltype(lanes)::value;
      // A cap of 128 registers: left free, the compiler takes 146-174 for some K = 128 shapes,
      // and fewer warps fit an SM; fp32 K = 256 would spill under it. Lower caps (80, 96)
      // spill and measured slower (docs/gdn-cuda-dispatch.md).
      constexpr int kCap = sizeof(StateT) == 4 && kHeadK == 256 ? 255 : 128;
      launch_vk_general_shape<StateT, kHeadK, kRows, kLanes, kCap>(problem, tiles_per_head, stream);
    };
    if (!launch_built_vk_shape<sizeof(StateT), kHeadK>(lanes_per_row, rows_per_thread, launch)) {
      no_kernel_for("general", kHeadK, lanes_per_row, rows_per_thread);
    }
  });
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
