// The thread-block cluster's hardware barrier in two halves (barrier.cluster, sm_90): a thread
// arrives, goes on with work that needs no peer, and waits only where it does; the wait returns
// once every thread of every CTA of the cluster has arrived, and a thread waits before it arrives
// again. The .aligned forms: every thread of the warp executes each call together.
#pragma once

namespace hdk {
namespace detail {

// Arrives without ordering this thread's memory accesses: says only that the CTA runs (a peer may
// then access its shared memory) or that it is past a point.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

// Waits, with acquire semantics, until every thread of the cluster has arrived.
__device__ __forceinline__ void cluster_wait() {
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

}  // namespace detail
}  // namespace hdk
