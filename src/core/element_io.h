// Host loads and stores of float-like elements in any of hdk's floating dtypes, converted to or
// from fp32 arrays. Used by the CPU backends for rows of state, inputs and outputs.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/float_convert.h"
#include "hdk/dtype.h"

namespace hdk {
namespace detail {

inline float load_float(const void* base, DType dtype, int64_t offset) {
  switch (dtype) {
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
    case DType::kFloat16:
      return half_to_float(static_cast<const uint16_t*>(base)[offset]);
    default:
      return static_cast<const float*>(base)[offset];
  }
}

// dst[i] = element (offset + i), for a contiguous run.
inline void load_floats(const void* base, DType dtype, int64_t offset, int64_t count, float* dst) {
  switch (dtype) {
    case DType::kBFloat16: {
      // Written as integer shifts so the loop vectorizes.
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < count; ++i) {
        const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
        std::memcpy(dst + i, &bits, sizeof(bits));
      }
      break;
    }
    case DType::kFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(base) + offset;
      for (int64_t i = 0; i < count; ++i)
        dst[i] = half_to_float(src[i]);
      break;
    }
    default:
      std::memcpy(dst, static_cast<const float*>(base) + offset, sizeof(float) * count);
      break;
  }
}

inline void store_floats(void* base, DType dtype, int64_t offset, int64_t count, const float* src) {
  switch (dtype) {
    case DType::kBFloat16: {
      // float_to_bf16 without branches, so the loop vectorizes; same rounding and NaN rule.
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < count; ++i) {
        uint32_t b;
        std::memcpy(&b, src + i, sizeof(b));
        const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
        const bool nan = static_cast<int32_t>(b & 0x7fffffffu) > 0x7f800000;
        dst[i] = static_cast<uint16_t>(nan ? ((b >> 16) | 0x40u) : rounded);
      }
      break;
    }
    case DType::kFloat16: {
      uint16_t* dst = static_cast<uint16_t*>(base) + offset;
      for (int64_t i = 0; i < count; ++i)
        dst[i] = float_to_half(src[i]);
      break;
    }
    default:
      std::memcpy(static_cast<float*>(base) + offset, src, sizeof(float) * count);
      break;
  }
}

// All three float dtypes encode +0 as all-zero bits.
inline void store_zeros(void* base, DType dtype, int64_t offset, int64_t count) {
  std::memset(static_cast<char*>(base) + offset * static_cast<int64_t>(dtype_size(dtype)), 0,
              static_cast<size_t>(count) * dtype_size(dtype));
}

}  // namespace detail
}  // namespace hdk
