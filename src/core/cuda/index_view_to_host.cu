#include "core/cuda/index_view_to_host.h"

#include <cuda_runtime.h>

#include "core/cuda_helpers.h"

namespace hdk {
namespace detail {

IndexView copy_indices_to_host(const IndexView& index, int64_t rows, int64_t columns,
                               std::vector<uint8_t>& storage, int device, CudaStream stream,
                               const char* operation) {
  IndexView host = index;
  if (rows == 0 || columns == 0) return host;
  // The elements' reach on either side of `data`: strides may be negative.
  int64_t low = 0, high = 0;
  for (const int64_t reach : {(rows - 1) * index.row_stride, (columns - 1) * index.column_stride}) {
    (reach < 0 ? low : high) += reach;
  }
  const int64_t element = index.dtype == DType::kInt64 ? 8 : 4;
  const auto* first = static_cast<const uint8_t*>(index.data) + low * element;
  storage.resize(static_cast<size_t>((high - low + 1) * element));
  CudaDeviceGuard guard(device, operation);
  check_cuda(cudaMemcpyAsync(storage.data(), first, storage.size(), cudaMemcpyDeviceToHost,
                             static_cast<cudaStream_t>(stream)),
             operation, "cudaMemcpyAsync of the indices");
  check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), operation,
             "cudaStreamSynchronize");
  host.data = storage.data() - low * element;
  return host;
}

}  // namespace detail
}  // namespace hdk
