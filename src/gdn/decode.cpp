// Entry point of hdk::gdn::decode: validate once, then hand the problem to the backend of the
// device the tensors live on.
#include "hdk/gdn/decode.h"

#include "core/argument_checks.h"
#include "gdn/cpu/decode_cpu.h"
#include "gdn/decode_validation.h"
#include "hdk/error.h"

#ifdef HDK_WITH_CUDA
#include "gdn/cuda/decode_cuda.h"
#endif

namespace hdk {
namespace gdn {

void decode(const DecodeParams& params) {
  decode(params, nullptr);
}

void decode(const DecodeParams& params, CudaStream stream) {
  const detail::DecodeProblem problem = detail::validate_decode(params);
  const Device device = params.q.device;
  if (device.is_cpu()) {
    if (params.check_indices) detail::check_index_data(problem);
    detail::decode_cpu(problem);
    return;
  }
#ifdef HDK_WITH_CUDA
  detail::decode_cuda(problem, device.index, params.check_indices, stream, {});
#else
  (void)stream;
  hdk::detail::throw_no_cuda_backend("hdk::gdn::decode", device);
#endif
}

#ifdef HDK_WITH_CUDA
namespace detail {

LaunchPlan decode_tuned(const DecodeParams& params, CudaStream stream,
                        const LaunchOverride& tuning) {
  const DecodeProblem problem = validate_decode(params);
  const Device device = params.q.device;
  if (!device.is_cuda()) {
    throw Error("hdk::gdn::decode: a launch override (tuning) applies to CUDA tensors only");
  }
  return decode_cuda(problem, device.index, params.check_indices, stream, tuning);
}

}  // namespace detail
#endif

}  // namespace gdn
}  // namespace hdk
