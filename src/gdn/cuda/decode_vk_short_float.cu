// The short kernel for float state pools.
#include "gdn/cuda/decode_vk_short_launch.cuh"

namespace hdk {
namespace gdn {
namespace detail {

template void launch_decode_vk_short<float>(const DecodeProblem& problem, const ShortLaunch& launch,
                                            cudaStream_t stream);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
