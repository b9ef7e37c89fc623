// Launcher of the one-token VK kernel for float state pools.
#include <string>

#include "gdn/cuda/decode_kernel_vk_single.cuh"
#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/dispatch.h"

namespace hdk {
namespace gdn {
namespace detail {

template <>
void launch_decode_vk_single<float>(const DecodeProblem& problem, int warps_per_cta,
                                    int rows_per_thread, int64_t tiles_per_head,
                                    cudaStream_t stream) {
  const int64_t ctas = problem.num_requests * problem.num_v_heads * tiles_per_head;
  const dim3 grid(static_cast<unsigned>(ctas)), block(warps_per_cta * 32);
  HDK_DISPATCH_HEAD_K(problem.head_k, [&] {
    constexpr int kMostRows = max_single_token_rows<float, kHeadK>();
    auto launch = [&](auto kernel, int rows_per_warp) {
      check_row_coverage(problem, warps_per_cta, rows_per_warp, tiles_per_head);
      kernel<<<grid, block, 0, stream>>>(problem, static_cast<int>(tiles_per_head));
    };
    if (rows_per_thread >= 16) {
      launch(gdn_decode_vk_single_kernel<float, kHeadK, kMostRows>,
             VKShape<float, kHeadK, kMostRows>::kRowsPerWarp);
    } else if (rows_per_thread >= 8) {
      constexpr int kRows = kMostRows < 8 ? kMostRows : 8;
      launch(gdn_decode_vk_single_kernel<float, kHeadK, kRows>,
             VKShape<float, kHeadK, kRows>::kRowsPerWarp);
    } else {
      launch(gdn_decode_vk_single_kernel<float, kHeadK, 4>,
             VKShape<float, kHeadK, 4>::kRowsPerWarp);
    }
  });
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
