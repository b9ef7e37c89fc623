// The device side of the optional invalid_count of the DeepSeek-V4 operations: an int32 or int64
// counter that kernels add to atomically (the host backends use add_to_counter).
#pragma once

#include <cstdint>

#include "dsv4/kv_cache/kv_cache_problem.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {

__device__ __forceinline__ void count_invalid(const Counter& counter, int64_t count = 1) {
  if (counter.data == nullptr || count == 0) return;
  if (counter.dtype == DType::kInt64) {
    atomicAdd(static_cast<unsigned long long*>(counter.data),
              static_cast<unsigned long long>(count));
  } else {
    atomicAdd(static_cast<int*>(counter.data), static_cast<int>(count));
  }
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
