// The lean multi-token VK kernel for float state pools.
#include "gdn/cuda/decode_vk_lean_launch.cuh"

namespace hdk {
namespace gdn {
namespace detail {

template void launch_decode_vk_lean<float>(const DecodeProblem& problem, const LeanLaunch& launch,
                                           cudaStream_t stream);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
