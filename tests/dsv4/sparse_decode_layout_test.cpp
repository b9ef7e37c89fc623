// The index math of sparse_decode's tensor-core kernel (src/dsv4/cuda/sparse_decode_layout.h),
// checked on the CPU so it holds before any GPU runs the kernel:
// - the mma.sync m16n8k16 fragment ownership against entries of the PTX ISA's tables, and as
//   bijections;
// - one warp emulated end to end: shared-memory tiles written with the kernel's swizzle, ldmatrix
//   (plain and .trans) emulated from the PTX ISA's description with the kernel's lane addresses,
//   the mma emulated with the ownership functions; the products S = Q E^T and O = P E (each a
//   16 x 16 x 8 product per n-tile) must equal plain matmuls;
// - the bank pattern of every ldmatrix the kernel issues (no conflicts);
// - the FP8 -> bf16 bit trick and the NaN detector against the write side's decoders, for all
//   codes and the scales the writer produces;
// - the launch plan.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "dsv4/cuda/sparse_decode_layout.h"
#include "dsv4/kv_formats.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace testing {
namespace {

using dsv4::detail::MatrixCoord;

// ---- fragment ownership ------------------------------------------------------------------------

TEST(SparseDecodeLayout, FragmentOwnershipMatchesThePtxTables) {
  using dsv4::detail::mma_a_coord;
  using dsv4::detail::mma_b_coord;
  using dsv4::detail::mma_c_coord;
  // Entries read off the PTX ISA's figures for mma.m16n8k16 (.bf16 A, B; .f32 C).
  struct Case {
    int lane, reg, half, row, col;
  };
  for (const Case& c : {Case{0, 0, 0, 0, 0}, Case{0, 0, 1, 0, 1}, Case{5, 1, 0, 9, 2},
                        Case{5, 2, 1, 1, 11}, Case{31, 3, 1, 15, 15}, Case{30, 3, 0, 15, 12}}) {
    const MatrixCoord a = mma_a_coord(c.lane, c.reg, c.half);
    EXPECT_EQ(a.row, c.row) << "A lane " << c.lane << " reg " << c.reg << " half " << c.half;
    EXPECT_EQ(a.col, c.col) << "A lane " << c.lane << " reg " << c.reg << " half " << c.half;
  }
  for (const Case& c : {Case{0, 0, 0, 0, 0}, Case{0, 0, 1, 1, 0}, Case{6, 1, 0, 12, 1},
                        Case{31, 1, 1, 15, 7}, Case{9, 0, 1, 3, 2}}) {
    const MatrixCoord b = mma_b_coord(c.lane, c.reg, c.half);
    EXPECT_EQ(b.row, c.row) << "B lane " << c.lane << " reg " << c.reg;  // k
    EXPECT_EQ(b.col, c.col) << "B lane " << c.lane << " reg " << c.reg;  // n
  }
  for (const Case& c : {Case{0, 0, 0, 0, 0}, Case{0, 1, 0, 0, 1}, Case{7, 3, 0, 9, 7},
                        Case{29, 2, 0, 15, 2}, Case{4, 0, 0, 1, 0}}) {
    const MatrixCoord d = mma_c_coord(c.lane, c.reg);
    EXPECT_EQ(d.row, c.row) << "C lane " << c.lane << " index " << c.reg;
    EXPECT_EQ(d.col, c.col) << "C lane " << c.lane << " index " << c.reg;
  }
  // Every element owned exactly once.
  std::set<std::pair<int, int>> a_seen, b_seen, c_seen;
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg) {
      for (int half = 0; half < 2; ++half) {
        const MatrixCoord a = mma_a_coord(lane, reg, half);
        EXPECT_TRUE(a_seen.insert({a.row, a.col}).second);
        EXPECT_TRUE(a.row >= 0 && a.row < 16 && a.col >= 0 && a.col < 16);
        if (reg < 2) {
          const MatrixCoord b = mma_b_coord(lane, reg, half);
          EXPECT_TRUE(b_seen.insert({b.row, b.col}).second);
          EXPECT_TRUE(b.row >= 0 && b.row < 16 && b.col >= 0 && b.col < 8);
        }
      }
      const MatrixCoord c = mma_c_coord(lane, reg);
      EXPECT_TRUE(c_seen.insert({c.row, c.col}).second);
      EXPECT_TRUE(c.row >= 0 && c.row < 16 && c.col >= 0 && c.col < 8);
    }
  }
  EXPECT_EQ(a_seen.size(), 256u);
  EXPECT_EQ(b_seen.size(), 128u);
  EXPECT_EQ(c_seen.size(), 128u);
}

// ---- one warp, emulated ------------------------------------------------------------------------

// A swizzled bf16 tile as the kernel stores it (values kept as floats; only positions matter).
struct Tile {
  int rows = 0, chunks_per_row = 0;
  std::vector<float> slots;  // physical layout: [row][physical chunk][8]

  Tile(int r, int chunks) : rows(r), chunks_per_row(chunks), slots(r * chunks * 8, NAN) {}
  int physical(int row, int col) const {
    return (row * chunks_per_row + dsv4::detail::swizzled_chunk(row, col / 8)) * 8 + col % 8;
  }
  void set(int row, int col, float v) { slots[physical(row, col)] = v; }
  // The byte offset the kernel computes for (row, logical chunk): tile_address().
  int address(MatrixCoord at) const {
    return (at.row * chunks_per_row + dsv4::detail::swizzled_chunk(at.row, at.col)) * 16;
  }
  float at_byte(int byte_offset, int element) const { return slots[byte_offset / 2 + element]; }
};

// ldmatrix.x4 as the PTX ISA describes it: lanes 8m..8m+7 give the row addresses of matrix m;
// every lane receives, per matrix, the pair ldmatrix_received() names. out[lane][m][half].
using Fragments = std::vector<std::vector<std::vector<float>>>;
Fragments emulate_ldmatrix(const Tile& tile, const std::vector<MatrixCoord>& lane_address,
                           bool trans) {
  Fragments out(32, std::vector<std::vector<float>>(4, std::vector<float>(2)));
  for (int lane = 0; lane < 32; ++lane) {
    for (int m = 0; m < 4; ++m) {
      for (int half = 0; half < 2; ++half) {
        const MatrixCoord e = dsv4::detail::ldmatrix_received(lane, half, trans);
        const int row_address = tile.address(lane_address[8 * m + e.row]);
        out[lane][m][half] = tile.at_byte(row_address, e.col);
      }
    }
  }
  return out;
}

// mma.m16n8k16 from fragments: A from registers a[lane][0..3], B from b[lane][0..1]; returns the
// 16 x 8 product as the C fragments place it, read back into a matrix.
std::vector<float> emulate_mma(const Fragments& a, const Fragments& b, int b_first_reg) {
  float A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    for (int reg = 0; reg < 4; ++reg) {
      for (int half = 0; half < 2; ++half) {
        const MatrixCoord at = dsv4::detail::mma_a_coord(lane, reg, half);
        A[at.row][at.col] = a[lane][reg][half];
        if (reg < 2) {
          const MatrixCoord bt = dsv4::detail::mma_b_coord(lane, reg, half);
          B[bt.row][bt.col] = b[lane][b_first_reg + reg][half];
        }
      }
    }
  }
  float c_fragments[32][4];
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const MatrixCoord ct = dsv4::detail::mma_c_coord(lane, i);
      float sum = 0.0f;
      for (int k = 0; k < 16; ++k)
        sum += A[ct.row][k] * B[k][ct.col];
      c_fragments[lane][i] = sum;
    }
  }
  std::vector<float> c(16 * 8, NAN);
  for (int lane = 0; lane < 32; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const MatrixCoord ct = dsv4::detail::mma_c_coord(lane, i);
      c[ct.row * 8 + ct.col] = c_fragments[lane][i];
    }
  }
  return c;
}

float small_integer(std::mt19937& rng) {
  return static_cast<float>(static_cast<int>(rng() % 9) - 4);  // exact sums
}

// S = Q E^T for one head tile (rows 16 head_tile..) and two n-tiles (entries n0..n0+15), over
// two k-steps, with 512-wide rows as in the kernel.
TEST(SparseDecodeLayout, WarpScoresMatchAPlainMatmul) {
  std::mt19937 rng(5);
  constexpr int kWidth = 512, kChunks = kWidth / 8;
  Tile q(64, kChunks), e(64, kChunks);
  std::vector<float> Q(64 * kWidth), E(64 * kWidth);
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < kWidth; ++c) {
      Q[r * kWidth + c] = small_integer(rng);
      E[r * kWidth + c] = small_integer(rng);
      q.set(r, c, Q[r * kWidth + c]);
      e.set(r, c, E[r * kWidth + c]);
    }
  }
  for (int head_tile : {0, 3}) {
    for (int n0 : {0, 16, 48}) {
      std::vector<float> got(16 * 16, 0.0f);
      for (int k_step : {0, 1, 31}) {
        std::vector<MatrixCoord> a_addr(32), b_addr(32);
        for (int lane = 0; lane < 32; ++lane) {
          a_addr[lane] = dsv4::detail::ldmatrix_a_address(lane, 16 * head_tile, k_step);
          b_addr[lane] = dsv4::detail::ldmatrix_b_address(lane, n0, k_step);
        }
        const Fragments a = emulate_ldmatrix(q, a_addr, false);
        const Fragments b = emulate_ldmatrix(e, b_addr, false);
        for (int tile = 0; tile < 2; ++tile) {
          const std::vector<float> c = emulate_mma(a, b, 2 * tile);
          for (int r = 0; r < 16; ++r) {
            for (int col = 0; col < 8; ++col)
              got[r * 16 + 8 * tile + col] += c[r * 8 + col];
          }
        }
      }
      for (int r = 0; r < 16; ++r) {
        for (int col = 0; col < 16; ++col) {
          float want = 0.0f;
          for (int k_step : {0, 1, 31}) {
            for (int k = 16 * k_step; k < 16 * k_step + 16; ++k)
              want += Q[(16 * head_tile + r) * kWidth + k] * E[(n0 + col) * kWidth + k];
          }
          ASSERT_EQ(got[r * 16 + col], want)
              << "head tile " << head_tile << " n0 " << n0 << " row " << r << " entry " << col;
        }
      }
    }
  }
}

// O = P E for one head tile and two n-tiles of output columns (n0..n0+15), over every k-step of
// a 64-entry tile: P is [64 heads][64 entries] (8 chunks per row), E [64 entries][512].
TEST(SparseDecodeLayout, WarpOutputsMatchAPlainMatmul) {
  std::mt19937 rng(6);
  constexpr int kWidth = 512;
  Tile p(64, 8), e(64, kWidth / 8);
  std::vector<float> P(64 * 64), E(64 * kWidth);
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < 64; ++c) {
      P[r * 64 + c] = small_integer(rng);
      p.set(r, c, P[r * 64 + c]);
    }
    for (int c = 0; c < kWidth; ++c) {
      E[r * kWidth + c] = small_integer(rng);
      e.set(r, c, E[r * kWidth + c]);
    }
  }
  for (int head_tile : {1, 2}) {
    for (int n0 : {0, 16, 256 + 16 * 15}) {
      std::vector<float> got(16 * 16, 0.0f);
      for (int k_step = 0; k_step < 4; ++k_step) {
        std::vector<MatrixCoord> a_addr(32), b_addr(32);
        for (int lane = 0; lane < 32; ++lane) {
          a_addr[lane] = dsv4::detail::ldmatrix_a_address(lane, 16 * head_tile, k_step);
          b_addr[lane] = dsv4::detail::ldmatrix_bt_address(lane, 16 * k_step, n0);
        }
        const Fragments a = emulate_ldmatrix(p, a_addr, false);
        const Fragments b = emulate_ldmatrix(e, b_addr, true);
        for (int tile = 0; tile < 2; ++tile) {
          const std::vector<float> c = emulate_mma(a, b, 2 * tile);
          for (int r = 0; r < 16; ++r) {
            for (int col = 0; col < 8; ++col)
              got[r * 16 + 8 * tile + col] += c[r * 8 + col];
          }
        }
      }
      for (int r = 0; r < 16; ++r) {
        for (int col = 0; col < 16; ++col) {
          float want = 0.0f;
          for (int k = 0; k < 64; ++k)
            want += P[(16 * head_tile + r) * 64 + k] * E[k * kWidth + n0 + col];
          ASSERT_EQ(got[r * 16 + col], want)
              << "head tile " << head_tile << " n0 " << n0 << " row " << r << " column " << col;
        }
      }
    }
  }
}

// Each 8-lane phase of an ldmatrix reads eight 16-byte rows; with the swizzle they fall in eight
// different 16-byte bank groups (byte address / 16 mod 8), so no phase conflicts.
TEST(SparseDecodeLayout, LdmatrixPhasesAreConflictFree) {
  auto check = [](const std::vector<MatrixCoord>& addresses, int chunks_per_row, const char* what) {
    for (int m = 0; m < 4; ++m) {
      std::set<int> groups;
      for (int i = 0; i < 8; ++i) {
        const MatrixCoord at = addresses[8 * m + i];
        const int byte =
            (at.row * chunks_per_row + dsv4::detail::swizzled_chunk(at.row, at.col)) * 16;
        groups.insert((byte / 16) % 8);
      }
      EXPECT_EQ(groups.size(), 8u) << what << " matrix " << m;
    }
  };
  for (int k_step = 0; k_step < 32; ++k_step) {
    std::vector<MatrixCoord> a(32), b(32), pa(32), bt(32);
    for (int lane = 0; lane < 32; ++lane) {
      a[lane] = dsv4::detail::ldmatrix_a_address(lane, 16 * (k_step % 4), k_step);
      b[lane] = dsv4::detail::ldmatrix_b_address(lane, 16 * (k_step % 4), k_step);
      pa[lane] = dsv4::detail::ldmatrix_a_address(lane, 16 * (k_step % 4), k_step % 4);
      bt[lane] = dsv4::detail::ldmatrix_bt_address(lane, 16 * (k_step % 4), 16 * k_step);
    }
    check(a, 64, "Q");
    check(b, 64, "E (scores)");
    check(pa, 8, "P");
    check(bt, 64, "E (outputs)");
  }
  // The swizzle permutes the chunks of every row.
  for (int row = 0; row < 16; ++row) {
    std::set<int> chunks;
    for (int c = 0; c < 64; ++c)
      chunks.insert(dsv4::detail::swizzled_chunk(row, c));
    EXPECT_EQ(chunks.size(), 64u);
    EXPECT_EQ(*chunks.rbegin(), 63);
  }
}

// ---- FP8 to bf16 -------------------------------------------------------------------------------

float bf16_bits_value(uint32_t bits16) {
  const uint32_t bits = bits16 << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

TEST(SparseDecodeLayout, SpreadPairConversionMatchesThePairOne) {
  for (uint32_t word = 0; word < 65536; ++word) {
    const uint32_t spread = (word & 0xffu) | ((word & 0xff00u) << 8);
    ASSERT_EQ(dsv4::detail::e4m3_spread_pair_as_scaled_bf16(spread),
              dsv4::detail::e4m3_pair_as_scaled_bf16(word))
        << word;
  }
}

TEST(SparseDecodeLayout, Fp8PairsBecomeExactScaledBf16) {
  using dsv4::detail::decode_e4m3;
  using dsv4::detail::decode_ue8m0;
  // Writer scales: 2^e with e = fp8_scale_exponent(amax) for amax >= 1e-4 (byte >= 105), up to
  // byte 254; also byte 0 and small ones, which the conversion handles too.
  const uint32_t scale_bytes[] = {0, 1, 100, 105, 120, 127, 128, 140, 200, 254};
  for (uint32_t scale_byte : scale_bytes) {
    const float up = bf16_bits_value(dsv4::detail::kBf16TwoTo120);
    const float scale = bf16_bits_value(dsv4::detail::ue8m0_as_bf16(scale_byte));
    ASSERT_EQ(scale, decode_ue8m0(static_cast<uint8_t>(scale_byte))) << scale_byte;
    for (uint32_t lo = 0; lo < 256; ++lo) {
      for (uint32_t hi : {lo, 255u - lo, (lo * 37u) % 256u}) {
        const uint32_t word = lo | (hi << 8) | 0xabcd0000u;  // upper bytes must be ignored
        const uint32_t pair = dsv4::detail::e4m3_pair_as_scaled_bf16(word);
        const uint32_t codes[2] = {lo, hi};
        for (int half = 0; half < 2; ++half) {
          if ((codes[half] & 0x7f) == 0x7f) continue;  // NaN: the kernel's slow path
          const float raw = bf16_bits_value((pair >> (16 * half)) & 0xffffu);
          // The kernel's two bf16 multiplications, each exact: check in double that nothing
          // rounds (the products have at most 4 significant bits and stay in bf16's range).
          const double step1 = static_cast<double>(raw) * static_cast<double>(up);
          const double step2 = step1 * static_cast<double>(scale);
          ASSERT_EQ(static_cast<double>(static_cast<float>(step1)), step1);
          ASSERT_TRUE(std::fabs(step1) <= 448.0);
          const double want = static_cast<double>(decode_e4m3(static_cast<uint8_t>(codes[half]))) *
                              static_cast<double>(decode_ue8m0(static_cast<uint8_t>(scale_byte)));
          ASSERT_EQ(step2, want) << "code " << codes[half] << " scale " << scale_byte;
          if (want == 0.0) {
            ASSERT_EQ(std::signbit(step2), (codes[half] & 0x80) != 0) << "signed zero";
          }
          if (scale_byte >= 105 && want != 0.0) {
            // Normal in bf16 (so the hardware multiply never sees a subnormal result).
            ASSERT_GE(std::fabs(step2), std::ldexp(1.0, -126));
          }
        }
      }
    }
  }
}

TEST(SparseDecodeLayout, NanCodesAreDetected) {
  std::mt19937 rng(7);
  auto brute = [](uint32_t word) {
    for (int b = 0; b < 4; ++b) {
      if (((word >> (8 * b)) & 0x7f) == 0x7f) return true;
    }
    return false;
  };
  for (int b = 0; b < 4; ++b) {
    for (uint32_t code = 0; code < 256; ++code) {
      const uint32_t word = (code << (8 * b)) | (0x01020304u & ~(0xffu << (8 * b)));
      ASSERT_EQ(dsv4::detail::any_e4m3_nan(word), brute(word)) << std::hex << word;
    }
  }
  for (int i = 0; i < 200000; ++i) {
    uint32_t word = static_cast<uint32_t>(rng());
    if (i % 2) word |= 0x7fu << (8 * (i % 4));
    ASSERT_EQ(dsv4::detail::any_e4m3_nan(word), brute(word)) << std::hex << word;
  }
}

// ---- launch plan -------------------------------------------------------------------------------

TEST(SparseDecodeLayout, PlanFillsTheGpuWithinOneCluster) {
  using dsv4::detail::plan_sparse_decode;
  struct Case {
    int64_t rows, heads, length;
    int groups, splits;
  };
  for (const Case& c :
       {Case{32, 64, 640, 1, 4}, Case{32, 128, 1152, 2, 2}, Case{128, 64, 640, 1, 1},
        Case{128, 128, 4224, 2, 1}, Case{1, 128, 4224, 2, 4}, Case{1, 64, 4224, 1, 8},
        Case{1, 64, 100, 1, 2}, Case{4, 512, 4224, 8, 1}, Case{1, 16, 0, 1, 1}}) {
    const dsv4::detail::SparsePlan plan = plan_sparse_decode(c.rows, c.heads, c.length, 132);
    EXPECT_EQ(plan.groups, c.groups) << c.rows << " " << c.heads << " " << c.length;
    EXPECT_EQ(plan.splits, c.splits) << c.rows << " " << c.heads << " " << c.length;
  }
  for (int64_t rows : {1, 2, 7, 33, 200}) {
    for (int64_t heads : {16, 48, 64, 128, 320, 512}) {
      for (int64_t length : {0, 1, 64, 65, 700, 4224, 9000}) {
        const dsv4::detail::SparsePlan plan = plan_sparse_decode(rows, heads, length, 132);
        EXPECT_LE(plan.cluster(), dsv4::detail::kSparseMaxCluster);
        EXPECT_EQ(plan.groups * 64 >= heads && (plan.groups - 1) * 64 < heads, true);
        EXPECT_EQ(plan.splits & (plan.splits - 1), 0);
        EXPECT_EQ(dsv4::kHeadDim % (4 * plan.splits), 0);  // column slices of float4
        // The splits' tiles partition the list.
        const int64_t tiles = (length + 63) / 64;
        int64_t covered = 0;
        for (int s = 0; s < plan.splits; ++s) {
          const int64_t first = dsv4::detail::split_first_tile(tiles, s, plan.splits);
          const int64_t last = dsv4::detail::split_first_tile(tiles, s + 1, plan.splits);
          EXPECT_EQ(first, covered);
          EXPECT_LE(first, last);
          covered = last;
        }
        EXPECT_EQ(covered, tiles);
      }
    }
  }
  EXPECT_TRUE(dsv4::detail::sparse_mma_supports(16));
  EXPECT_TRUE(dsv4::detail::sparse_mma_supports(512));
  EXPECT_FALSE(dsv4::detail::sparse_mma_supports(8));
  EXPECT_FALSE(dsv4::detail::sparse_mma_supports(17));
  EXPECT_FALSE(dsv4::detail::sparse_mma_supports(528));
}

}  // namespace
}  // namespace testing
}  // namespace hdk
