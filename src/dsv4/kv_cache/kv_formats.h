// The KV cache's number formats for the CPU and CUDA backends: FP8 E4M3, E2M1, UE8M0 and E4M3
// scales, encoded with integer and exact power-of-two arithmetic so both backends write the same
// bytes. The float64 reference (reference/kv_cache_reference.cpp) encodes by nearest-value search
// instead and shares none of this.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/float_bits.h"
#include "core/host_device.h"

namespace hdk {
namespace dsv4 {
namespace detail {

constexpr uint8_t kFp8NaN = 0x7f;    // E4M3 has no infinities; 0x7F is NaN
constexpr uint8_t kScaleNaN = 0xff;  // UE8M0's NaN
constexpr uint8_t kE4m3ScaleNaN = 0x7f;
constexpr uint32_t kFp32ScaleNaN = 0x7fc00000u;  // kFP8 keys: the fp32 scale of a marked key
constexpr float kScaleFloor = 1e-4f;             // amax below this takes the scale of 1e-4

using hdk::detail::float_bits;
using hdk::detail::float_of_bits;

HDK_HOST_DEVICE float round_half_even(float value) {
#if defined(__CUDA_ARCH__)
  return rintf(value);
#else
  return std::rint(value);
#endif
}

HDK_HOST_DEVICE double round_half_even(double value) {
#if defined(__CUDA_ARCH__)
  return rint(value);
#else
  return std::rint(value);
#endif
}

HDK_HOST_DEVICE bool is_finite(float value) {
  return (float_bits(value) & 0x7f800000u) != 0x7f800000u;
}

// 2^e as a float, for e in [-126, 127].
HDK_HOST_DEVICE float power_of_two(int e) {
  return float_of_bits(static_cast<uint32_t>(e + 127) << 23);
}

// The UE8M0 exponent of a group: ceil(log2(max(amax, 1e-4) / qmax)) for qmax = 448 (FP8) or 6
// (E2M1), exactly. With amax = m * 2^E, m in [1, 2): 448 = 1.75 * 2^8 and 6 = 1.5 * 2^2, so the
// exponent is E - 8 (or E - 2), one more when m exceeds 1.75 (or 1.5). amax must be finite.
HDK_HOST_DEVICE int fp8_scale_exponent(float amax) {
  const float clamped = amax > kScaleFloor ? amax : kScaleFloor;
  const uint32_t bits = float_bits(clamped);
  const int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127;
  return exponent - 8 + ((bits & 0x7fffffu) > 0x600000u ? 1 : 0);
}

HDK_HOST_DEVICE int e2m1_scale_exponent(float amax) {
  const float clamped = amax > kScaleFloor ? amax : kScaleFloor;
  const uint32_t bits = float_bits(clamped);
  const int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127;
  return exponent - 2 + ((bits & 0x7fffffu) > 0x400000u ? 1 : 0);
}

// E4M3 code (without sign) of a magnitude, round to nearest even, saturating to 448. Exact for
// float and double inputs: the scaled mantissa is an exact power-of-two multiple.
template <typename Real>
HDK_HOST_DEVICE uint8_t e4m3_magnitude_code(Real magnitude) {
  if (!(magnitude < Real(448))) return 0x7e;
  if (magnitude < Real(0.015625)) {  // below 2^-6: subnormal, steps of 2^-9
    return static_cast<uint8_t>(round_half_even(magnitude * Real(512)));
  }
  int exponent = 0;
  Real mantissa = magnitude;  // bring into [8, 16): 3 fraction bits left of the point
  while (mantissa >= Real(16))
    mantissa *= Real(0.5), ++exponent;
  while (mantissa < Real(8))
    mantissa *= Real(2), --exponent;
  const int rounded = static_cast<int>(round_half_even(mantissa));  // 8 .. 16
  const int code = ((exponent + 3 + 7) << 3) + (rounded - 8);
  return static_cast<uint8_t>(code > 0x7e ? 0x7e : code);
}

// FP8 E4M3 byte of a finite value whose magnitude the caller already scaled into range. Rounding
// to zero keeps the sign (0x80).
HDK_HOST_DEVICE uint8_t encode_e4m3(float value) {
  const uint8_t sign = static_cast<uint8_t>((float_bits(value) >> 24) & 0x80u);
  return static_cast<uint8_t>(sign | e4m3_magnitude_code(fabsf(value)));
}

HDK_HOST_DEVICE float decode_e4m3(uint8_t code) {
  const int exponent = (code >> 3) & 0xf;
  const int mantissa = code & 0x7;
  float magnitude;
  if ((code & 0x7f) == kFp8NaN) {
    magnitude = NAN;
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0.001953125f;  // 2^-9
  } else {
    magnitude = static_cast<float>(8 + mantissa) * power_of_two(exponent - 10);
  }
  return (code & 0x80) ? -magnitude : magnitude;
}

// E2M1 code of value / scale for scale > 0, rounding the exact quotient to nearest (ties to the
// even code) and saturating at 6: |value| is compared with each midpoint times scale, which is
// exact in float (a midpoint has at most 3 significant bits, a scale at most 4). Bit 3 is the
// sign, kept when the value rounds to zero.
HDK_HOST_DEVICE uint8_t encode_e2m1(float value, float scale) {
  const float a = fabsf(value);
  // Between codes k and k + 1 the tie goes to the even one: strict for even k, >= for odd k.
  const int code = (a > 0.25f * scale) + (a >= 0.75f * scale) + (a > 1.25f * scale) +
                   (a >= 1.75f * scale) + (a > 2.5f * scale) + (a >= 3.5f * scale) +
                   (a > 5.0f * scale);
  return static_cast<uint8_t>(((float_bits(value) >> 28) & 0x8u) | static_cast<uint32_t>(code));
}

HDK_HOST_DEVICE float decode_e2m1(uint8_t code) {
  // Magnitude codes 2..7 are normal (exponent bits 2..1, mantissa bit 0), 1 is 0.5, 0 is 0; bit 3
  // is the sign (code 8 is -0). Built from bits: a table indexed by the code put a 32-48 byte
  // stack frame, stores and loads into index_topk's query staging (the packed MXFP4 query's
  // key-ring kernel 1.03-1.39x without it, H200).
  const uint32_t exponent = (code >> 1) & 3u, mantissa = code & 1u;
  const uint32_t magnitude =
      exponent != 0 ? (exponent + 126u) << 23 | mantissa << 22 : mantissa * 0x3f000000u;
  return float_of_bits(magnitude | static_cast<uint32_t>(code & 0x8u) << 28);
}

// UE8M0 byte e: 2^(e - 127); 0xFF is NaN.
HDK_HOST_DEVICE float decode_ue8m0(uint8_t byte) {
  if (byte == kScaleNaN) return NAN;
  if (byte == 0) return 5.877471754111438e-39f;  // 2^-127, subnormal
  return power_of_two(static_cast<int>(byte) - 127);
}

// NVFP4's group scale: amax / 6 rounded to E4M3 (RNE, saturating). The quotient is taken in
// double, where it is exact enough that rounding it once gives the E4M3 rounding of the real one.
HDK_HOST_DEVICE uint8_t nvfp4_scale_code(float amax) {
  return e4m3_magnitude_code(static_cast<double>(amax) / 6.0);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
