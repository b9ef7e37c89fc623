// Who holds what in index_topk's FP8 tensor-core scoring (cuda/index_score_fp8.cuh,
// score_warpgroup_fp8), as host-and-device functions so that tests/dsv4/index_fp8_layout_test.cpp
// emulates a warpgroup's products with exactly the fragments the kernel builds.
//
// Two forms of q multiply on FP8 tensor cores (wgmma m64n64k32, E4M3 x E4M3, fp32 accumulate):
//  - E4M3 q against kFP8 keys (DeepGEMM's fp8_paged_mqa_logits form): the stored key codes are
//    the A operand as they are, with no conversion; one chain of 4 k-steps covers the 128 dims
//    and the key's fp32 scale multiplies the product. The one-launch kernel loads them into
//    registers (below); the workspace's scoring kernel copies them by cp.async, as they are,
//    into a ring of 64-entry tiles in shared memory (the key ring) and loads the same pieces
//    from there, so both compute the same products.
//  - MXFP4 q against kMXFP4 keys (DeepSeek-V4's reference indexer quantizes q like the keys):
//    every E2M1 value times 2^-6 is an E4M3 value whose code is the E2M1 code's bits moved
//    (e2m1_even_as_scaled_e4m3), so the key codes become E4M3 codes of 2^-6 times their values,
//    and q enters as E4M3 codes of its values times the part of its group scale E4M3 can hold.
//    k-step g is the 32 dims of scale group g and starts from zero: each group's sum of 32
//    products of 2-bit mantissas is an exact multiple of 2^-2 below 2^11 (times a power of two),
//    so the tensor core computes it exactly. Each group's product then gets both scales (exact
//    powers of two) and the groups are added in order, as the CPU backend adds them, and an
//    entry's weighted sum over the heads is multiplied by 2^6 (kMxfp4KeyCodeScale) once.
//
// A (64 entries x 32 bytes a k-step) is in registers: the PTX ISA's fragment of 8-bit types has
// one 32-bit register per 8-row x 16-byte square, thread (lane / 4) of the square's rows holding
// bytes 4 (lane % 4) .. + 3 of its row; register r of k-step s is rows + 8 (r % 2), bytes
// + 16 (r / 2). B (q: 32 bytes x 64 heads a k-step) is K-major in shared memory, 128 bytes a head
// (all 4 k-steps) in the 128-byte swizzle of sparse_decode_layout.h, a tile of 64 heads 8 KiB.
// As in the bf16 kernels the k order is a permutation of the dims chosen for the loads: quad lane
// t holds, per k-step, two 4-byte pieces of each of its two entries. A key-ring tile holds each
// entry's 128 bytes in 16-byte chunks, in the 128-byte swizzle of B, so that the 8 lanes of a
// load phase (two entries, quad lanes t = 0..3 reading chunk 2 t or 2 t + 1) hit distinct banks.
#pragma once

#include <cstdint>

#include "core/float_bits.h"
#include "core/host_device.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"

namespace hdk {
namespace dsv4 {
namespace detail {

constexpr int kFp8Steps = 4;                             // k-steps of 32 over the 128 dims
constexpr int kFp8HeadTile = 64;                         // n of the product
constexpr int kFp8HeadTileBytes = kFp8HeadTile * 128;    // one staged tile of q codes
constexpr int kFp8TileEntries = 64;                      // m of the product
constexpr int kFp8KeyTileBytes = kFp8TileEntries * 128;  // one key-ring tile of E4M3 codes
// Tiles a warpgroup has in its key ring: the one it multiplies and three in flight behind it.
constexpr int kFp8KeyStages = 4;

// The key ring of `warpgroups` warpgroups: kFp8KeyStages tiles of codes each (1024-byte aligned,
// for the swizzle), then as many tiles of 64 fp32 scales, then a barrier a tile, on which a tile
// copied as a whole piece of its page completes its bytes (fp8_key_ring_barriers).
HDK_HOST_DEVICE constexpr int fp8_key_ring_barriers(int warpgroups) {
  return warpgroups * kFp8KeyStages * (kFp8KeyTileBytes + kFp8TileEntries * 4);
}
HDK_HOST_DEVICE constexpr int fp8_key_ring_bytes(int warpgroups) {
  return fp8_key_ring_barriers(warpgroups) + warpgroups * kFp8KeyStages * 8;
}

// Byte offset, in a key-ring tile, of the stored bytes 16 chunk .. + 15 (chunk 0..7) of entry
// `row`.
HDK_HOST_DEVICE int fp8_key_chunk_offset(int row, int chunk) {
  return operand_chunk_offset(row, chunk, kFp8TileEntries);
}

// Byte offset, in an E4M3 key-ring tile, of the stored bytes 16 chunk .. + 15 of entry `row` (the
// E4M3 q's loads): at fp8_key_chunk_offset where thread pairs copied the tile, as stored (128 bytes
// an entry) in a tile copied as a whole piece of its page (index_key_ring_whole_pages). There the
// 8 lanes of a load phase read two entries' same chunks, 2-way bank conflicts.
HDK_HOST_DEVICE int fp8_key_piece_offset(int row, int chunk, bool whole_pages) {
  return whole_pages ? row * 128 + 16 * chunk : fp8_key_chunk_offset(row, chunk);
}

// The MXFP4 key ring (MXFP4 keys under the packed E2M1 q or the exact q): the same stages of 64
// entries, each 64 bytes of codes, then as many tiles of the entries' 4 scale bytes, then a
// barrier a stage (the packed q's tiles copied as whole pages complete on them).
constexpr int kMxfp4KeyTileBytes = kFp8TileEntries * 64;
HDK_HOST_DEVICE constexpr int mxfp4_key_ring_barriers(int warpgroups) {
  return warpgroups * kFp8KeyStages * (kMxfp4KeyTileBytes + kFp8TileEntries * 4);
}
HDK_HOST_DEVICE constexpr int mxfp4_key_ring_bytes(int warpgroups) {
  return mxfp4_key_ring_barriers(warpgroups) + warpgroups * kFp8KeyStages * 8;
}

// Byte offset, in an MXFP4 key-ring tile, of the codes 16 chunk .. + 15 (chunk 0..3: scale group
// `chunk`) of entry `row`. A thread reads word t of each chunk of its two entries (the words the
// one-launch kernel loads, 4 g + t); XORing the chunk with bits 1-2 of the row puts the 32 lanes
// of a warp's load (8 rows, t = 0..3, one group) in 32 distinct banks.
HDK_HOST_DEVICE int mxfp4_key_chunk_offset(int row, int chunk) {
  return row * 64 + ((chunk ^ ((row >> 1) & 3)) * 16);
}

// Byte offset, in an MXFP4 key-ring tile, of word t of entry `row`'s chunk of scale group `group`
// (the packed q's loads): at mxfp4_key_chunk_offset where thread pairs copied the tile, as stored
// in a tile copied as a whole piece of its page (index_key_ring_whole_pages). There a warp's load
// of one group meets 4-way bank conflicts (entries 2 apart share banks), which cost less than
// any way around them measured: reading at the swizzled offsets and putting the words back in
// group order by selects was 0.97-0.99x the thread pairs' tiles where the conflicting loads were
// 0.98-1.05x (H200, packed q, 4-128 rows of 16384-65536 keys).
HDK_HOST_DEVICE int mxfp4_key_word_offset(int row, int group, int t, bool whole_pages) {
  return (whole_pages ? row * 64 + 16 * group : mxfp4_key_chunk_offset(row, group)) + 4 * t;
}

// The key dim that byte `k` (0..31) of k-step `step` stands for, E4M3 form: quad lane t loads
// its entry's 32 contiguous bytes 32t .. 32t + 31 (two 16-byte loads) and gives words 2 step and
// 2 step + 1 of them to k-step `step`.
HDK_HOST_DEVICE int fp8_key_dim(int step, int k) {
  return 32 * ((k % 16) / 4) + 8 * step + 4 * (k / 16) + k % 4;
}

// The same for the MXFP4 form: k-step g is scale group g; quad lane t loads word 4g + t of the
// key's 64 bytes (dims 32g + 8t .. + 7), its even codes for bytes 4t .. + 3, its odd ones for
// bytes 16 + 4t .. + 3.
HDK_HOST_DEVICE int mxfp4_key_dim(int step, int k) {
  return 32 * step + 8 * ((k % 16) / 4) + 2 * (k % 4) + k / 16;
}

// Byte offset of staged chunk `chunk` (bytes 16 chunk .. + 15 of the head's 128, i.e. k-step
// chunk / 2, bytes 16 (chunk % 2) .. of it) of head `head` among tiles of 64 heads.
HDK_HOST_DEVICE int fp8_query_chunk_offset(int head, int chunk) {
  return (head / kFp8HeadTile) * kFp8HeadTileBytes +
         operand_chunk_offset(head % kFp8HeadTile, chunk, kFp8HeadTile);
}

// E4M3 form: word i (0..3) of staged chunk `chunk` is q's word 8 i + chunk (dims 32 i + 4 chunk
// .. + 3), fp8_key_dim's inverse on the chunk.
HDK_HOST_DEVICE int fp8_chunk_query_word(int chunk, int i) {
  return 8 * i + chunk;
}

// MXFP4 form: word i of staged chunk `chunk` is the even (chunk % 2 = 0) or odd codes of packed
// q's word 4 (chunk / 2) + i, its byte b code mxfp4_chunk_query_code(chunk, b) of that word.
HDK_HOST_DEVICE int mxfp4_chunk_query_word(int chunk, int i) {
  return 4 * (chunk / 2) + i;
}
HDK_HOST_DEVICE int mxfp4_chunk_query_code(int chunk, int b) {
  return 2 * b + chunk % 2;
}

// The E4M3 codes of 2^-6 times the values of the even codes (e2m1_even_as_scaled_e4m3) or the odd
// ones of 8 E2M1 codes (code n in bits 4n .. 4n + 3 of `word`): byte i of the result from code
// 2i or 2i + 1, its sign moved to bit 7 and its three magnitude bits to bits 2..4 (-0 stays -0).
// An E4M3 code of exponent field e and mantissa m there is 2^(e - 7) (1 + m / 2) = 2^-6 x
// 2^(e - 1) (1 + m / 2), and with e = 0 2^-6 (m / 2): E2M1's value of the same bits times 2^-6,
// every value exact. Three or four instructions a word of A where a table lookup took six.
HDK_HOST_DEVICE uint32_t e2m1_even_as_scaled_e4m3(uint32_t word) {
  return ((word << 4) & 0x80808080u) | ((word << 2) & 0x1c1c1c1cu);
}
HDK_HOST_DEVICE uint32_t e2m1_odd_as_scaled_e4m3(uint32_t word) {
  return (word & 0x80808080u) | ((word >> 2) & 0x1c1c1c1cu);
}
// What an entry's weighted sum over the heads is multiplied by, once, in the MXFP4 form: its key
// codes hold 2^-6 times their values, and multiplying by a power of two commutes with every
// rounding of the sum's products and additions in fp32's normal range.
constexpr float kMxfp4KeyCodeScale = 64.0f;

// A register `reg` (0..3) of k-step `step`, E4M3 form, from the thread's two entries' 8 words
// (rows r and r + 8): word 2 step (bytes 4t ..) or 2 step + 1 (bytes 16 + 4t ..).
HDK_HOST_DEVICE uint32_t fp8_step_fragment(const uint32_t (&upper)[8], const uint32_t (&lower)[8],
                                           int step, int reg) {
  return (reg % 2 == 0 ? upper : lower)[2 * step + reg / 2];
}

// The same for the MXFP4 form, from each entry's 4 words (word g = the key's word 4g + t): 2^-6
// times the values (kMxfp4KeyCodeScale).
HDK_HOST_DEVICE uint32_t mxfp4_step_fragment(const uint32_t (&upper)[4], const uint32_t (&lower)[4],
                                             int step, int reg) {
  const uint32_t word = (reg % 2 == 0 ? upper : lower)[step];
  return reg / 2 == 0 ? e2m1_even_as_scaled_e4m3(word) : e2m1_odd_as_scaled_e4m3(word);
}

// An MXFP4 key's scale of group g from its 4 UE8M0 bytes (group 0 in the low bits): decode_ue8m0's
// value without its branches, which the FP8 kernels' epilogue had taken as eight branch regions a
// tile. The byte is the float's exponent field, and bytes 0 (2^-127, a subnormal) and 255 (NaN)
// also set the mantissa's top bit.
HDK_HOST_DEVICE float mxfp4_group_scale(uint32_t scales, int g) {
  const uint32_t byte = (scales >> (8 * g)) & 0xffu;
  const uint32_t top_mantissa_bit = byte == 0u || byte == 0xffu ? 0x00400000u : 0u;
  return hdk::detail::float_of_bits((byte << 23) | top_mantissa_bit);
}

// How much of an MXFP4 q group's scale exponent (byte - 127) its E4M3 codes hold: E2M1 values
// times 2^e are exact E4M3 values for e in -8 .. 6 (0.5 x 2^-8 is E4M3's least subnormal,
// 6 x 2^6 = 384 below its 448). The rest, 2^(exponent - folded), multiplies the group's sums.
HDK_HOST_DEVICE int folded_query_exponent(int exponent) {
  return exponent < -8 ? -8 : exponent > 6 ? 6 : exponent;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
