// Shared-memory addresses as PTX takes them: 32-bit shared::cta addresses of this CTA's
// variables, and their shared::cluster counterparts in another CTA of the cluster.
#pragma once

#include <cstdint>

namespace hdk {
namespace detail {

// The 32-bit shared::cta address of a pointer into this CTA's shared memory (what cp.async,
// mbarrier, ld/st.shared and matrix descriptors take).
__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// The shared::cluster address of the variable at shared::cta address `address` in CTA `rank` of
// the cluster (the same offset in that CTA's shared memory).
__device__ __forceinline__ uint32_t cluster_shared_address(uint32_t address, int rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(address), "r"(rank));
  return remote;
}

}  // namespace detail
}  // namespace hdk
