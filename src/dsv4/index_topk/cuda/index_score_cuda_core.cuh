// Scoring on CUDA cores, every key and query form (one warp an entry, fp32 FMAs): the tests'
// cross-check of the tensor-core kernels.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/cuda/index_key_loads.cuh"
#include "dsv4/index_topk/cuda/index_topk_device.cuh"
#include "dsv4/index_topk/index_launch_plan.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

// The key values a lane holds on CUDA cores: dims 4 lane .. 4 lane + 3 of the entry at `place`,
// decoded like the CPU backend decodes them.
template <KeyFormat kFormat>
__device__ __forceinline__ void decode_lane_key(const IndexerProblem& p, const EntryPlace& place,
                                                int lane, float (&key)[4]) {
  constexpr int64_t kDataBytes = key_data_bytes(kFormat);
  const uint8_t* data = place.page + place.offset * kDataBytes;
  const uint8_t* scales =
      place.page + p.keys.block_size * kDataBytes + place.offset * key_scale_bytes(kFormat);
  if constexpr (kFormat == KeyFormat::kFP8) {
    const float scale = *reinterpret_cast<const float*>(scales);
    for (int i = 0; i < 4; ++i)
      key[i] = decode_e4m3(data[4 * lane + i]) * scale;
  } else {
    const float scale = kFormat == KeyFormat::kMXFP4 ? decode_ue8m0(scales[lane / 8])
                                                     : decode_e4m3(scales[lane / 4]);
    for (int i = 0; i < 4; ++i) {
      const uint8_t byte = data[2 * lane + i / 2];
      key[i] = decode_e2m1(static_cast<uint8_t>((byte >> (4 * (i & 1))) & 0xf)) * scale;
    }
  }
}

// CUDA cores, the plain way: one warp per entry, lane l holds dims 4l .. 4l + 3 (decoded like
// the CPU backend does), fp32 dot per head, heads summed in order. For MXFP4 q the dot is the
// CPU's: each scale group's (8 lanes) sum, exact, then the groups added in order.
template <QueryKind kQ, KeyFormat kFormat>
__device__ void score_cuda_core(const IndexerProblem& p, int64_t row, int64_t first, int64_t count,
                                const IndexLaunch& launch, const uint8_t* shared, uint32_t* out,
                                const KeyPages& pages) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const float* q = reinterpret_cast<const float*>(shared + launch.q);
  const float* weights = reinterpret_cast<const float*>(shared + launch.weights);
  for (int64_t e = warp; e < count; e += kWarps) {
    float key[4];
    decode_lane_key<kFormat>(p, place_of(p, row, first + e, pages), lane, key);
    float score = 0.0f;
    for (int64_t h = 0; h < p.num_heads; ++h) {
      const float* qh = q + h * kIndexerKeyDim + 4 * lane;
      float dot = 0.0f;
      for (int i = 0; i < 4; ++i)
        dot += qh[i] * key[i];
      if constexpr (kQ == QueryKind::kMXFP4) {
        for (int offset = 4; offset > 0; offset >>= 1)
          dot += __shfl_xor_sync(kFullMask, dot, offset);
        float total = __shfl_sync(kFullMask, dot, 0);
        for (int g = 1; g < 4; ++g)
          total += __shfl_sync(kFullMask, dot, 8 * g);
        dot = total;
      } else {
        for (int offset = 16; offset > 0; offset >>= 1)
          dot += __shfl_xor_sync(kFullMask, dot, offset);
      }
      score += relu(dot) * weights[h];
    }
    if (lane == 0) out[e] = ordered_key(score);
  }
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
