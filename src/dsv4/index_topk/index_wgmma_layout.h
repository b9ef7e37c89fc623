// Who holds what in index_topk's warpgroup scoring (cuda/index_score_bf16.cuh, score_warpgroup), as
// host-and-device functions so that tests/dsv4/index_mma_layout_test.cpp emulates a warpgroup's
// wgmma with exactly the fragments the kernel builds.
//
// Per tile of 64 entries a warpgroup computes D[e, h] = sum_d K_e[d] q[h, d] with wgmma
// m64n64k16 (bf16 in, fp32 accumulate): A = keys (64 entries x 16 dims, in registers: the
// dequantized values go from the converting thread straight to the tensor cores), B = q (16 dims
// x 64 heads, K-major in shared memory, staged once per row), D = 64 entries x 64 heads. Each
// thread holds two entries (rows r and r + 8 of its warp's 16) and, as in the warp kernel, one
// 16-byte piece of each: dims 32t .. 32t + 31 for quad lane t (one MXFP4 scale group, two NVFP4
// ones). The k dimension is a permutation of the 128 dims chosen so that the dequantization is
// plain bit placement: register pair i of word w of the piece holds nibbles i and i + 4 of the
// word (dims 32t + 8w + i and + 4), and k-step j takes word j / 2, pairs 2 (j % 2) and + 1.
//
// Dequantization: an E2M1 code s e1 e0 m placed as bf16 bits s << 15 | e1 e0 m << 6 is exactly
// the code's value times 2^-126 (e1 e0 = 0 is a bf16 subnormal like E2M1's 0.5 is an E2M1 one),
// so 8 codes of a word become 4 bf16 pairs by a rotate, two merges, and a shift or rotate and a
// mask per pair. One bf16x2 multiply by 2^(126 - kPlacedShift) x the scale then gives the A value
// code x scale x 2^-kPlacedShift exactly, and the epilogue multiplies each score by 2^kPlacedShift
// (scaling by a power of two commutes with every rounding, so the scores are those of code x
// scale). The shift keeps that multiplier a bf16 for every NVFP4 scale and for MXFP4 scale bytes up
// to 136 (scales up to 2^9); larger bytes (and NaN) go in two exact steps: x 2^(126 -
// kPlacedShift), then x the scale. Scale bytes below 16 (scales below 2^-111; the write side's
// floor is byte 111) give bf16 subnormal products and are not exact.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "dsv4/index_topk/index_mma_layout.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"

namespace hdk {
namespace dsv4 {
namespace detail {

constexpr int kWarpgroupHeads = 64;    // n of the product: heads padded to 64 (zero q and weight)
constexpr int kWarpgroupEntries = 64;  // m of the product: entries per tile
constexpr int kWarpgroupSteps = 8;     // k-steps of 16 over the 128 dims

// The key dim that column `col` (0..15) of k-step `step`'s A fragment, and row `col` of its B,
// stand for (wgmma_a_coord gives the thread and register of each column).
HDK_HOST_DEVICE int warpgroup_key_dim(int step, int col) {
  return 32 * ((col & 7) >> 1) + 8 * (step >> 1) + 2 * (step & 1) + (col >> 3) + 4 * (col & 1);
}

// The column k (even) of the B tile that holds dims 8 chunk + j (at k) and 8 chunk + j + 4 (at
// k + 1), j = 0..3: warpgroup_key_dim's inverse on one 16-byte chunk of bf16 q, so that a
// thread can stage a chunk it loaded at once as four bf16 pairs.
HDK_HOST_DEVICE int warpgroup_chunk_pair_k(int chunk, int j) {
  return 16 * (2 * (chunk & 3) + (j >> 1)) + 8 * (j & 1) + 2 * (chunk >> 2);
}

// Byte offset of q[head][dim] (as bf16) in the staged B tile: 64 heads x 128 k in the swizzled
// K-major layout of sparse_decode_layout.h (two 64-column blocks of 8 KiB), k = 16 step + col.
HDK_HOST_DEVICE int warpgroup_query_offset(int head, int k) {
  return operand_chunk_offset(head, k / 8, kWarpgroupHeads) + (k % 8) * 2;
}

HDK_HOST_DEVICE uint32_t rotate_left(uint32_t x, int n) {
#if defined(__CUDA_ARCH__)
  return __funnelshift_l(x, x, n);
#else
  return (x << n) | (x >> (32 - n));  // n in 1 .. 31
#endif
}

// The bits of `ones` where `mask` has a one, those of `zeros` elsewhere: one LOP3 on the device
// (the compiler had made an AND and a LOP3 of the expression).
HDK_HOST_DEVICE uint32_t merge_bits(uint32_t mask, uint32_t ones, uint32_t zeros) {
#if defined(__CUDA_ARCH__)
  uint32_t merged;
  asm("lop3.b32 %0, %1, %2, %3, 0xe4;" : "=r"(merged) : "r"(ones), "r"(zeros), "r"(mask));
  return merged;
#else
  return (ones & mask) | (zeros & ~mask);
#endif
}

// The 8 codes of a little-endian word (code n in bits 4n .. 4n + 3) as 4 bf16 pairs, each value
// the code's times 2^-126: pair i holds code i (low half) and code i + 4 (high half). A code's
// sign bit must land 6 bits above where its magnitude lands, so the word's codes 0, 1, 4, 5 are
// merged with the word rotated by 6 (their sign bits moved next to their magnitudes' targets),
// likewise 2, 3, 6, 7, and each pair is one shift or rotation and mask of its merge.
HDK_HOST_DEVICE void place_e2m1_word(uint32_t word, uint32_t (&pairs)[4]) {
  constexpr uint32_t kPairBits = 0x81c081c0u;  // sign bit 15 and bits 8..6 of each half
  const uint32_t signs = rotate_left(word, 6);
  const uint32_t codes_0145 = merge_bits(0x00770077u, word, signs);
  const uint32_t codes_2367 = merge_bits(0x77007700u, word, signs);
  // Pairs 0 and 1 keep no bit that their rotation would wrap around, so a plain shift places them:
  // the compiler runs it on the FMA pipe (IMAD.SHL), where a rotation takes the ALU pipe, the one
  // the scoring kernels' placement is bound by.
  pairs[0] = (codes_0145 << 6) & kPairBits;
  pairs[1] = (codes_0145 << 2) & kPairBits;
  pairs[2] = rotate_left(codes_2367, 30) & kPairBits;
  pairs[3] = rotate_left(codes_2367, 26) & kPairBits;
}

// A values are code x scale x 2^-kPlacedShift; the epilogue multiplies each entry's score by
// kPlacedScoreFactor = 2^kPlacedShift.
constexpr int kPlacedShift = 8;
constexpr float kPlacedScoreFactor = static_cast<float>(1 << kPlacedShift);

// bf16 bits of 2^(byte - 1 - kPlacedShift) for an MXFP4 scale byte 0 .. 136, twice: the one
// multiplier that turns placed codes into code x 2^(byte - 127 - kPlacedShift).
HDK_HOST_DEVICE uint32_t mxfp4_placed_multiplier(uint32_t byte) {
  const uint32_t bits = (byte + 126u - kPlacedShift) << 7;
  return bits | (bits << 16);
}

// Whether an MXFP4 scale byte needs the two-step multiply (its multiplier is not a bf16).
HDK_HOST_DEVICE bool mxfp4_needs_two_steps(uint32_t byte) {
  return byte > 127u + kPlacedShift + 1u;
}

// The two-step path's first multiplier, 2^(126 - kPlacedShift), twice.
constexpr uint32_t kPlacedFirstStepPair = ((126u - kPlacedShift + 127u) << 7) * 0x10001u;

// bf16 bits of an NVFP4 (E4M3) scale x 2^(126 - kPlacedShift), twice: one multiply for every
// scale (exact: E4M3 has 4 significant bits, and 448 x 2^118 is below bf16's largest). NaN stays
// NaN.
HDK_HOST_DEVICE uint32_t nvfp4_placed_multiplier(float scale) {
  return pack_floats_bf16x2(scale * 0x1p118f, scale * 0x1p118f);
}

// bf16 bits of a decoded scale, twice (exact: UE8M0 is a power of two or NaN, E4M3 has 4
// significant bits).
HDK_HOST_DEVICE uint32_t scale_pair(float scale) {
  return pack_floats_bf16x2(scale, scale);
}

// The 16 A-fragment registers of one entry for this thread: pair 4 w + i of word w, scaled. The
// first two words are dims 32t .. 32t + 15 (`scale_low`), the last two 32t + 16 .. 32t + 31
// (`scale_high`; the same as scale_low for MXFP4). One step: `scale_*` are
// mxfp4_placed_multiplier's or nvfp4_placed_multiplier's; two steps: the first multiplier is
// kPlacedFirstStepPair and `scale_*` are scale_pair's.
template <bool kTwoSteps>
HDK_HOST_DEVICE void entry_fragments(const uint32_t (&words)[4], uint32_t scale_low,
                                     uint32_t scale_high, uint32_t (&registers)[16]) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int w = 0; w < 4; ++w) {
    uint32_t pairs[4];
    place_e2m1_word(words[w], pairs);
    const uint32_t scale = w < 2 ? scale_low : scale_high;
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
    for (int i = 0; i < 4; ++i) {
      uint32_t value = pairs[i];
      if (kTwoSteps) value = mul_bf16x2(value, kPlacedFirstStepPair);
      registers[4 * w + i] = mul_bf16x2(value, scale);
    }
  }
}

// Register `reg` (0..3, wgmma_a_coord's) of k-step `step`'s A fragment, from the thread's two
// entries' registers (rows r and r + 8).
HDK_HOST_DEVICE uint32_t step_fragment(const uint32_t (&upper)[16], const uint32_t (&lower)[16],
                                       int step, int reg) {
  const uint32_t(&entry)[16] = reg % 2 == 0 ? upper : lower;
  return entry[2 * step + reg / 2];
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
