// Shared-memory barriers (mbarrier, sm_90): a 64-bit object in shared memory that completes a
// phase once a set number of arrivals has come in (and, for bulk copies, a set number of bytes
// has landed). A waiter names the parity of the phase it waits for. The copies that complete
// bytes on them are in core/cuda/async_copy.cuh.
//
// The pipelined sparse_decode kernel hands stages between its warpgroups through these rather
// than through named barriers (bar.arrive / bar.sync): arrive releases and wait acquires the
// arriving threads' shared-memory accesses, which compute-sanitizer's racecheck models for
// mbarriers but not for bar.arrive (docs/dsv4-attention.md, "The pipelined tensor-core kernel").
#pragma once

#include <cstdint>

#include "core/cuda/shared_address.cuh"

namespace hdk {
namespace detail {

// One thread initializes; a CTA barrier (__syncthreads) must follow before any thread uses it.
// The fence makes the initialized barrier visible to the async proxy (bulk copies) as well.
__device__ __forceinline__ void mbarrier_init(uint64_t* barrier, int arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(shared_address(barrier)),
               "r"(arrivals)
               : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Ends the barrier's life, so that its memory may be initialized again; no thread may be waiting
// on it or arriving on it.
__device__ __forceinline__ void mbarrier_invalidate(uint64_t* barrier) {
  asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(shared_address(barrier)) : "memory");
}

// One arrival (release: this thread's earlier memory accesses happen before the phase completes).
__device__ __forceinline__ void mbarrier_arrive(uint64_t* barrier) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(shared_address(barrier))
               : "memory");
}

// Returns once the phase of parity `parity` has completed (acquire).
__device__ __forceinline__ void mbarrier_wait(uint64_t* barrier, uint32_t parity) {
  const uint32_t address = shared_address(barrier);
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

// Whether the phase of parity `parity` has completed, without waiting (acquire when it has).
__device__ __forceinline__ bool mbarrier_test(uint64_t* barrier, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n .reg .pred p;\n mbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      " selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(shared_address(barrier)), "r"(parity)
      : "memory");
  return done != 0;
}

// ---- across the CTAs of a cluster --------------------------------------------------------------
// A CTA hands data to a peer CTA's shared memory by bulk copies that complete bytes on the peer's
// barrier (as a TMA load does), so the peer's waiters need no more than mbarrier_wait; a peer
// frees a buffer with a remote arrival.

// One arrival on the barrier at shared::cluster address `remote` (cluster_shared_address), with
// the instruction's default (CTA-scope) semantics: it says that this CTA no longer reads a
// buffer, it publishes no writes. Release and acquire at cluster scope cost an L1 invalidation
// at every wait (CCTL.IVALL) and a memory barrier at every arrival, which made the shared
// conversion slower than converting twice (docs/dsv4-attention.md).
__device__ __forceinline__ void mbarrier_arrive_remote(uint32_t remote) {
  asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];\n" ::"r"(remote) : "memory");
}

// One arrival that also expects `bytes` more transaction bytes in the current phase (the phase
// completes once they have landed too).
__device__ __forceinline__ void mbarrier_arrive_expect_bytes(uint64_t* barrier, uint32_t bytes) {
  asm volatile(
      "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(shared_address(barrier)),
      "r"(bytes)
      : "memory");
}

}  // namespace detail
}  // namespace hdk
