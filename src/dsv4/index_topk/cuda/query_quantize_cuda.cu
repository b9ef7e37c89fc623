// quantize_indexer_query on CUDA: one warp per [n, h] vector, 4 warps a CTA. Lane l loads values
// 4l .. 4l + 3 (one 16-byte fp32 or 8-byte bf16 load where q's base and strides allow), the
// shared key encoder rotates and quantizes them (kv_cache/cuda/key_encode.cuh, the one
// store_indexer_keys' kernel runs), and the lane stores its two code bytes; lane 0 stores the
// 4 scale bytes. No atomics except on the invalid counter, which only non-finite vectors touch.
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/count_invalid.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda_helpers.h"
#include "dsv4/index_topk/cuda/query_quantize_cuda.h"
#include "dsv4/kv_cache/cuda/key_encode.cuh"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr int kWarpsPerBlock = 4;

// Values 4 * lane .. 4 * lane + 3 of one q vector; `aligned`: q's base and strides allow one
// 16-byte (fp32) or 8-byte (bf16) load.
__device__ __forceinline__ void load_four(const void* base, DType dtype, int64_t offset,
                                          bool aligned, float (&x)[4]) {
  if (dtype == DType::kFloat32) {
    const float* source = static_cast<const float*>(base) + offset;
    if (aligned) {
      const float4 v = *reinterpret_cast<const float4*>(source);
      x[0] = v.x, x[1] = v.y, x[2] = v.z, x[3] = v.w;
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        x[i] = source[i];
    }
  } else {
    const uint16_t* source = static_cast<const uint16_t*>(base) + offset;
    uint32_t words[2];
    if (aligned) {
      const uint2 v = *reinterpret_cast<const uint2*>(source);
      words[0] = v.x, words[1] = v.y;
    } else {
      words[0] = source[0] | (static_cast<uint32_t>(source[1]) << 16);
      words[1] = source[2] | (static_cast<uint32_t>(source[3]) << 16);
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      x[2 * j] = __uint_as_float(words[j] << 16);
      x[2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
    }
  }
}

// `aligned_q`: see load_four. `aligned_out`: q_packed's vectors start on even addresses and
// q_scales' on multiples of 4, so the key writer's 2- and 4-byte stores apply; else bytes.
__global__ void quantize_query_kernel(QueryQuantizeProblem p, bool aligned_q, bool aligned_out) {
  hdk::detail::begin_dependent_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t v = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (v >= p.num_vectors()) return;
  int64_t n = v, h = 0;
  if ((static_cast<uint64_t>(v) | static_cast<uint64_t>(p.num_heads)) <= 0xffffffffull) {
    const uint32_t narrow = static_cast<uint32_t>(v), heads = static_cast<uint32_t>(p.num_heads);
    n = narrow / heads, h = narrow % heads;
  } else {
    n = v / p.num_heads, h = v % p.num_heads;
  }
  float x[4];
  load_four(p.q, p.q_dtype, n * p.q_row_stride + h * p.q_head_stride + 4 * lane, aligned_q, x);
  const WarpKey key = warp_encode_key(x, KeyFormat::kMXFP4, p.rotate, lane);
  uint8_t* packed = p.packed + n * p.packed_row_stride + h * p.packed_head_stride;
  uint8_t* scales = p.scales + n * p.scales_row_stride + h * p.scales_head_stride;
  if (aligned_out) {
    warp_store_key(key, KeyFormat::kMXFP4, packed, scales, lane);
  } else {
    packed[2 * lane] = static_cast<uint8_t>(key.codes);
    packed[2 * lane + 1] = static_cast<uint8_t>(key.codes >> 8);
    if (lane < 4) scales[lane] = static_cast<uint8_t>(key.scale_low >> (8 * lane));
  }
  if (lane == 0 && key.nonfinite) count_invalid(p.invalid_count, 1);
}

bool aligned_to(const void* pointer, int64_t row_stride, int64_t head_stride, int64_t bytes) {
  return reinterpret_cast<uintptr_t>(pointer) % bytes == 0 && row_stride % bytes == 0 &&
         head_stride % bytes == 0;
}

}  // namespace

void quantize_indexer_query_cuda(const QueryQuantizeProblem& p, int device, CudaStream stream) {
  const char* operation = "hdk::dsv4::quantize_indexer_query";
  const int64_t vectors = p.num_vectors();
  if (vectors == 0) return;
  const int64_t element = p.q_dtype == DType::kFloat32 ? 4 : 2;
  const bool aligned_q =
      aligned_to(p.q, p.q_row_stride * element, p.q_head_stride * element, 4 * element);
  const bool aligned_out = aligned_to(p.packed, p.packed_row_stride, p.packed_head_stride, 2) &&
                           aligned_to(p.scales, p.scales_row_stride, p.scales_head_stride, 4);
  hdk::detail::CudaDeviceGuard guard(device, operation);
  const auto blocks = static_cast<unsigned>((vectors + kWarpsPerBlock - 1) / kWarpsPerBlock);
  hdk::detail::check_launch(
      hdk::detail::launch_dependent(quantize_query_kernel, blocks, 32 * kWarpsPerBlock, 0, stream,
                                    p, aligned_q, aligned_out),
      operation, "quantize_query_kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
