// FP8 E4M3 codes and UE8M0 scales turned into bf16 / fp32 values by bit placement instead of
// decode_e4m3's case analysis: what the read kernels (sparse_decode, gather_entries) use to
// dequantize MODEL1 entries at a few instructions per value. Host-compiled too, so the CPU
// tests (tests/dsv4/sparse_decode_layout_test.cpp) check them against the decoder of
// kv_formats.h for every code.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// ---- FP8 E4M3 codes to bf16, two at a time ---------------------------------------------------
// The bf16 bit pattern sign << 15 | (code & 0x7f) << 4 is the E4M3 value times 2^-120 for every
// code but NaN (E4M3's exponent bias is 7, bf16's 127, and both have subnormals with the same
// mantissa alignment once shifted). Codes 0 and 1 of `word` (its low two bytes) land in the low
// and high halves of a bf16x2 word; the kernel multiplies by 2^120, then by the group's scale.
HDK_HOST_DEVICE uint32_t e4m3_pair_as_scaled_bf16(uint32_t word) {
  return ((word & 0x80u) << 8) | ((word & 0x7fu) << 4) | ((word & 0x8000u) << 16) |
         ((word & 0x7f00u) << 12);
}

// The same bits from the pair spread out to bytes 0 and 2 of `spread` (what byte_perm(word, 0,
// 0x4140) makes of bytes 0 and 1 of a word). Shifted up by 4, a code's sign sits on bit 11 of its
// half with bits 12..15 clear, and adding that bit 15 more times carries it to bit 15: a shift,
// a mask and a multiply-add for both codes (two shifts and two masks place the fields apart).
HDK_HOST_DEVICE uint32_t e4m3_spread_pair_as_scaled_bf16(uint32_t spread) {
  const uint32_t shifted = spread << 4;
  return shifted + 15u * (shifted & 0x08000800u);
}

// Whether any of the four codes of `word` is an E4M3 NaN (0x7F or 0xFF), which the pattern
// above would turn into a finite number: the classic zero-byte test on the complement of
// word | 0x80808080, whose NaN bytes are exactly the 0xFF ones.
HDK_HOST_DEVICE bool any_e4m3_nan(uint32_t word) {
  const uint32_t t = word | 0x80808080u;
  return ((~t - 0x01010101u) & t & 0x80808080u) != 0;
}

// Bit 7 of a byte set where that byte of `word` is an E4M3 NaN code, the other bits garbage: the
// byte's low seven bits are all set exactly when (byte & 0x7f) + 1 reaches bit 7, with no carry
// into the next byte. No branch and no mask, so a kernel ORs these over many words and masks once
// with 0x80808080 (any_e4m3_nan answers for one word).
HDK_HOST_DEVICE uint32_t e4m3_nan_carries(uint32_t word) {
  return (word & 0x7f7f7f7fu) + 0x01010101u;
}

// bf16 bits of 2^(byte - 127), the UE8M0 scale (0 is the subnormal 2^-127; 0xFF, NaN, is the
// caller's slow path).
HDK_HOST_DEVICE uint32_t ue8m0_as_bf16(uint32_t byte) {
  return byte == 0 ? 0x0040u : (byte << 7);
}

// bf16 bits of 2^120.
constexpr uint32_t kBf16TwoTo120 = (120u + 127u) << 7;

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
