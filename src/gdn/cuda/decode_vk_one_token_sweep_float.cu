// The one-token sweep kernel for float state pools.
#include "gdn/cuda/decode_vk_one_token_sweep_launch.cuh"

namespace hdk {
namespace gdn {
namespace detail {

template void launch_decode_vk_one_token_sweep<float>(const DecodeProblem& problem,
                                                      int warps_per_cta, int rows_per_thread,
                                                      int64_t tiles_per_head, cudaStream_t stream);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
