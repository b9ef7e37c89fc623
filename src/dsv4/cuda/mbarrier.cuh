// Shared-memory barriers (mbarrier, sm_90) for the read and router kernels: a 64-bit object in
// shared memory that completes a phase once a set number of arrivals has come in (and, for bulk
// copies, a set number of bytes has landed). A waiter names the parity of the phase it waits for.
//
// The pipelined sparse_decode kernel hands stages between its warpgroups through these rather
// than through named barriers (bar.arrive / bar.sync): arrive releases and wait acquires the
// arriving threads' shared-memory accesses, which compute-sanitizer's racecheck models for
// mbarriers but not for bar.arrive (docs/dsv4-attention.md, "The pipelined tensor-core kernel").
#pragma once

#include <cstdint>

namespace hdk {
namespace dsv4 {
namespace detail {

// One thread initializes; a CTA barrier (__syncthreads) must follow before any thread uses it.
// The fence makes the initialized barrier visible to the async proxy (bulk copies) as well.
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(barrier))),
               "r"(arrivals)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival (release: this thread's earlier memory accesses happen before the phase completes).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(
                   static_cast<uint32_t>(__cvta_generic_to_shared(barrier)))
               : "memory");
}

// Returns once the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  const uint32_t address = static_cast<uint32_t>(__cvta_generic_to_shared(barrier));
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(address), "r"(parity)
        : "memory");
  }
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
