// A [N] or [N, L] integer tensor of a validated problem (pool slots, positions, token counts,
// sequence offsets, page tables), int32 or int64. An optional tensor that was not given has
// data == nullptr. Trivially copyable, so the problems that hold it go to kernels by value.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "hdk/dtype.h"

namespace hdk {
namespace detail {

struct IndexView {
  const void* data = nullptr;
  DType dtype = DType::kInt32;
  int64_t row_stride = 0;     // elements between rows (dim 0)
  int64_t column_stride = 0;  // elements between columns (dim 1; 0 for a 1-D tensor)

  HDK_HOST_DEVICE bool given() const { return data != nullptr; }
  HDK_HOST_DEVICE int64_t at(int64_t row, int64_t column = 0) const {
    const int64_t offset = row * row_stride + column * column_stride;
    return dtype == DType::kInt64 ? static_cast<const int64_t*>(data)[offset]
                                  : static_cast<int64_t>(static_cast<const int32_t*>(data)[offset]);
  }
};

}  // namespace detail
}  // namespace hdk
