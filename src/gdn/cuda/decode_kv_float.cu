// Launcher of the KV kernel for float state pools.
#include <string>

#include "gdn/cuda/decode_kernel_kv.cuh"
#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/dispatch.h"

namespace hdk {
namespace gdn {
namespace detail {

template <>
void launch_decode_kv<float>(const DecodeProblem& problem, int64_t tiles_per_head,
                             cudaStream_t stream) {
  const int64_t ctas = problem.num_requests * problem.num_v_heads * tiles_per_head;
  HDK_DISPATCH_HEAD_K(problem.head_k, [&] {
    gdn_decode_kv_kernel<float, kHeadK><<<static_cast<unsigned>(ctas), kHeadK, 0, stream>>>(
        problem, static_cast<int>(tiles_per_head));
  });
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
