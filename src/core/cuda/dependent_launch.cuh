// The device side of programmatic dependent launch (Hopper; launch_in_clusters and
// launch_dependent in core/cuda_helpers.h). A kernel launched as a programmatic dependent may start
// while the kernel before it on the stream still runs; it must wait for that kernel before it
// touches global memory. Without such a launch (or before Hopper) these return at once.
#pragma once

namespace hdk {
namespace detail {

// Waits until the kernel before this one has finished and its memory operations are visible.
__device__ __forceinline__ void wait_for_prior_grid() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the kernel after this one, if launched as a programmatic dependent, be scheduled once
// every CTA of this grid has called this or exited. It still waits for this grid to finish.
__device__ __forceinline__ void allow_dependent_grids() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Lets the next kernel be scheduled now if this grid leaves at least half the SMs idle, so that
// its CTAs reach their own wait on idle SMs while this one runs and start the moment it ends. A
// larger grid lets the next one start only as it finishes: the next grid's CTAs would otherwise be
// placed on the few SMs free at that moment (sparse_decode's combine after an early trigger of its
// split kernel: 4-11% slower on an H200).
__device__ __forceinline__ void allow_dependent_grids_if_small() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned int sm_count;
  asm("mov.u32 %0, %%nsmid;" : "=r"(sm_count));
  if (2ull * gridDim.x * gridDim.y * gridDim.z <= sm_count) allow_dependent_grids();
#endif
}

// The first statement of every kernel of the DeepSeek-V4 step and of hdk::topk: waits for the
// kernel before it (when launched as a programmatic dependent, launch_dependent in
// core/cuda_helpers.h), then lets a small grid's next kernel be scheduled. Two kinds of kernel
// trigger later instead: index_topk's select never lets the next kernel start early
// (index_topk_cuda.cu), and the compressors let it start once their rows' first inputs have
// arrived (kv_cache_cuda.cu).
__device__ __forceinline__ void begin_dependent_kernel() {
  wait_for_prior_grid();
  allow_dependent_grids_if_small();
}

}  // namespace detail
}  // namespace hdk
