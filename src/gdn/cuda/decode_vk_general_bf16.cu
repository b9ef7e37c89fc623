// The general kernel for bf16 state pools.
#include "gdn/cuda/decode_vk_general_launch.cuh"

namespace hdk {
namespace gdn {
namespace detail {

template void launch_decode_vk_general<__nv_bfloat16>(const DecodeProblem& problem,
                                                      int lanes_per_row, int rows_per_thread,
                                                      int64_t tiles_per_head, cudaStream_t stream);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
