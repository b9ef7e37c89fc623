// The index math of sparse_decode's tensor-core kernels (sparse_decode_mma_kernel.cu,
// sparse_decode_pipelined_kernel.cu), kept apart from the kernels so the CPU tests
// (tests/dsv4/sparse_decode_layout_test.cpp) can check it without a GPU: which thread of a
// warpgroup holds which element of a wgmma fragment (the PTX ISA's figures), and where each
// element of the swizzled bf16 operand tiles lies and the descriptors the kernels hand wgmma for
// them. Their launch plan is sparse_decode_plan.h.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "dsv4/kv_cache/e4m3_bits.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// ---- wgmma m64nNk16 (bf16 in, fp32 accumulators): who holds what -----------------------------
// `thread` is the thread's index in its warpgroup (0..127): warp thread / 32 owns rows
// 16 (thread / 32) .. + 15 of the 64-row tile (PTX ISA, "Register Fragments", m64nNk16).
struct MatrixCoord {
  int row = 0;
  int col = 0;
};

// Accumulator register `index` (0 .. N / 2 - 1): pairs of columns in 8-column steps, the upper
// pair of each step 8 rows down.
HDK_HOST_DEVICE MatrixCoord wgmma_d_coord(int thread, int index) {
  const int lane = thread % 32;
  return MatrixCoord{16 * (thread / 32) + lane / 4 + 8 * ((index / 2) % 2),
                     8 * (index / 4) + 2 * (lane % 4) + index % 2};
}

// A fragment in registers (64 x 16): register `reg` (0..3) holds two bf16, `half` 0 (low 16
// bits) and 1. The accumulators 8 k .. 8 k + 7 of an m64nN product, packed in pairs, are the A
// fragment of its columns 16 k .. + 15: the kernel's softmax weights go from the score product
// to the output product without leaving the registers.
HDK_HOST_DEVICE MatrixCoord wgmma_a_coord(int thread, int reg, int half) {
  const int lane = thread % 32;
  return MatrixCoord{16 * (thread / 32) + lane / 4 + 8 * (reg % 2),
                     2 * (lane % 4) + half + 8 * (reg / 2)};
}

// ---- Shared-memory operands ------------------------------------------------------------------
// Q (64 heads x 512) and E (a tile of entries x 512) are bf16 tiles stored as 8 column blocks
// of 64 values: block b holds columns 64 b .. + 63 of every row, 128 bytes per row, and 16-byte
// chunk c of row r sits at chunk c ^ (r % 8) of its row. That is the 128-byte swizzle atom
// wgmma reads (8 rows x 128 bytes, aligned to 1024 bytes) both as a K-major operand (rows = heads
// or entries, for S = Q E^T) and as an N-major one (rows = the k of O = P E).
constexpr int kSwizzleAtomBytes = 1024;  // 8 rows of 128 bytes

// Bytes of one 64-column block, and of the whole 512-column tile, for `rows` rows (a multiple
// of 8).
HDK_HOST_DEVICE constexpr int operand_block_bytes(int rows) {
  return rows * 128;
}
HDK_HOST_DEVICE constexpr int operand_bytes(int rows) {
  return 8 * operand_block_bytes(rows);
}

// Byte offset of 16-byte chunk `chunk` (columns 8 chunk .. + 7) of row `row` of a tile of
// `rows` rows.
HDK_HOST_DEVICE int operand_chunk_offset(int row, int chunk, int rows) {
  return (chunk / 8) * operand_block_bytes(rows) + row * 128 + ((chunk % 8) ^ (row % 8)) * 16;
}

// An entry's share (sparse_decode_entry_share.cuh; the pipelined kernel's producer and the
// tensor-core kernel's conversion): lane l of a warp converts chunks share_chunk(l / 8, j),
// j < 16, of an entry (j < 14: FP8 chunks, two per 16 stored bytes; 14, 15: RoPE chunks), and
// stores chunk j at share_chunk_offset, the form the kernel computes (equal to
// operand_chunk_offset(row, share_chunk(quarter, j), rows)): the swizzled position within the
// row takes one of two values, (2 quarter + j % 2) ^ (row % 8).
HDK_HOST_DEVICE int share_chunk(int quarter, int j) {
  return 8 * (j / 2) + 2 * quarter + j % 2;
}
HDK_HOST_DEVICE int share_chunk_offset(int row, int quarter, int j, int rows) {
  return (j / 2) * operand_block_bytes(rows) + row * 128 + ((2 * quarter + j % 2) ^ (row % 8)) * 16;
}

// A row of the pipelined producer's raw pass and of the tensor-core kernel's raw tile: an entry's
// 576 data bytes, its 8 scale bytes, and 8 bytes of padding, so that the 8 entries whose 16-byte
// pieces one load phase reads (lanes 8 q .. 8 q + 7 of a warp, entries 8 w .. 8 w + 7) start 20
// banks apart and never share a bank.
constexpr int kRawEntryStride = 592;

// A wgmma operand relative to its tile: start, leading and stride byte offsets of its descriptor.
struct WgmmaOperand {
  int start = 0;
  int leading = 0;
  int stride = 0;
};

// S = Q E^T, k-step `k_step` (columns 16 k_step .. + 15 of 512) of a K-major tile of `rows`
// rows (Q as A, E as B): 8-row groups 1024 bytes apart, the k-step 32 bytes into its block's
// rows (the hardware swizzles the address it forms, so the offset stays inside the atom). The
// leading offset is unused for swizzled K-major operands (the ISA assumes 1).
HDK_HOST_DEVICE constexpr WgmmaOperand scores_operand(int k_step, int rows) {
  return WgmmaOperand{(k_step / 4) * operand_block_bytes(rows) + (k_step % 4) * 32, 16,
                      kSwizzleAtomBytes};
}

// O = P E for output columns 256 half .. + 255, k-step `k_step` (entries 16 k_step .. + 15) of
// an E tile of `rows` entries, as an N-major B: its 64-column blocks are a block apart (leading
// offset), its 8-entry groups 1024 bytes (stride offset).
HDK_HOST_DEVICE constexpr WgmmaOperand outputs_operand(int half, int k_step, int rows) {
  return WgmmaOperand{4 * half * operand_block_bytes(rows) + k_step * 16 * 128,
                      operand_block_bytes(rows), kSwizzleAtomBytes};
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
