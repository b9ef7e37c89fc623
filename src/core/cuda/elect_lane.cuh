// One lane of a warp chosen by the hardware (elect.sync, sm_90): a warp's single action (one
// arrival on a barrier, one copy) without a lane index in a register, which a kernel under
// register pressure may keep in local memory and reload at every use.
#pragma once

#include <cstdint>

namespace hdk {
namespace detail {

// True in exactly one lane of the calling warp; every lane must call it.
__device__ __forceinline__ bool elect_one_lane() {
  uint32_t elected;
  asm volatile("{\n .reg .pred p;\n elect.sync _|p, 0xffffffff;\n selp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(elected));
  return elected != 0;
}

}  // namespace detail
}  // namespace hdk
