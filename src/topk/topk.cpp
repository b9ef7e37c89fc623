// Entry point of hdk::topk: validate once, then hand the problem to the backend of the device the
// tensors live on.
#include "hdk/topk.h"

#include "core/argument_checks.h"
#include "hdk/error.h"
#include "topk/cpu/topk_cpu.h"
#include "topk/topk_validation.h"

#ifdef HDK_WITH_CUDA
#include "topk/cuda/topk_cuda.h"
#endif

namespace hdk {

void topk(const TensorView& values, int64_t k, const TensorView& out_values,
          const TensorView& out_indices, const TensorView& row_lengths) {
  topk(values, k, out_values, out_indices, row_lengths, nullptr);
}

void topk(const TensorView& values, int64_t k, const TensorView& out_values,
          const TensorView& out_indices, const TensorView& row_lengths, CudaStream stream) {
  const detail::TopkProblem problem =
      detail::validate_topk(values, k, out_values, out_indices, row_lengths);
  if (values.device.is_cpu()) {
    detail::topk_cpu(problem);
    return;
  }
#ifdef HDK_WITH_CUDA
  detail::topk_cuda(problem, values.device.index, stream);
#else
  (void)stream;
  hdk::detail::throw_no_cuda_backend("hdk::topk", values.device);
#endif
}

}  // namespace hdk
