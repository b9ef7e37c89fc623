// bf16 values and pairs of them in one 32-bit register, as host-and-device functions with the
// same bits on both sides (the CPU tests emulate the kernels' conversions with them): rounding,
// packing, the finiteness of a pair, the fp32 hi + lo split, byte permutes and the bf16x2
// product. Shared by index_topk's and sparse_decode's kernels.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/float_bits.h"
#include "core/host_device.h"

namespace hdk {
namespace dsv4 {
namespace detail {

using hdk::detail::float_bits;

// Round to nearest even, NaN kept NaN; the same bits on the host and the device.
HDK_HOST_DEVICE uint32_t bf16_rn_bits(float value) {
  const uint32_t b = float_bits(value);
  if ((b & 0x7fffffffu) > 0x7f800000u) return ((b >> 16) | 0x40u) & 0xffffu;
  return (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
}

HDK_HOST_DEVICE float bf16_bits_value(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits << 16);
#else
  const uint32_t word = bits << 16;
  float value;
  std::memcpy(&value, &word, sizeof(value));
  return value;
#endif
}

// Two bf16 in one register: `low` is the lower-numbered fragment element.
HDK_HOST_DEVICE uint32_t pack_bf16x2(uint32_t low, uint32_t high) {
  return (low & 0xffffu) | (high << 16);
}

// Two floats rounded to bf16 (nearest even) in one register, `low` in the low half: one cvt on
// the device, the same bits as bf16_rn_bits on the host (NaN stays NaN).
HDK_HOST_DEVICE uint32_t pack_floats_bf16x2(float low, float high) {
#if defined(__CUDA_ARCH__)
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
  return packed;
#else
  return pack_bf16x2(bf16_rn_bits(low), bf16_rn_bits(high));
#endif
}

// Bit 15 (31) set where the low (high) bf16 of the pair is an infinity or a NaN (an exponent of
// all ones), with no comparison: each half of pair & 0x7f807f80 is at most 0x7f80, and adding
// 0x80 reaches the half's top bit only where it is exactly that, carrying nothing into the other
// half. A loop over many pairs ORs these and tests once, where chained comparisons serialize it.
HDK_HOST_DEVICE uint32_t bf16x2_nonfinite_bits(uint32_t pair) {
  return ((pair & 0x7f807f80u) + 0x00800080u) & 0x80008000u;
}

// The (hi, lo) bf16 parts of a finite fp32 query value: hi + lo is within 2^-17 |value|.
HDK_HOST_DEVICE void split_bf16(float value, uint32_t& hi, uint32_t& lo) {
  hi = bf16_rn_bits(value);
  lo = bf16_rn_bits(value - bf16_bits_value(hi));
}

// __byte_perm: byte i of the result is byte selector[4i + 2 : 4i] of the 8-byte value (y:x).
// Only selectors 0..7 are used here (no sign-replicate mode), which is what the host emulates.
HDK_HOST_DEVICE uint32_t byte_perm(uint32_t x, uint32_t y, uint32_t selector) {
#if defined(__CUDA_ARCH__)
  return __byte_perm(x, y, selector);
#else
  const uint64_t bytes = (static_cast<uint64_t>(y) << 32) | x;
  uint32_t result = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t pick = (selector >> (4 * i)) & 7u;
    result |= static_cast<uint32_t>((bytes >> (8 * pick)) & 0xffu) << (8 * i);
  }
  return result;
#endif
}

// bf16x2 product rounded to nearest even (the kernels multiply by powers of two or by scales that
// keep their products exact: dsv4/index_topk/index_mma_layout.h, sparse_decode_cuda.cu).
HDK_HOST_DEVICE uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  uint32_t product;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(product) : "r"(a), "r"(b));
  return product;
#else
  return pack_floats_bf16x2(bf16_bits_value(a & 0xffffu) * bf16_bits_value(b & 0xffffu),
                            bf16_bits_value(a >> 16) * bf16_bits_value(b >> 16));
#endif
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
