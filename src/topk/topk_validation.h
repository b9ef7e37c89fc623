// The one place that checks an hdk::topk call; every backend (and the reference) calls it.
#pragma once

#include <cstdint>

#include "hdk/tensor_view.h"
#include "topk/topk_problem.h"

namespace hdk {
namespace detail {

// Checks ranks, shapes, dtypes, strides, devices, k and aliasing; throws hdk::Error naming the
// argument, the expectation and what was given. Reads no tensor data.
TopkProblem validate_topk(const TensorView& values, int64_t k, const TensorView& out_values,
                          const TensorView& out_indices, const TensorView& row_lengths);

}  // namespace detail
}  // namespace hdk
