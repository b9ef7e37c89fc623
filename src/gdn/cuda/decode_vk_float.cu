// Launcher of the VK kernel for float state pools.
#include <string>

#include "gdn/cuda/decode_kernel_vk.cuh"
#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/dispatch.h"

namespace hdk {
namespace gdn {
namespace detail {

template <>
void launch_decode_vk<float>(const DecodeProblem& problem, int warps_per_cta, int rows_per_thread,
                             int64_t tiles_per_head, cudaStream_t stream) {
  const int64_t ctas = problem.num_requests * problem.num_v_heads * tiles_per_head;
  const dim3 grid(static_cast<unsigned>(ctas)), block(warps_per_cta * 32);
  HDK_DISPATCH_HEAD_K(problem.head_k, [&] {
    auto launch = [&](auto kernel, int rows_per_warp) {
      check_row_coverage(problem, warps_per_cta, rows_per_warp, tiles_per_head);
      kernel<<<grid, block, 0, stream>>>(problem, static_cast<int>(tiles_per_head));
    };
    if (rows_per_thread == 2) {
      launch(gdn_decode_vk_kernel<float, kHeadK, 2>, VKShape<float, kHeadK, 2>::kRowsPerWarp);
    } else {
      launch(gdn_decode_vk_kernel<float, kHeadK, 4>, VKShape<float, kHeadK, 4>::kRowsPerWarp);
    }
  });
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
