// Who holds what in the tensor-core scoring of hdk::dsv4::index_topk (cuda/index_score_bf16.cuh),
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
// fp32 queries are split as q = hi + lo (both bf16, two mma per step), which leaves at most
// 2^-16 |q| out, about the fp32 accumulation error of the 128 + H terms of a score.
#pragma once

#include <cstdint>

#include "core/bf16_pairs.h"
#include "core/host_device.h"
#include "dsv4/kv_cache/kv_formats.h"
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
// --------------------------------- The scale of dims 32t + 4j .. 32t + 4j + 3 of an entry, from
// the entry's scale bytes.
HDK_HOST_DEVICE float key_lane_scale(KeyFormat format, const uint8_t* entry_scales, int t,
                                     int step) {
  return format == KeyFormat::kMXFP4 ? decode_ue8m0(entry_scales[t])
                                     : decode_e4m3(entry_scales[2 * t + (step >> 2)]);
}

// The bf16 bits of the 8 E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 (0x0000, 0x3F00, 0x3F80,
// 0x3FC0, 0x4000, 0x4040, 0x4080, 0x40C0) as two byte tables of 8 entries, for byte_perm.
constexpr uint32_t kE2m1HighBytes0 = 0x3f3f3f00u, kE2m1HighBytes1 = 0x40404040u;
constexpr uint32_t kE2m1LowBytes0 = 0xc0800000u, kE2m1LowBytes1 = 0xc0804000u;

// The B fragment of k-step `step` for a lane with quad index t: the lane's 16 key bytes as four
// little-endian words (bytes 16t .. 16t + 15 of the entry's data) and the scale of the step's
// dims as bf16x2 (the same value twice). Element i is dim 32t + 4 step + i, nibble 4 step + i of
// the 16 bytes (low nibble first). Each of the 4 codes goes through two 8-entry byte tables (the
// high and low bytes of its magnitude in bf16), gets its sign bit, and is multiplied by the scale
// in bf16: about 12 instructions for 4 values, every step exact.
HDK_HOST_DEVICE void key_fragment(const uint32_t (&words)[4], int step, uint32_t scale2,
                                  uint32_t& b0, uint32_t& b1) {
  const uint32_t chunk = words[step >> 1] >> (16 * (step & 1));  // codes in the low 16 bits
  const uint32_t magnitudes = chunk & 0x7777u;
  uint32_t high = byte_perm(kE2m1HighBytes0, kE2m1HighBytes1, magnitudes);
  const uint32_t low = byte_perm(kE2m1LowBytes0, kE2m1LowBytes1, magnitudes);
  high |= byte_perm(0x8000u, 0u, (chunk >> 3) & 0x1111u);  // 0x80 where the code's sign is set
  b0 = mul_bf16x2(byte_perm(low, high, 0x5140u), scale2);  // values 0 (low half) and 1
  b1 = mul_bf16x2(byte_perm(low, high, 0x7362u), scale2);  // values 2 and 3
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
