// Memory-pattern floors for hdk-bench: what this GPU can do for an in-place read-modify-write
// of the same bytes a decode step moves, with and without the per-block index indirection of
// a state pool. The GDN step cannot beat the flat one. Also the empty kernel of every floor's
// launch cost.
#include <cuda_runtime.h>

#include <cstdint>

#include "floor_kernels.h"

namespace hdk {
namespace bench {
namespace {

__device__ __forceinline__ uint4 touch(uint4 v) {
  // A cheap change of every word, so the store is not a no-op the hardware could skip.
  return make_uint4(v.x ^ 0x00010001u, v.y ^ 0x00010001u, v.z ^ 0x00010001u, v.w ^ 0x00010001u);
}

// Each thread updates one 16-byte vector (grid covers the buffer once).
__global__ void rmw_flat(uint4* data, int64_t vectors) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < vectors) data[i] = touch(data[i]);
}

// Each warp updates one block of kVectorsPerLane x 32 vectors (4 KiB for 8), all loads first.
template <int kVectorsPerLane, bool kIndexed>
__global__ void rmw_blocks(uint4* data, const int32_t* block_of_warp, int64_t blocks) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= blocks) return;
  const int64_t block = kIndexed ? block_of_warp[warp] : warp;
  uint4* base = data + block * kVectorsPerLane * 32;
  uint4 v[kVectorsPerLane];
#pragma unroll
  for (int i = 0; i < kVectorsPerLane; ++i)
    v[i] = base[i * 32 + lane];
#pragma unroll
  for (int i = 0; i < kVectorsPerLane; ++i)
    base[i * 32 + lane] = touch(v[i]);
}

__global__ void empty_kernel() {}

}  // namespace

void launch_empty_kernel(cudaStream_t stream) {
  empty_kernel<<<1, 1, 0, stream>>>();
}

void launch_floor(FloorPattern pattern, void* data, int64_t bytes, const int32_t* block_of_warp,
                  cudaStream_t stream) {
  const int64_t vectors = bytes / 16;
  switch (pattern) {
    case FloorPattern::kFlat:
      rmw_flat<<<static_cast<unsigned>((vectors + 255) / 256), 256, 0, stream>>>(
          static_cast<uint4*>(data), vectors);
      break;
    case FloorPattern::kBlocks:
    case FloorPattern::kIndexedBlocks: {
      const int64_t blocks = vectors / (8 * 32);
      const unsigned ctas = static_cast<unsigned>((blocks * 32 + 127) / 128);
      if (pattern == FloorPattern::kBlocks) {
        rmw_blocks<8, false><<<ctas, 128, 0, stream>>>(static_cast<uint4*>(data), nullptr, blocks);
      } else {
        rmw_blocks<8, true>
            <<<ctas, 128, 0, stream>>>(static_cast<uint4*>(data), block_of_warp, blocks);
      }
      break;
    }
  }
}

}  // namespace bench
}  // namespace hdk
