// Who holds what in the tensor-core scoring of hdk::dsv4::index_topk (cuda/index_topk_cuda.cu),
// as host-and-device functions so that a CPU test (tests/dsv4/index_mma_layout_test.cpp) can
// emulate a warp's mma.sync with exactly the fragments the kernel builds.
//
// The kernel computes, per row, D[h, e] = sum_d q[h, d] K_e[d] with mma.sync m16n8k16 (bf16 in,
// fp32 accumulate): A = q (16 heads x 16 dims), B = keys (16 dims x 8 entries), C = D (16 heads
// x 8 entries). The dot product does not depend on the order of its terms, so the k dimension of
// each mma is a permutation of the 128 key dims chosen so that each lane reads one contiguous
// 16-byte piece of its key: lane t of a quad holds dims 32t .. 32t + 31 of its entry (bytes
// 16t .. 16t + 15, exactly one MXFP4 scale group, two NVFP4 ones), and k-step j (0..7) takes
// dims 32t + 4j .. 32t + 4j + 3 of it. q is staged in shared memory in that same order.
//
// E2M1 x scale is exact in bf16 (2 significant bits times a power of two for MXFP4, times at most
// 4 significant bits for NVFP4), so keys enter the mma exactly. bf16 queries enter exactly too;
// fp32 queries are split as q = hi + lo (both bf16, two mma per step), which leaves about 2^-17
// of |q| out: below fp32 accumulation error of a 128-term dot product.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"
#include "dsv4/kv_formats.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {

constexpr int kMmaM = 16;  // heads per m-tile
constexpr int kMmaN = 8;   // entries per tile
constexpr int kMmaK = 16;
constexpr int kKeySteps = 8;  // k-steps over the 128 key dims

// ---- The m16n8k16 fragments (PTX ISA, "Matrix Fragments for mma.m16n8k16", .bf16/.f32) -------
// groupID = lane / 4, threadID_in_group = lane % 4. Element i of a lane's fragment: A has 8
// (4 registers of 2 bf16, the lower-numbered element in the low half), B has 4 (2 registers), C
// and D have 4 fp32 registers.
HDK_HOST_DEVICE int mma_a_row(int lane, int i) {
  return (lane >> 2) + 8 * ((i >> 1) & 1);
}
HDK_HOST_DEVICE int mma_a_col(int lane, int i) {
  return 2 * (lane & 3) + (i & 1) + 8 * (i >> 2);
}
HDK_HOST_DEVICE int mma_b_row(int lane, int i) {
  return 2 * (lane & 3) + (i & 1) + 8 * (i >> 1);
}
HDK_HOST_DEVICE int mma_b_col(int lane, int /*i*/) {
  return lane >> 2;
}
HDK_HOST_DEVICE int mma_c_row(int lane, int i) {
  return (lane >> 2) + 8 * (i >> 1);
}
HDK_HOST_DEVICE int mma_c_col(int lane, int i) {
  return 2 * (lane & 3) + (i & 1);
}

// ---- The k permutation ------------------------------------------------------------------------
// The key dim that row k (0..15) of k-step j's B fragment, and column k of its A fragment, stand
// for.
HDK_HOST_DEVICE int index_key_dim(int step, int k) {
  return 32 * ((k & 7) >> 1) + 4 * step + 2 * (k >> 3) + (k & 1);
}

// ---- bf16 ---------------------------------------------------------------------------------------
// Round to nearest even, NaN kept NaN; the same bits on the host and the device.
HDK_HOST_DEVICE uint32_t bf16_rn_bits(float value) {
  const uint32_t b = bits_of(value);
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

// The (hi, lo) bf16 parts of a finite fp32 query value: hi + lo is within 2^-17 |value|.
HDK_HOST_DEVICE void split_bf16(float value, uint32_t& hi, uint32_t& lo) {
  hi = bf16_rn_bits(value);
  lo = bf16_rn_bits(value - bf16_bits_value(hi));
}

// ---- The query (A) fragments, staged in shared memory -------------------------------------------
// Shared layout: for m-tile mt, k-step j, lane: one 16-byte word (4 registers), at word index
// (mt * kKeySteps + j) * 32 + lane; a second such array follows for the lo parts of fp32
// queries. Register r of it holds elements 2r (low half) and 2r + 1.
HDK_HOST_DEVICE int64_t q_fragment_word(int64_t m_tile, int step, int lane) {
  return (m_tile * kKeySteps + step) * 32 + lane;
}
// The head and dim of element i of that word (heads beyond H are zero padding).
HDK_HOST_DEVICE int q_fragment_head(int64_t m_tile, int lane, int i) {
  return static_cast<int>(m_tile) * kMmaM + mma_a_row(lane, i);
}
HDK_HOST_DEVICE int q_fragment_dim(int step, int lane, int i) {
  return index_key_dim(step, mma_a_col(lane, i));
}

// ---- The key (B) fragments, dequantized from the lane's 16 bytes
// --------------------------------- The value of an E2M1 code, without a table (a local array would
// live in local memory on the device): the code's 3 magnitude bits placed at the top of an fp32
// mantissa and exponent make value x 2^-126 (the subnormal case included), which one exact multiply
// undoes.
HDK_HOST_DEVICE float e2m1_value(uint32_t code) {
  const uint32_t bits = ((code & 7u) << 22) | ((code & 8u) << 28);
#if defined(__CUDA_ARCH__)
  const float scaled = __uint_as_float(bits);
#else
  float scaled;
  std::memcpy(&scaled, &bits, sizeof(scaled));
#endif
  return scaled * 8.507059173023462e37f;  // 2^126
}

// The scale of dims 32t + 4j .. 32t + 4j + 3 of an entry, from the entry's scale bytes.
HDK_HOST_DEVICE float key_lane_scale(KeyFormat format, const uint8_t* entry_scales, int t,
                                     int step) {
  return format == KeyFormat::kMXFP4 ? decode_ue8m0(entry_scales[t])
                                     : decode_e4m3(entry_scales[2 * t + (step >> 2)]);
}

// The B fragment of k-step `step` for a lane with quad index t: the lane's 16 key bytes as four
// little-endian words (bytes 16t .. 16t + 15 of the entry's data) and the scale of the step's
// dims. Element i is dim 32t + 4 step + i, nibble 4 step + i of the 16 bytes (low nibble first).
HDK_HOST_DEVICE void key_fragment(const uint32_t (&words)[4], int step, float scale, uint32_t& b0,
                                  uint32_t& b1) {
  const uint32_t chunk = (words[step >> 1] >> (16 * (step & 1))) & 0xffffu;
  float value[4];
  for (int i = 0; i < 4; ++i)
    value[i] = e2m1_value((chunk >> (4 * i)) & 0xfu) * scale;
  b0 = pack_floats_bf16x2(value[0], value[1]);
  b1 = pack_floats_bf16x2(value[2], value[3]);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
