// Barriers among some of a CTA's warps (bar.sync with an id and a thread count): a warpgroup
// that runs its own pipeline waits for its own 128 threads, not the CTA's.
// Where some of a CTA's warps pass more of them than others, compute-sanitizer's racecheck
// reports races across every later __syncthreads (a 384-thread kernel whose first warpgroup
// alone passes one bar.sync or barrier.red is enough; with each warpgroup passing as many on its
// own id, none): warps that decide together outside such a balanced use vote through an mbarrier.
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
