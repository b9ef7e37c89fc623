// The warp encoder of one indexer key (or indexer query) on CUDA: 32 lanes of 4 values each,
// the optional Hadamard rotation (spans 1-2 in registers, 4-64 by shuffles, in the CPU backend's
// order: cpu/key_encode.h), then the format's codes and scales. What store_indexer_keys,
// compress (d = 128) and quantize_indexer_query write, so the three give the same bytes. The
// encoder returns each lane's bytes; warp_store_key writes them into a key page.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dsv4/kv_cache/compressor_math.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// The E4M3 codes of two finite, already scaled values, the first in the low byte: the hardware's
// conversion (round to nearest even, saturating at 448) gives encode_e4m3's bytes (the CPU
// backend's and the reference's; the CUDA tests compare them bit for bit) in one instruction,
// where encode_e4m3's normalizing loops took dozens per value. At N = 1 one warp's chain of
// those was most of what store_entries spent above an empty kernel (H200: 8.0 -> 4.0 us; the
// compressor's step, which writes through the same code, 1.5-1.7x faster).
__device__ __forceinline__ uint32_t e4m3_pair(float first, float second) {
  return static_cast<uint32_t>(
      __nv_cvt_float2_to_fp8x2(make_float2(first, second), __NV_SATFINITE, __NV_E4M3));
}

// In-place H_128 / sqrt(128) of the 128 values a warp holds, 4 * lane + i in x[i].
__device__ __forceinline__ void warp_hadamard_128(float (&x)[4], int lane) {
  constexpr unsigned kAllLanes = 0xffffffffu;
#pragma unroll
  for (int span = 1; span <= 2; span *= 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (i & span) continue;
      const float a = x[i], b = x[i + span];
      x[i] = a + b;
      x[i + span] = a - b;
    }
  }
#pragma unroll
  for (int lane_span = 1; lane_span < 32; lane_span *= 2) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float partner = __shfl_xor_sync(kAllLanes, x[i], lane_span);
      x[i] = (lane & lane_span) ? partner - x[i] : x[i] + partner;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
    x[i] *= kHadamardNorm;
}

// One encoded key, as the warp holds it.
struct WarpKey {
  // This lane's code bytes, values 4 * lane .. 4 * lane + 3: kMXFP4 / kNVFP4 two bytes (value
  // 4 * lane + i in nibble i), kFP8 four bytes (value 4 * lane + i in byte i).
  uint32_t codes;
  // The key's scale bytes, on every lane: bytes 0-3 in scale_low (kMXFP4's 4 UE8M0 scales,
  // kNVFP4's first 4 E4M3 scales, kFP8's fp32 scale bits), kNVFP4's bytes 4-7 in scale_high.
  uint32_t scale_low;
  uint32_t scale_high;
  bool nonfinite;  // the key holds a NaN or infinity (stored as NaN markers), on every lane
};

// Encodes the key whose values 4 * lane .. 4 * lane + 3 this lane holds in x (rotated in place
// first when asked). Every lane of the warp must call it.
__device__ __forceinline__ WarpKey warp_encode_key(float (&x)[4], KeyFormat format, bool rotate,
                                                   int lane) {
  constexpr unsigned kAllLanes = 0xffffffffu;
  if (rotate) warp_hadamard_128(x, lane);
  bool finite = true;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    finite = finite && is_finite(x[i]);
    amax = fmaxf(amax, fabsf(x[i]));
  }
  WarpKey key{0u, 0u, 0u, false};
  if (format == KeyFormat::kFP8) {
    // One power-of-two scale for the whole key: amax over all 32 lanes.
#pragma unroll
    for (int mask = 1; mask < 32; mask *= 2)
      amax = fmaxf(amax, __shfl_xor_sync(kAllLanes, amax, mask));
    finite = __all_sync(kAllLanes, finite) != 0;
    if (finite) {
      const int e = fp8_scale_exponent(amax);
      const float inverse = power_of_two(-e);
      key.codes = e4m3_pair(x[0] * inverse, x[1] * inverse) |
                  (e4m3_pair(x[2] * inverse, x[3] * inverse) << 16);
      key.scale_low = float_bits(power_of_two(e));
    } else {
      key.codes = 0x7f7f7f7fu;
      key.scale_low = kFp32ScaleNaN;
    }
    key.nonfinite = !finite;
    return key;
  }
  const bool mx = format == KeyFormat::kMXFP4;
  const int group_lanes = mx ? 8 : 4;  // 32 or 16 values
  for (int mask = 1; mask < group_lanes; mask *= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(kAllLanes, amax, mask));
    finite = __shfl_xor_sync(kAllLanes, static_cast<int>(finite), mask) != 0 && finite;
  }
  uint32_t scale_byte;
  if (!finite) {
    scale_byte = mx ? kScaleNaN : kE4m3ScaleNaN;
  } else if (mx) {
    const int e = e2m1_scale_exponent(amax);
    const float scale = power_of_two(e);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      key.codes |= static_cast<uint32_t>(encode_e2m1(x[i], scale)) << (4 * i);
    scale_byte = static_cast<uint32_t>(e + 127);
  } else {
    scale_byte = nvfp4_scale_code(amax);
    const float scale = decode_e4m3(static_cast<uint8_t>(scale_byte));
    if (scale > 0.0f) {
#pragma unroll
      for (int i = 0; i < 4; ++i)
        key.codes |= static_cast<uint32_t>(encode_e2m1(x[i], scale)) << (4 * i);
    }
  }
  const int groups = mx ? 4 : 8;
  for (int g = 0; g < groups; ++g) {
    const uint32_t byte = __shfl_sync(kAllLanes, scale_byte, g * group_lanes);
    if (g < 4) {
      key.scale_low |= byte << (8 * g);
    } else {
      key.scale_high |= byte << (8 * (g - 4));
    }
  }
  key.nonfinite = __any_sync(kAllLanes, !finite) != 0;
  return key;
}

// Writes an encoded key: its codes at `data` (key_data_bytes(format) bytes, 2- or 4-byte stores
// per lane), its scales at `scales` (lane 0: one 4-byte store, kNVFP4 one 8-byte store). `data`
// must be 4-byte aligned (kFP8) or 2-byte aligned; `scales` 8-byte aligned for kNVFP4, else
// 4-byte aligned.
__device__ __forceinline__ void warp_store_key(const WarpKey& key, KeyFormat format, uint8_t* data,
                                               uint8_t* scales, int lane) {
  if (format == KeyFormat::kFP8) {
    reinterpret_cast<uint32_t*>(data)[lane] = key.codes;
  } else {
    reinterpret_cast<uint16_t*>(data)[lane] = static_cast<uint16_t>(key.codes);
  }
  if (lane == 0) {
    if (format == KeyFormat::kNVFP4) {
      *reinterpret_cast<uint2*>(scales) = make_uint2(key.scale_low, key.scale_high);
    } else {
      *reinterpret_cast<uint32_t*>(scales) = key.scale_low;
    }
  }
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
