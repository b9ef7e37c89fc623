// Entry point of hdk::dsv4::route: validate once, then hand the problem to the backend of the
// device the tensors live on.
#include "hdk/dsv4/router.h"

#include "core/argument_checks.h"
#include "dsv4/router/cpu/router_cpu.h"
#include "dsv4/router/router_validation.h"
#include "hdk/error.h"

#ifdef HDK_WITH_CUDA
#include "dsv4/router/cuda/router_cuda.h"
#endif

namespace hdk {
namespace dsv4 {

void route(const RouterParams& params) {
  route(params, nullptr);
}

void route(const RouterParams& params, CudaStream stream) {
  const detail::RouterProblem problem = detail::validate_route(params);
  const Device device = params.topk_ids.device;
  if (device.is_cpu()) {
    detail::check_hash_indices(problem);
    detail::route_cpu(problem);
    return;
  }
#ifdef HDK_WITH_CUDA
  detail::route_cuda(problem, device.index, stream);
#else
  (void)stream;
  hdk::detail::throw_no_cuda_backend("hdk::dsv4::route", device);
#endif
}

}  // namespace dsv4
}  // namespace hdk
