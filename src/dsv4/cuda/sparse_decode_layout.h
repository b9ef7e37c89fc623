// The index math of sparse_decode's tensor-core kernel (sparse_decode_cuda.cu), kept apart from
// the kernel so the CPU tests (tests/dsv4/sparse_decode_layout_test.cpp) can check it without a
// GPU: which lane of a warp holds which element of an mma.sync m16n8k16 fragment (the PTX ISA's
// tables), which shared-memory row and 16-byte chunk each lane hands ldmatrix, the swizzle of
// the bf16 tiles, and the launch plan (head groups x list splits per query row).
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "dsv4/e4m3_bits.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// ---- mma.sync.m16n8k16 (bf16 in, fp32 accumulators): who holds what ----------------------
// A lane's group is lane / 4 and its thread-in-group lane % 4 (the PTX ISA's groupID and
// threadID_in_group).
struct MatrixCoord {
  int row = 0;
  int col = 0;
};

// A (16 x 16, row-major): register `reg` (0..3) of a lane holds two bf16, `half` 0 (low 16 bits)
// and 1; a0: rows 0-7, cols 0-7; a1: rows 8-15, cols 0-7; a2: rows 0-7, cols 8-15; a3: rows 8-15,
// cols 8-15.
HDK_HOST_DEVICE MatrixCoord mma_a_coord(int lane, int reg, int half) {
  return MatrixCoord{lane / 4 + 8 * (reg % 2), 2 * (lane % 4) + half + 8 * (reg / 2)};
}

// B (16 x 8, k x n): b0 holds k 0-7, b1 k 8-15; `row` is k, `col` is n.
HDK_HOST_DEVICE MatrixCoord mma_b_coord(int lane, int reg, int half) {
  return MatrixCoord{2 * (lane % 4) + half + 8 * reg, lane / 4};
}

// C/D (16 x 8, fp32): c0, c1 in row lane / 4, c2, c3 in row lane / 4 + 8.
HDK_HOST_DEVICE MatrixCoord mma_c_coord(int lane, int index) {
  return MatrixCoord{lane / 4 + 8 * (index / 2), 2 * (lane % 4) + index % 2};
}

// ---- ldmatrix.x4 (.b16): what a lane receives ------------------------------------------------
// Lanes 8m .. 8m + 7 name the eight 16-byte rows of matrix m; register m of every lane receives
// from matrix m the pair at row lane / 4, columns 2 (lane % 4) and + 1 — or, with .trans, the pair
// at rows 2 (lane % 4) and + 1 of column lane / 4 (the element `half` of the pair).
HDK_HOST_DEVICE MatrixCoord ldmatrix_received(int lane, int half, bool trans) {
  return trans ? MatrixCoord{2 * (lane % 4) + half, lane / 4}
               : MatrixCoord{lane / 4, 2 * (lane % 4) + half};
}

// ---- Shared-memory tiles --------------------------------------------------------------------
// Every bf16 tile is row-major in 16-byte chunks of 8 values; chunk c of row r is stored at chunk
// c ^ (r % 8), so the eight rows one ldmatrix matrix reads hit eight different bank quads. The
// XOR only permutes chunks within aligned groups of eight, so rows need a multiple of 8 chunks.
HDK_HOST_DEVICE int swizzled_chunk(int row, int chunk) {
  return chunk ^ (row & 7);
}

// The row and (logical) chunk a lane names for ldmatrix.x4 of an A fragment (16 x 16 at rows
// row0.., columns 16 k_step..) of a row-major tile: matrices a0..a3 in mma_a_coord's order.
HDK_HOST_DEVICE MatrixCoord ldmatrix_a_address(int lane, int row0, int k_step) {
  return MatrixCoord{row0 + lane % 8 + 8 * ((lane / 8) % 2), 2 * k_step + lane / 16};
}

// B fragments of two neighbouring n-tiles (n0.., n0 + 8..) at k 16 k_step.., from a tile stored
// n-major (row = n, contiguous k; the entries for S = Q E^T): registers b0, b1 of tile n0, then b0,
// b1 of tile n0 + 8. Without .trans.
HDK_HOST_DEVICE MatrixCoord ldmatrix_b_address(int lane, int n0, int k_step) {
  return MatrixCoord{n0 + lane % 8 + 8 * (lane / 16), 2 * k_step + (lane / 8) % 2};
}

// The same two n-tiles' B fragments from a tile stored k-major (row = k, contiguous n; the
// entries for O = P E), read with .trans: rows k0.., chunk of column n0.. .
HDK_HOST_DEVICE MatrixCoord ldmatrix_bt_address(int lane, int k0, int n0) {
  return MatrixCoord{k0 + lane % 8 + 8 * ((lane / 8) % 2), n0 / 8 + lane / 16};
}

// ---- Launch plan ----------------------------------------------------------------------------
constexpr int kSparseHeadsPerCta = 64;  // 4 head tiles of 16
constexpr int kSparseTile = 64;         // entries per step of the list
constexpr int kSparseMaxCluster = 8;    // the portable cluster size

// One cluster per query row: `groups` CTAs own 64 heads each, `splits` CTAs share the list.
struct SparsePlan {
  int groups = 1;
  int splits = 1;
  HDK_HOST_DEVICE int cluster() const { return groups * splits; }
};

// Whether the tensor-core kernel can serve Hq heads: a multiple of 16 whose head groups fit in
// one cluster (up to 512 heads).
HDK_HOST_DEVICE bool sparse_mma_supports(int64_t heads) {
  return heads > 0 && heads % 16 == 0 &&
         (heads + kSparseHeadsPerCta - 1) / kSparseHeadsPerCta <= kSparseMaxCluster;
}

// Splits the list (doubling, up to the cluster limit and one tile per split) until the grid
// holds about a wave of CTAs: one resident CTA per SM, so a grid of at least 90% of the SMs
// keeps them busy, and more splits only add combine work.
HDK_HOST_DEVICE SparsePlan plan_sparse_decode(int64_t rows, int64_t heads, int64_t list_length,
                                              int sm_count) {
  SparsePlan plan;
  plan.groups = static_cast<int>((heads + kSparseHeadsPerCta - 1) / kSparseHeadsPerCta);
  const int64_t tiles = (list_length + kSparseTile - 1) / kSparseTile;
  while (rows * plan.groups * plan.splits * 10 < int64_t{sm_count} * 9 &&
         plan.cluster() * 2 <= kSparseMaxCluster && plan.splits * 2 <= tiles) {
    plan.splits *= 2;
  }
  return plan;
}

// The tiles [first, last) of the list that split `split` of `splits` walks.
HDK_HOST_DEVICE int64_t split_first_tile(int64_t tiles, int split, int splits) {
  return tiles * split / splits;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
