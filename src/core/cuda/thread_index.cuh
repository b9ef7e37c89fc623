// The thread's index read from %tid.x where it is used. A kernel under register pressure may
// keep an index computed once in local memory; its reload then waits behind every global load
// in flight (they share one dependency counter), where the special register's read does not.
#pragma once

#include <cstdint>

namespace hdk {
namespace detail {

// threadIdx.x, read again at each call (asm volatile: never hoisted or merged with another).
__device__ __forceinline__ int thread_index_now() {
  uint32_t t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return static_cast<int>(t);
}

}  // namespace detail
}  // namespace hdk
