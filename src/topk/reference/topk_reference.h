// The oracle of hdk::topk: a full sort of each row, written as plainly as possible, for tests and
// `hdk-bench topk --verify`. Slow on purpose; never a user-facing backend.
#pragma once

#include <cstdint>

#include "hdk/tensor_view.h"

namespace hdk {

// Same contract as topk() for CPU tensors: validates, then sorts each row's entries (values
// compared as doubles, NaN after every number, equal values by column) and writes the first k.
// Shares no ordering code with the backends.
void topk_reference(const TensorView& values, int64_t k, const TensorView& out_values,
                    const TensorView& out_indices, const TensorView& row_lengths = TensorView());

}  // namespace hdk
