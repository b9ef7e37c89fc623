// The short kernel for bf16 state pools.
#include "gdn/cuda/decode_vk_short_launch.cuh"

namespace hdk {
namespace gdn {
namespace detail {

template void launch_decode_vk_short<__nv_bfloat16>(const DecodeProblem& problem,
                                                    const ShortLaunch& launch, cudaStream_t stream);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
