// Host encoding of one indexer key (or indexer query) from 128 floats: the optional Hadamard
// rotation, then the format's codes and scales, written where the caller says. What the CPU
// backends of store_indexer_keys, compress (d = 128) and quantize_indexer_query write, so the
// three give the same bytes; the CUDA warp version (cuda/key_encode.cuh) writes the same bytes
// with the same fp32 operations in the same order.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "dsv4/kv_cache/compressor_math.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// In-place H_128 / sqrt(128) (Sylvester order) in fp32, butterflies of span 1, 2, ..., 64: the
// same operations in the same order as the CUDA warp version, so both write the same bytes.
inline void hadamard_128(float* x) {
  for (int span = 1; span < kIndexerKeyDim; span *= 2) {
    for (int i = 0; i < kIndexerKeyDim; ++i) {
      if (i & span) continue;
      const float a = x[i], b = x[i + span];
      x[i] = a + b;
      x[i + span] = a - b;
    }
  }
  for (int i = 0; i < kIndexerKeyDim; ++i)
    x[i] *= kHadamardNorm;
}

// The four little-endian bytes of an fp32 value (kFP8's per-key scale).
inline void store_fp32_bytes(uint8_t* target, uint32_t bits) {
  for (int b = 0; b < 4; ++b)
    target[b] = static_cast<uint8_t>(bits >> (8 * b));
}

// One key from 128 floats (rotated in place first when `rotate`): key_data_bytes(format) bytes
// of codes into `data`, key_scale_bytes(format) bytes of scales into `scales`. Returns true when
// the key holds a NaN or infinity: a group (kFP8: the whole key) holding one is stored as the
// format's NaN markers.
inline bool encode_key(float* x, KeyFormat format, bool rotate, uint8_t* data, uint8_t* scales) {
  if (rotate) hadamard_128(x);
  if (format == KeyFormat::kFP8) {
    // One power-of-two scale for all 128 values (the UE8M0 rule of MODEL1's groups), stored as
    // fp32; the division by it is exact.
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kIndexerKeyDim; ++i) {
      finite = finite && is_finite(x[i]);
      amax = std::fmax(amax, std::fabs(x[i]));
    }
    if (!finite) {
      std::memset(data, kFp8NaN, kIndexerKeyDim);
      store_fp32_bytes(scales, kFp32ScaleNaN);
      return true;
    }
    const int e = fp8_scale_exponent(amax);
    const float inverse = power_of_two(-e);
    for (int64_t i = 0; i < kIndexerKeyDim; ++i)
      data[i] = encode_e4m3(x[i] * inverse);
    store_fp32_bytes(scales, float_bits(power_of_two(e)));
    return false;
  }
  const int64_t group_size = format == KeyFormat::kMXFP4 ? 32 : 16;
  bool nonfinite = false;
  uint8_t codes[kIndexerKeyDim];
  for (int64_t g = 0; g < kIndexerKeyDim / group_size; ++g) {
    const float* group = x + g * group_size;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < group_size; ++i) {
      finite = finite && is_finite(group[i]);
      amax = std::fmax(amax, std::fabs(group[i]));
    }
    uint8_t* group_codes = codes + g * group_size;
    std::memset(group_codes, 0, static_cast<size_t>(group_size));
    if (!finite) {
      nonfinite = true;
      scales[g] = format == KeyFormat::kMXFP4 ? kScaleNaN : kE4m3ScaleNaN;
    } else if (format == KeyFormat::kMXFP4) {
      const int e = e2m1_scale_exponent(amax);
      const float scale = power_of_two(e);
      for (int64_t i = 0; i < group_size; ++i)
        group_codes[i] = encode_e2m1(group[i], scale);
      scales[g] = static_cast<uint8_t>(e + 127);
    } else {
      const uint8_t scale_code = nvfp4_scale_code(amax);
      const float scale = decode_e4m3(scale_code);
      for (int64_t i = 0; i < group_size && scale > 0.0f; ++i)
        group_codes[i] = encode_e2m1(group[i], scale);
      scales[g] = scale_code;
    }
  }
  for (int64_t j = 0; j < key_data_bytes(format); ++j)
    data[j] = static_cast<uint8_t>(codes[2 * j] | (codes[2 * j + 1] << 4));
  return nonfinite;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
