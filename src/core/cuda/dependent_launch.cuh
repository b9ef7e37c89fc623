// The device side of programmatic dependent launch (Hopper; launch_dependent in
// core/cuda_helpers.h): a kernel launched as a dependent waits here until the kernel before it has
// finished and its memory operations are visible. Without such a launch the wait returns at once.
#pragma once

namespace hdk {
namespace detail {

__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

}  // namespace detail
}  // namespace hdk
