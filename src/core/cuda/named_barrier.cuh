// Barriers among some of a CTA's warps (bar.sync with an id and a thread count): a warpgroup
// that runs its own pipeline waits for its own 128 threads, not the CTA's.
#pragma once

namespace hdk {
namespace detail {

// Id 0 is __syncthreads'; ids 1 .. 15 are free for a kernel's groups of warps.
constexpr int kFirstNamedBarrier = 1;

// Waits until `threads` (a multiple of 32) threads have reached barrier `id`, ordering their
// shared-memory accesses as __syncthreads does among them.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace detail
}  // namespace hdk
