#include "topk/topk_validation.h"

#include <initializer_list>
#include <limits>
#include <string>

#include "core/argument_checks.h"
#include "hdk/topk.h"

namespace hdk {
namespace detail {

TopkProblem validate_topk(const TensorView& values, int64_t k, const TensorView& out_values,
                          const TensorView& out_indices, const TensorView& row_lengths) {
  const ArgumentChecks check("hdk::topk");
  check.require(values, "values", "(the scores, [N, L])");
  check.require(out_values, "out_values", "(the selected values, [N, k])");
  check.require(out_indices, "out_indices", "(the selected columns, [N, k])");

  const std::initializer_list<NamedView> inputs = {{&values, "values"},
                                                   {&row_lengths, "row_lengths"}};
  const std::initializer_list<NamedView> outputs = {{&out_values, "out_values"},
                                                    {&out_indices, "out_indices"}};
  check.same_device(inputs, outputs);

  check.rank_in(values, "values", {2}, "[N, L]");
  check.dtype_in(values, "values", {DType::kFloat32});
  check.innermost_contiguous(values, "values");
  const int64_t N = values.shape[0];
  const int64_t L = values.shape[1];
  if (L > std::numeric_limits<int32_t>::max()) {
    check.fail("argument 'values' has L = " + std::to_string(L) +
               " columns; out_indices are int32, so L must be at most 2147483647");
  }
  if (k < 0 || k > kMaxTopK) {
    check.fail("argument 'k' must be in 0.." + std::to_string(kMaxTopK) + ", got " +
               std::to_string(k));
  }

  check.shape_is(out_values, "out_values", {N, k}, "[N, k]");
  check.dtype_in(out_values, "out_values", {DType::kFloat32});
  check.innermost_contiguous(out_values, "out_values");
  check.shape_is(out_indices, "out_indices", {N, k}, "[N, k]");
  check.dtype_in(out_indices, "out_indices", {DType::kInt32});
  check.innermost_contiguous(out_indices, "out_indices");

  TopkProblem problem;
  problem.num_rows = N;
  problem.row_size = L;
  problem.k = k;
  problem.values = static_cast<const float*>(values.data);
  problem.values_row_stride = values.strides[0];
  problem.out_values = static_cast<float*>(out_values.data);
  problem.out_values_row_stride = out_values.strides[0];
  problem.out_indices = static_cast<int32_t*>(out_indices.data);
  problem.out_indices_row_stride = out_indices.strides[0];

  if (row_lengths.defined()) {
    check.shape_is(row_lengths, "row_lengths", {N}, "[N]");
    check.dtype_in(row_lengths, "row_lengths", {DType::kInt32, DType::kInt64});
    problem.row_lengths = row_lengths.data;
    problem.row_lengths_dtype = row_lengths.dtype;
    problem.row_lengths_stride = row_lengths.strides[0];
  }

  check.disjoint_outputs(outputs, inputs);
  return problem;
}

}  // namespace detail
}  // namespace hdk
