// Prefix sums over a warp and over a block, for kernels that give each thread its place in an
// output from per-thread counts.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hdk {
namespace detail {

// The sum of `value` over this lane and the lanes below it; all 32 lanes call it.
__device__ __forceinline__ uint32_t warp_inclusive_sum(uint32_t value, int lane) {
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const uint32_t other = __shfl_up_sync(0xffffffffu, value, offset);
    if (lane >= offset) value += other;
  }
  return value;
}

// This thread's exclusive prefix sum of `value` over the block in thread order, and the block's
// total in *total unless null. Every thread calls it; blockDim.x is a multiple of 32. One block
// barrier, after which every warp reads `warp_sums` (32 words): the caller synchronizes before
// they are written again. Every warp scans the warp sums itself, lane w holding warp w's, rather
// than each thread adding those of the warps before it (a chain of up to 31 shared loads at 1024
// threads).
__device__ __forceinline__ uint32_t block_exclusive_sum(uint32_t value, uint32_t* warp_sums,
                                                        uint32_t* total) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const uint32_t inclusive = warp_inclusive_sum(value, lane);
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  const uint32_t sum = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0u;
  const uint32_t scanned = warp_inclusive_sum(sum, lane);
  if (total != nullptr) *total = __shfl_sync(0xffffffffu, scanned, 31);
  return __shfl_sync(0xffffffffu, scanned - sum, warp) + inclusive - value;
}

}  // namespace detail
}  // namespace hdk
