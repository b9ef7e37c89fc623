// Floor kernels (CUDA builds only; see floor_kernels.cu): memory patterns at copy speed, and the
// empty kernel whose graph replay is the launch cost every x_floor includes.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hdk {
namespace bench {

enum class FloorPattern {
  kFlat,           // one 16-byte vector per thread over the whole buffer
  kBlocks,         // one 4 KiB block per warp, loads then stores
  kIndexedBlocks,  // the same, the block read from an index array first (a pool lookup)
};

// `bytes` must be a multiple of 4 KiB; block_of_warp is a device array of bytes / 4096 entries
// (a permutation) for kIndexedBlocks.
void launch_floor(FloorPattern pattern, void* data, int64_t bytes, const int32_t* block_of_warp,
                  cudaStream_t stream);

// A kernel that does nothing, one CTA of one thread.
void launch_empty_kernel(cudaStream_t stream);

}  // namespace bench
}  // namespace hdk
