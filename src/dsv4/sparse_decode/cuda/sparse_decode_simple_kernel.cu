// sparse_decode's CUDA-core kernel, for any head count: one CTA per query row, one warp per head
// at a time, lane l holding entry values 16 l .. 16 l + 15 in fp32; the CPU backend's arithmetic,
// step for step. The tensor-core kernels serve head counts that are multiples of 16 up to 512.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/bf16_pairs.h"
#include "core/cuda/count_invalid.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_device.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_kernels.cuh"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

// Lane `lane`'s 16 values of the entry at `slot`, exactly as the CPU decodes them.
__device__ void decode_entry_values(const PagedPool& pool, int64_t slot, int lane, float (&x)[16]) {
  const auto [page, offset] = pool.locate(slot);
  const uint8_t* data = page + offset * kEntryDataBytes;
  if (lane < 28) {
    const uint2 lo = reinterpret_cast<const uint2*>(data + 16 * lane)[0];
    const uint2 hi = reinterpret_cast<const uint2*>(data + 16 * lane)[1];
    const uint32_t words[4] = {lo.x, lo.y, hi.x, hi.y};
    const float scale = decode_ue8m0(
        page[pool.block_size * kEntryDataBytes + offset * kEntryScaleBytes + lane / 4]);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      x[i] = decode_e4m3(static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)))) * scale;
  } else {
    const uint2* rope = reinterpret_cast<const uint2*>(data + kNopeDim + 32 * (lane - 28));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint2 v = rope[w];
      x[4 * w] = __uint_as_float(v.x << 16);
      x[4 * w + 1] = __uint_as_float(v.x & 0xffff0000u);
      x[4 * w + 2] = __uint_as_float(v.y << 16);
      x[4 * w + 3] = __uint_as_float(v.y & 0xffff0000u);
    }
  }
}

}  // namespace

__global__ void __launch_bounds__(kSparseThreads)
    sparse_decode_simple_kernel(SparseDecodeProblem p) {
  hdk::detail::begin_dependent_kernel();
  __shared__ int bad;
  const int64_t n = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  const int64_t length = p.list_length();
  for (int64_t h = warp; h < p.num_heads; h += kSparseWarps) {
    float q[16], acc[16];
    bool finite = true;
    const int64_t q_offset = n * p.q.row_stride + h * p.q.head_stride + 16 * lane;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      q[i] = p.q.dtype == DType::kFloat32
                 ? static_cast<const float*>(p.q.data)[q_offset + i]
                 : bf16_bits_value(static_cast<const uint16_t*>(p.q.data)[q_offset + i]);
      finite = finite && is_finite(q[i]);
      acc[i] = 0.0f;
    }
    if (!finite) bad = 1;
    float running_max = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < length; ++j) {
      const int64_t slot = p.list_slot(n, j);
      const PagedPool& pool = p.list_pool(j);
      if (slot < 0) continue;
      if (slot >= pool.num_slots()) {
        bad = 1;
        continue;
      }
      float x[16];
      decode_entry_values(pool, slot, lane, x);
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        dot = fmaf(q[i], x[i], dot);
#pragma unroll
      for (int mask = 16; mask >= 1; mask /= 2)
        dot += __shfl_xor_sync(kFullMask, dot, mask);
      const float s = dot * p.scale;
      if (s > running_max) {  // rescale what was summed against the old maximum
        const float factor = expf(running_max - s);
        sum *= factor;
#pragma unroll
        for (int i = 0; i < 16; ++i)
          acc[i] *= factor;
        running_max = s;
      }
      const float weight = expf(s - running_max);
      sum += weight;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        acc[i] = fmaf(weight, x[i], acc[i]);
    }
    const float sink = p.sink != nullptr ? p.sink[h * p.sink_stride] : -INFINITY;
    const float top = fmaxf(running_max, sink);
    float lse = -INFINITY;
    if (top == -INFINITY) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
        acc[i] = 0.0f;
    } else {
      const float list_weight = expf(running_max - top);
      const float denominator = sum * list_weight + expf(sink - top);
      const float factor = list_weight / denominator;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        acc[i] *= factor;
      lse = top + logf(denominator);
    }
    if (!p.lse_includes_sink) lse = running_max == -INFINITY ? -INFINITY : running_max + logf(sum);
    // A NaN sink makes the row invalid even for an empty list, as in the CPU and the reference;
    // fmaxf above dropped it.
    bool nan = isnan(lse) || isnan(sink) || isnan(running_max);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      nan = nan || isnan(acc[i]);
    if (nan) bad = 1;
    const int64_t out_offset = n * p.out_row_stride + h * p.out_head_stride + 16 * lane;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      store_output(p, out_offset + i, acc[i]);
    if (lane == 0 && p.lse != nullptr) p.lse[n * p.lse_row_stride + h * p.lse_head_stride] = lse;
  }
  __syncthreads();  // every head is written and `bad` is final
  if (!bad) return;
  for (int64_t i = threadIdx.x; i < p.num_heads * kHeadDim; i += kSparseThreads) {
    const int64_t h = i / kHeadDim;
    store_output(p, n * p.out_row_stride + h * p.out_head_stride + i % kHeadDim, 0.0f);
    if (i % kHeadDim == 0 && p.lse != nullptr) {
      p.lse[n * p.lse_row_stride + h * p.lse_head_stride] = NAN;
    }
  }
  if (threadIdx.x == 0) count_invalid(p.invalid_count, 1);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
