// bf16 and fp16 <-> fp32 on the host, bit-exact with the CUDA intrinsics (round to nearest even).
#pragma once

#include <cstdint>
#include <cstring>

namespace hdk {
namespace detail {

inline float bits_to_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline uint32_t float_to_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float bf16_to_float(uint16_t value) {
  return bits_to_float(static_cast<uint32_t>(value) << 16);
}

inline uint16_t float_to_bf16(float value) {
  const uint32_t bits = float_to_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((bits >> 16) | 0x40u);  // NaN
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

inline float half_to_float(uint16_t value) {
  const uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  const uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0x1fu) return bits_to_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_to_float(sign);
    // Subnormal: value = mantissa * 2^-24.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  }
  return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

inline uint16_t float_to_half(float value) {
  const uint32_t bits = float_to_bits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (magnitude >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow: inf
  if (magnitude < 0x38800000u) {
    // Subnormal or zero in fp16: round magnitude / 2^-24 to the nearest even integer.
    const float scaled = bits_to_float(magnitude) * 16777216.0f;
    const auto truncated = static_cast<uint32_t>(scaled);
    const float remainder = scaled - static_cast<float>(truncated);
    uint32_t rounded = truncated;
    if (remainder > 0.5f || (remainder == 0.5f && (truncated & 1u))) ++rounded;
    return static_cast<uint16_t>(sign | rounded);
  }
  const uint32_t rounding = 0xfffu + ((magnitude >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((magnitude - 0x38000000u + rounding) >> 13));
}

}  // namespace detail
}  // namespace hdk
