// The index math of sparse_decode's tensor-core kernel
// (src/dsv4/sparse_decode/cuda/sparse_decode_layout.h), checked on the CPU so it holds before any
// GPU runs the kernel:
// - the wgmma m64nNk16 fragment ownership against entries of the PTX ISA's figures, and as
//   bijections; the score accumulators as the output product's A fragments;
// - the operand tiles: every chunk stored once, bank-conflict-free stores, and both warpgroups
//   emulated end to end: each element read where the PTX ISA's canonical 128-byte-swizzled
//   layouts put it for the kernel's descriptors (K-major for S = Q E^T, N-major for O = P E);
//   the products must equal plain matmuls;
// - the FP8 -> bf16 bit trick and the NaN detector against the write side's decoders, for all
//   codes and the scales the writer produces.
// The launch plan's tests are sparse_decode_plan_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <utility>
#include <vector>

#include "dsv4/kv_cache/e4m3_bits.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace testing {
namespace {

using dsv4::detail::MatrixCoord;

// ---- fragment ownership ------------------------------------------------------------------------

TEST(SparseDecodeLayout, FragmentOwnershipMatchesThePtxFigures) {
  using dsv4::detail::wgmma_a_coord;
  using dsv4::detail::wgmma_d_coord;
  // Entries read off the PTX ISA's figures for wgmma .m64nNk16 (.bf16 A in registers, .f32 D).
  struct Case {
    int thread, reg, half, row, col;
  };
  for (const Case& c :
       {Case{0, 0, 0, 0, 0}, Case{0, 0, 1, 0, 1}, Case{0, 1, 0, 8, 0}, Case{0, 2, 0, 0, 8},
        Case{5, 3, 1, 9, 11}, Case{37, 0, 0, 17, 2}, Case{127, 3, 1, 63, 15}}) {
    const MatrixCoord a = wgmma_a_coord(c.thread, c.reg, c.half);
    EXPECT_EQ(a.row, c.row) << "A thread " << c.thread << " reg " << c.reg << " half " << c.half;
    EXPECT_EQ(a.col, c.col) << "A thread " << c.thread << " reg " << c.reg << " half " << c.half;
  }
  // D: {thread, index, -, row, col}.
  for (const Case& c :
       {Case{0, 0, 0, 0, 0}, Case{0, 1, 0, 0, 1}, Case{0, 2, 0, 8, 0}, Case{0, 4, 0, 0, 8},
        Case{6, 7, 0, 9, 13}, Case{33, 0, 0, 16, 2}, Case{127, 127, 0, 63, 255}}) {
    const MatrixCoord d = wgmma_d_coord(c.thread, c.reg);
    EXPECT_EQ(d.row, c.row) << "D thread " << c.thread << " index " << c.reg;
    EXPECT_EQ(d.col, c.col) << "D thread " << c.thread << " index " << c.reg;
  }
  // Every element owned exactly once: A 64 x 16, D 64 x 64 (32 registers) and 64 x 256 (128).
  std::set<std::pair<int, int>> a_seen, d64_seen, d256_seen;
  for (int thread = 0; thread < 128; ++thread) {
    for (int reg = 0; reg < 4; ++reg) {
      for (int half = 0; half < 2; ++half) {
        const MatrixCoord a = wgmma_a_coord(thread, reg, half);
        EXPECT_TRUE(a_seen.insert({a.row, a.col}).second);
        EXPECT_TRUE(a.row >= 0 && a.row < 64 && a.col >= 0 && a.col < 16);
      }
    }
    for (int i = 0; i < 128; ++i) {
      const MatrixCoord d = wgmma_d_coord(thread, i);
      EXPECT_TRUE(d.row >= 0 && d.row < 64 && d.col >= 0 && d.col < 256);
      EXPECT_TRUE(d256_seen.insert({d.row, d.col}).second);
      if (i < 32) {
        EXPECT_TRUE(d64_seen.insert({d.row, d.col}).second);
        EXPECT_LT(d.col, 64);
      }
    }
  }
  EXPECT_EQ(a_seen.size(), 64u * 16u);
  EXPECT_EQ(d64_seen.size(), 64u * 64u);
  EXPECT_EQ(d256_seen.size(), 64u * 256u);
}

// The kernel packs score accumulators 8 k .. 8 k + 7 into the A fragment of O = P E's k-step k.
TEST(SparseDecodeLayout, ScoreAccumulatorsAreTheOutputProductsAFragments) {
  for (int thread = 0; thread < 128; ++thread) {
    for (int k = 0; k < 4; ++k) {
      for (int reg = 0; reg < 4; ++reg) {
        for (int half = 0; half < 2; ++half) {
          const MatrixCoord a = dsv4::detail::wgmma_a_coord(thread, reg, half);
          const MatrixCoord d = dsv4::detail::wgmma_d_coord(thread, 8 * k + 2 * reg + half);
          ASSERT_EQ(a.row, d.row) << thread << " " << k << " " << reg << " " << half;
          ASSERT_EQ(16 * k + a.col, d.col) << thread << " " << k << " " << reg << " " << half;
        }
      }
    }
  }
}

// ---- the operand tiles against wgmma's view of them -------------------------------------------

float small_integer(std::mt19937& rng) {
  return static_cast<float>(static_cast<int>(rng() % 9) - 4);  // exact sums
}

// The 128-byte swizzle (Swizzle<3,4,3>): address bits 4..6 XOR bits 7..9.
int swizzle_128(int byte) {
  return byte ^ (((byte >> 7) & 7) << 4);
}

// Where wgmma reads element (row, k) of a K-major operand (PTX ISA, canonical layouts: 128-byte
// swizzling, ((8, m), (T, 2k)) : ((8T, SBO), (1, T)), T = 8 bf16), and element (k, n) of an
// N-major one (((T, 8, m), (8, k)) : ((1, T, LBO), (8T, SBO))). Offsets relative to a tile that
// starts on a 1024-byte boundary.
int k_major_byte(const dsv4::detail::WgmmaOperand& op, int row, int k) {
  return swizzle_128(op.start + (row / 8) * op.stride + (row % 8) * 128 + 2 * k);
}
int n_major_byte(const dsv4::detail::WgmmaOperand& op, int k, int n) {
  return swizzle_128(op.start + (n / 64) * op.leading + (n % 64) * 2 + (k / 8) * op.stride +
                     (k % 8) * 128);
}

// An operand tile of `rows` rows as the kernel writes it (operand_chunk_offset), values kept as
// floats.
struct OperandTile {
  int rows;
  std::vector<float> slots;
  explicit OperandTile(int r) : rows(r), slots(dsv4::detail::operand_bytes(r) / 2, NAN) {}
  void set(int row, int col, float v) {
    slots[(dsv4::detail::operand_chunk_offset(row, col / 8, rows) + 2 * (col % 8)) / 2] = v;
  }
  float at_byte(int byte) const { return slots[byte / 2]; }
};

TEST(SparseDecodeLayout, OperandChunksFillTheTileOnce) {
  for (int rows : {64, dsv4::detail::kSparseTile}) {
    std::set<int> seen;
    for (int row = 0; row < rows; ++row) {
      for (int chunk = 0; chunk < 64; ++chunk) {
        const int at = dsv4::detail::operand_chunk_offset(row, chunk, rows);
        EXPECT_EQ(at % 16, 0);
        EXPECT_TRUE(at >= 0 && at < dsv4::detail::operand_bytes(rows));
        EXPECT_TRUE(seen.insert(at).second) << rows << " " << row << " " << chunk;
      }
    }
    // The 8 chunks that 8 consecutive threads store (one row, one block) hit all 8 bank groups.
    for (int row = 0; row < rows; ++row) {
      for (int block = 0; block < 8; ++block) {
        std::set<int> groups;
        for (int c = 0; c < 8; ++c)
          groups.insert(dsv4::detail::operand_chunk_offset(row, 8 * block + c, rows) / 16 % 8);
        EXPECT_EQ(groups.size(), 8u);
      }
    }
  }
}

// Both warpgroups emulated: each half's S (64 heads x kSparseTile entries) over its 16 k-steps
// read through the kernel's descriptors, the halves summed, then O = P E for each half's 256
// columns with P taken from the S accumulators as the kernel packs them. Both must equal plain
// matmuls.
TEST(SparseDecodeLayout, WarpgroupProductsMatchPlainMatmuls) {
  using dsv4::detail::wgmma_a_coord;
  using dsv4::detail::wgmma_d_coord;
  constexpr int kTile = dsv4::detail::kSparseTile, kScores = kTile / 2, kWidth = 512;
  std::mt19937 rng(5);
  OperandTile q(64), e(kTile);
  std::vector<float> Q(64 * kWidth), E(kTile * kWidth);
  for (int r = 0; r < 64; ++r) {
    for (int c = 0; c < kWidth; ++c) {
      Q[r * kWidth + c] = small_integer(rng);
      q.set(r, c, Q[r * kWidth + c]);
      if (r < kTile) {
        E[r * kWidth + c] = small_integer(rng);
        e.set(r, c, E[r * kWidth + c]);
      }
    }
  }
  // S: per half, thread and accumulator.
  std::vector<float> s(2 * 128 * kScores, 0.0f);
  for (int half = 0; half < 2; ++half) {
    for (int k_step = 16 * half; k_step < 16 * half + 16; ++k_step) {
      const dsv4::detail::WgmmaOperand a_op = dsv4::detail::scores_operand(k_step, 64);
      const dsv4::detail::WgmmaOperand b_op = dsv4::detail::scores_operand(k_step, kTile);
      for (int thread = 0; thread < 128; ++thread) {
        for (int i = 0; i < kScores; ++i) {
          const MatrixCoord d = wgmma_d_coord(thread, i);
          float sum = 0.0f;
          for (int k = 0; k < 16; ++k) {
            sum +=
                q.at_byte(k_major_byte(a_op, d.row, k)) * e.at_byte(k_major_byte(b_op, d.col, k));
          }
          s[(half * 128 + thread) * kScores + i] += sum;
        }
      }
    }
  }
  for (int thread = 0; thread < 128; ++thread) {
    for (int i = 0; i < kScores; ++i) {
      const MatrixCoord d = wgmma_d_coord(thread, i);
      float want = 0.0f;
      for (int k = 0; k < kWidth; ++k)
        want += Q[d.row * kWidth + k] * E[d.col * kWidth + k];
      ASSERT_EQ(s[thread * kScores + i] + s[(128 + thread) * kScores + i], want)
          << "head " << d.row << " entry " << d.col;
    }
  }
  // O = P E with P = the first half's accumulators / 64 (exact: multiples of 1/64).
  std::vector<float> P(64 * kTile);
  for (int thread = 0; thread < 128; ++thread) {
    for (int i = 0; i < kScores; ++i) {
      const MatrixCoord d = wgmma_d_coord(thread, i);
      P[d.row * kTile + d.col] = s[thread * kScores + i] / 64.0f;
    }
  }
  std::vector<int> a_owner(64 * 16, -1);  // thread * 8 + 2 reg + half
  for (int thread = 0; thread < 128; ++thread) {
    for (int reg = 0; reg < 4; ++reg) {
      for (int h = 0; h < 2; ++h) {
        const MatrixCoord at = wgmma_a_coord(thread, reg, h);
        a_owner[at.row * 16 + at.col] = thread * 8 + 2 * reg + h;
      }
    }
  }
  for (int half = 0; half < 2; ++half) {
    for (int thread = 0; thread < 128; thread += 3) {
      for (int i = 0; i < 128; ++i) {
        const MatrixCoord d = wgmma_d_coord(thread, i);
        float got = 0.0f;
        for (int k_step = 0; k_step < kTile / 16; ++k_step) {
          const dsv4::detail::WgmmaOperand op = dsv4::detail::outputs_operand(half, k_step, kTile);
          for (int k = 0; k < 16; ++k) {
            // A(d.row, k) is held by the thread wgmma_a_coord names, which packed it from its
            // accumulator 8 k_step + 2 reg + h.
            const int owner = a_owner[d.row * 16 + k];
            const float a = s[(owner / 8) * kScores + 8 * k_step + owner % 8] / 64.0f;
            got += a * e.at_byte(n_major_byte(op, k, d.col));
          }
        }
        float want = 0.0f;
        for (int k = 0; k < kTile; ++k)
          want += P[d.row * kTile + k] * E[k * kWidth + 256 * half + d.col];
        ASSERT_EQ(got, want) << "half " << half << " head " << d.row << " column " << d.col;
      }
    }
  }
}

// The pipelined kernel's hand-over of P: warpgroup 0 stores each bf16 pair of its A fragments
// (k-step k's register reg at wgmma_a_coord + 16 k columns) into a 64 x 64 operand tile with
// operand_chunk_offset; warpgroup 1 reads it as the K-major A operand of k-step k through
// scores_operand(k, 64). Every element is written once and read back as P.
TEST(SparseDecodeLayout, ProbabilitiesInSharedMemoryAreTheAOperand) {
  using dsv4::detail::wgmma_a_coord;
  constexpr int kTile = dsv4::detail::kSparseTile;
  OperandTile tile(64);
  std::vector<int> writes(64 * kTile, 0);
  auto value = [](int row, int col) { return static_cast<float>(row * kTile + col); };
  for (int thread = 0; thread < 128; ++thread) {
    for (int k_step = 0; k_step < kTile / 16; ++k_step) {
      for (int reg = 0; reg < 4; ++reg) {
        const MatrixCoord at = wgmma_a_coord(thread, reg, 0);
        const int col = at.col + 16 * k_step;
        ASSERT_EQ(col % 2, 0);  // the pair is one 4-byte store
        for (int h = 0; h < 2; ++h) {
          tile.set(at.row, col + h, value(at.row, col + h));
          ++writes[at.row * kTile + col + h];
        }
        ASSERT_EQ(dsv4::detail::operand_chunk_offset(at.row, col / 8, 64) / 8192, 0)
            << "P lies in the tile's first 64-column block";
      }
    }
  }
  for (int w : writes)
    ASSERT_EQ(w, 1);
  for (int k_step = 0; k_step < kTile / 16; ++k_step) {
    const dsv4::detail::WgmmaOperand op = dsv4::detail::scores_operand(k_step, 64);
    for (int row = 0; row < 64; ++row) {
      for (int k = 0; k < 16; ++k) {
        ASSERT_EQ(tile.at_byte(k_major_byte(op, row, k)), value(row, 16 * k_step + k))
            << "k-step " << k_step << " row " << row << " k " << k;
      }
    }
  }
}

// The pipelined kernel's producer: lane l of a warp converts chunks share_chunk(l / 8, j),
// j < 16, of entry base + l % 8, at share_chunk_offset, which must be the operand tile's place
// for the chunk. The 16 x 4 chunks of an entry are its 64, FP8 chunk j's scale group is j / 2 and
// a 16-byte load of chunks 2 k, 2 k + 1 holds 16 consecutive stored bytes; each store
// instruction's 8 lanes of one quarter cover 8 different bank groups.
TEST(SparseDecodeLayout, ProducerStoresAreConflictFree) {
  using dsv4::detail::share_chunk;
  constexpr int kTile = dsv4::detail::kSparseTile;
  for (int row = 0; row < kTile; ++row) {
    for (int j = 0; j < 16; ++j) {
      for (int quarter = 0; quarter < 4; ++quarter) {
        ASSERT_EQ(dsv4::detail::share_chunk_offset(row, quarter, j, kTile),
                  dsv4::detail::operand_chunk_offset(row, share_chunk(quarter, j), kTile))
            << "row " << row << " quarter " << quarter << " j " << j;
      }
    }
  }
  std::set<int> chunks;
  for (int quarter = 0; quarter < 4; ++quarter) {
    for (int j = 0; j < 16; ++j) {
      chunks.insert(share_chunk(quarter, j));
      if (j < 14) {
        EXPECT_EQ(share_chunk(quarter, j) / 8, j / 2) << "scale group";
      } else {
        EXPECT_GE(share_chunk(quarter, j), 56) << "RoPE";
      }
      if (j % 2 == 1) {  // one 16-byte load: stored bytes 16 (quarter + 4 (j / 2)) .. + 15
        EXPECT_EQ(share_chunk(quarter, j), share_chunk(quarter, j - 1) + 1);
        if (j < 14) {
          EXPECT_EQ(8 * share_chunk(quarter, j - 1), 16 * (quarter + 4 * (j / 2)));
        }
      }
    }
  }
  EXPECT_EQ(chunks.size(), 64u);
  EXPECT_EQ(*chunks.rbegin(), 63);
  for (int base = 0; base < kTile; base += 8) {
    for (int j = 0; j < 16; ++j) {
      for (int quarter = 0; quarter < 4; ++quarter) {
        std::set<int> groups;
        for (int e = base; e < base + 8; ++e) {
          groups.insert(dsv4::detail::operand_chunk_offset(e, share_chunk(quarter, j), kTile) / 16 %
                        8);
        }
        EXPECT_EQ(groups.size(), 8u) << "entries " << base << ".. j " << j;
      }
    }
  }
}

// ---- FP8 to bf16 -------------------------------------------------------------------------------

float bf16_bits_value(uint32_t bits16) {
  const uint32_t bits = bits16 << 16;
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

// With two head groups the pipelined kernel's producers share the conversion: group g's warp w
// converts entries 32 g + 8 w .. + 7 of a tile and then bulk-copies, from each of the 8 column
// blocks, the 1024 bytes from row 32 g + 8 w to the peer CTA's stage. That is right only if the
// warp's stores (every quarter's 16 chunks of its 8 entries) fill exactly those 8 ranges: the
// swizzle must keep a row's chunks within the row, and the 8 warps of the two groups must
// cover the stage once.
TEST(SparseDecodeLayout, SharedConversionCopiesWhatEachWarpStored) {
  using dsv4::detail::operand_block_bytes;
  using dsv4::detail::share_chunk_offset;
  constexpr int kTile = dsv4::detail::kSparseTile;
  constexpr int kWarpRows = 8;
  std::vector<int> owner(static_cast<size_t>(dsv4::detail::operand_bytes(kTile)), -1);
  for (int group = 0; group < 2; ++group) {
    for (int warp = 0; warp < 4; ++warp) {
      const int first_row = 32 * group + kWarpRows * warp;
      std::set<int> stored;
      for (int row = first_row; row < first_row + kWarpRows; ++row) {
        for (int quarter = 0; quarter < 4; ++quarter) {
          for (int j = 0; j < 16; ++j) {
            const int offset = share_chunk_offset(row, quarter, j, kTile);
            for (int b = 0; b < 16; ++b)
              ASSERT_TRUE(stored.insert(offset + b).second) << "byte stored twice";
          }
        }
      }
      std::set<int> copied;
      for (int block = 0; block < 8; ++block) {
        const int start = block * operand_block_bytes(kTile) + first_row * 128;
        for (int b = 0; b < kWarpRows * 128; ++b)
          copied.insert(start + b);
      }
      EXPECT_EQ(stored, copied) << "group " << group << " warp " << warp;
      for (int byte : copied) {
        EXPECT_EQ(owner[static_cast<size_t>(byte)], -1) << "byte copied by two warps";
        owner[static_cast<size_t>(byte)] = 4 * group + warp;
      }
    }
  }
  for (int who : owner)
    ASSERT_GE(who, 0) << "a byte of the stage no warp copies";
}

// The pipelined producer's raw pass: each thread copies its quarter's share of an entry (FP8
// pieces at 16 (quarter + 4 k), k < 7; RoPE pieces at 448 + 32 quarter + 16 k, k < 2: load_share's
// offsets, kept in the raw row) and quarter 0 the 8 scale bytes at 576. The four quarters cover an
// entry's stored bytes once, and the 8 lanes of a 16-byte load phase (one quarter, entries
// 8 w .. 8 w + 7) read 8 disjoint groups of 4 banks at kRawEntryStride; at 584 bytes (no padding)
// some phase would not.
bool raw_pass_phases_are_conflict_free(int stride) {
  for (int warp = 0; warp < 4; ++warp)
    for (int quarter = 0; quarter < 4; ++quarter) {
      std::vector<int> pieces;
      for (int k = 0; k < 7; ++k)
        pieces.push_back(16 * (quarter + 4 * k));
      for (int k = 0; k < 2; ++k)
        pieces.push_back(448 + 32 * quarter + 16 * k);
      for (int offset : pieces) {
        std::set<int> banks;  // 8 lanes x 4 words: all 32 banks exactly when no two meet
        for (int lane = 0; lane < 8; ++lane)
          for (int word = 0; word < 4; ++word)
            banks.insert((((8 * warp + lane) * stride + offset) / 4 + word) % 32);
        if (banks.size() != 32) return false;
      }
    }
  return true;
}

TEST(SparseDecodeLayout, RawPassCoversAnEntryOnceAndItsLoadPhasesShareNoBank) {
  constexpr int kDataBytes = static_cast<int>(dsv4::detail::kEntryDataBytes);
  constexpr int kScaleBytes = static_cast<int>(dsv4::detail::kEntryScaleBytes);
  std::vector<int> owner(static_cast<size_t>(kDataBytes + kScaleBytes), -1);
  auto claim = [&](int first, int bytes, int quarter) {
    for (int byte = first; byte < first + bytes; ++byte) {
      EXPECT_EQ(owner[static_cast<size_t>(byte)], -1) << "byte " << byte << " copied twice";
      owner[static_cast<size_t>(byte)] = quarter;
    }
  };
  for (int quarter = 0; quarter < 4; ++quarter) {
    for (int k = 0; k < 7; ++k)
      claim(16 * (quarter + 4 * k), 16, quarter);
    for (int k = 0; k < 2; ++k)
      claim(448 + 32 * quarter + 16 * k, 16, quarter);
  }
  claim(kDataBytes, kScaleBytes, 0);
  for (int who : owner)
    ASSERT_GE(who, 0) << "a stored byte no quarter copies";
  EXPECT_EQ(dsv4::detail::kRawEntryStride % 16, 0) << "cp.async 16-byte targets";
  EXPECT_GE(dsv4::detail::kRawEntryStride, kDataBytes + kScaleBytes);
  EXPECT_TRUE(raw_pass_phases_are_conflict_free(dsv4::detail::kRawEntryStride));
  EXPECT_FALSE(raw_pass_phases_are_conflict_free(kDataBytes + kScaleBytes));  // why the padding
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
      ASSERT_EQ((dsv4::detail::e4m3_nan_carries(word) & 0x80808080u) != 0, brute(word))
          << std::hex << word;
    }
  }
  for (int i = 0; i < 200000; ++i) {
    uint32_t word = static_cast<uint32_t>(rng());
    if (i % 2) word |= 0x7fu << (8 * (i % 4));
    ASSERT_EQ(dsv4::detail::any_e4m3_nan(word), brute(word)) << std::hex << word;
    ASSERT_EQ((dsv4::detail::e4m3_nan_carries(word) & 0x80808080u) != 0, brute(word))
        << std::hex << word;
  }
}

}  // namespace
}  // namespace testing
}  // namespace hdk
