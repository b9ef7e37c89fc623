// Asynchronous copies into shared memory (sm_80 cp.async, sm_90 cp.async.bulk): the copy runs
// while the thread goes on, and lands once a commit-group wait or a barrier
// (core/cuda/mbarrier.cuh) says so.
#pragma once

#include <cstdint>

#include "core/cuda/shared_address.cuh"

namespace hdk {
namespace detail {

// ---- cp.async: per-thread copies of 16, 8 or 4 bytes, global -> shared -------------------------

// 16 bytes (both addresses 16-byte aligned) to shared::cta address `target`, bypassing L1.
__device__ __forceinline__ void cp_async_16(uint32_t target, const void* source) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(target), "l"(source) : "memory");
}

__device__ __forceinline__ void cp_async_16(void* target, const void* source) {
  cp_async_16(shared_address(target), source);
}

// 8 bytes (both addresses 8-byte aligned); cp.async copies 8 bytes only through L1 (.ca).
__device__ __forceinline__ void cp_async_8(void* target, const void* source) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(shared_address(target)),
               "l"(source)
               : "memory");
}

// 4 bytes (both addresses 4-byte aligned), through L1 like every cp.async below 16 bytes.
__device__ __forceinline__ void cp_async_4(void* target, const void* source) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(shared_address(target)),
               "l"(source)
               : "memory");
}

// Closes this thread's group of cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most `kPending` of this thread's cp.async groups are still in flight.
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// This thread's arrival on `barrier` happens once every cp.async it has issued so far has landed
// (the barrier counts one arrival per thread; .noinc: the arrival is one of those it expects).
__device__ __forceinline__ void cp_async_arrive(uint64_t* barrier) {
  asm volatile(
      "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(shared_address(barrier))
      : "memory");
}

// ---- cp.async.bulk: one thread copies many bytes, completing them on a barrier --------------

// Orders this thread's earlier shared-memory accesses through the generic proxy (ld/st.shared,
// cp.async) before later ones through the async proxy (bulk copies, wgmma operand reads); a
// barrier after it covers the other threads.
__device__ __forceinline__ void fence_shared_for_async_proxy() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) from global memory to
// shared::cta address `target`, completing as many transaction bytes on the barrier at
// shared::cta address `barrier` (which must expect them: mbarrier_arrive_expect_bytes).
__device__ __forceinline__ void bulk_copy_from_global(uint32_t target, const void* source,
                                                      uint32_t bytes, uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::
          "r"(target),
      "l"(source), "r"(bytes), "r"(barrier)
      : "memory");
}

// Copies `bytes` (a multiple of 16, both addresses 16-byte aligned) of this CTA's shared memory
// at `source` to shared::cluster address `target` in another CTA of the cluster, completing as
// many transaction bytes on that CTA's barrier at shared::cluster address `barrier`. The writes
// that produced the source must be fenced for the async proxy (fence.proxy.async) first.
__device__ __forceinline__ void bulk_copy_to_peer(uint32_t target, uint32_t source, uint32_t bytes,
                                                  uint32_t barrier) {
  asm volatile(
      "cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, "
      "[%3];\n" ::"r"(target),
      "r"(source), "r"(bytes), "r"(barrier)
      : "memory");
}

}  // namespace detail
}  // namespace hdk
