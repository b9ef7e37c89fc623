#include "topk/reference/topk_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "hdk/error.h"
#include "topk/topk_validation.h"

namespace hdk {

void topk_reference(const TensorView& values, int64_t k, const TensorView& out_values,
                    const TensorView& out_indices, const TensorView& row_lengths) {
  detail::validate_topk(values, k, out_values, out_indices, row_lengths);
  if (!values.device.is_cpu()) throw Error("hdk::topk_reference: tensors must be on the CPU");
  const int64_t N = values.shape[0];
  const int64_t L = values.shape[1];
  std::vector<int64_t> order;
  for (int64_t n = 0; n < N; ++n) {
    int64_t length = L;
    if (row_lengths.defined()) {
      const int64_t offset = n * row_lengths.strides[0];
      length = row_lengths.dtype == DType::kInt64
                   ? static_cast<const int64_t*>(row_lengths.data)[offset]
                   : static_cast<const int32_t*>(row_lengths.data)[offset];
      length = std::min(std::max<int64_t>(length, 0), L);
    }
    const float* row = static_cast<const float*>(values.data) + n * values.strides[0];
    auto value = [&](int64_t column) { return static_cast<double>(row[column]); };
    order.resize(static_cast<size_t>(length));
    std::iota(order.begin(), order.end(), int64_t{0});
    std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      const double va = value(a), vb = value(b);
      const bool nan_a = std::isnan(va), nan_b = std::isnan(vb);
      if (nan_a != nan_b) return nan_b;  // numbers before NaN
      if (!nan_a && va != vb) return va > vb;
      return a < b;
    });
    float* values_out = static_cast<float*>(out_values.data) + n * out_values.strides[0];
    int32_t* indices_out = static_cast<int32_t*>(out_indices.data) + n * out_indices.strides[0];
    for (int64_t j = 0; j < k; ++j) {
      if (j < length) {
        values_out[j] = row[order[j]];
        indices_out[j] = static_cast<int32_t>(order[j]);
      } else {
        values_out[j] = -std::numeric_limits<float>::infinity();
        indices_out[j] = -1;
      }
    }
  }
}

}  // namespace hdk
