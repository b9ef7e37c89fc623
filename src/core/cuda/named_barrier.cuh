// Barriers among some of a CTA's warps (bar.sync with an id and a thread count): a warpgroup
// that runs its own pipeline waits for its own 128 threads, not the CTA's.
#pragma once

#include <cstdint>

namespace hdk {
namespace detail {

// Id 0 is __syncthreads'; ids 1 .. 15 are free for a kernel's groups of warps.
constexpr int kFirstNamedBarrier = 1;

// Waits until `threads` (a multiple of 32) threads have reached barrier `id`, ordering their
// shared-memory accesses as __syncthreads does among them.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// named_barrier_sync that also returns whether `pred` held in any of the `threads` threads: one
// decision for a group of warps that must take the same branch (a warpgroup's wgmma
// instructions follow one sequence in all its warps).
__device__ __forceinline__ bool named_barrier_any(int id, int threads, bool pred) {
  uint32_t any;
  asm volatile(
      "{\n .reg .pred p, q;\n setp.ne.u32 p, %1, 0;\n barrier.red.or.pred q, %2, %3, p;\n"
      " selp.u32 %0, 1, 0, q;\n}\n"
      : "=r"(any)
      : "r"(pred ? 1u : 0u), "r"(id), "r"(threads)
      : "memory");
  return any != 0;
}

}  // namespace detail
}  // namespace hdk
