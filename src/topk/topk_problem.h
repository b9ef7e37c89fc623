// A validated hdk::topk call, reduced to sizes, pointers and element strides. validate_topk()
// builds it; the CPU and CUDA backends read nothing else. Trivially copyable, so a CUDA kernel
// can take it by value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/host_device.h"
#include "hdk/dtype.h"

namespace hdk {
namespace detail {

struct TopkProblem {
  int64_t num_rows = 0;  // N
  int64_t row_size = 0;  // L
  int64_t k = 0;

  const float* values = nullptr;
  int64_t values_row_stride = 0;

  const void* row_lengths = nullptr;  // nullptr: every row has L entries
  DType row_lengths_dtype = DType::kInt32;
  int64_t row_lengths_stride = 0;

  float* out_values = nullptr;
  int64_t out_values_row_stride = 0;
  int32_t* out_indices = nullptr;
  int64_t out_indices_row_stride = 0;

  // Entries of row n that take part: row_lengths[n] clamped to [0, L].
  HDK_HOST_DEVICE int64_t length_of(int64_t row) const {
    if (row_lengths == nullptr) return row_size;
    const int64_t offset = row * row_lengths_stride;
    const int64_t length =
        row_lengths_dtype == DType::kInt64
            ? static_cast<const int64_t*>(row_lengths)[offset]
            : static_cast<int64_t>(static_cast<const int32_t*>(row_lengths)[offset]);
    return length < 0 ? 0 : (length > row_size ? row_size : length);
  }
};

static_assert(std::is_trivially_copyable<TopkProblem>::value, "kernels take the problem by value");

}  // namespace detail
}  // namespace hdk
