// index_topk's FP8 tensor-core scoring, checked on the CPU: the k orders of
// dsv4/index_topk/index_fp8_layout.h cover each key dim once per k-step group as the kernel
// needs (MXFP4: k-step g is exactly scale group g), the staged q chunks are their inverse, the
// E2M1-to-E4M3 translation keeps every value (times 2^-6), and a warpgroup's products, emulated
// thread by thread with the very fragment builders the kernel calls (A from the loaded key words, B
// from the staged, swizzled q tile), equal a plain float64 dot product of the same codes, and the
// key ring gives the scoring kernel the very pieces the one-launch kernel loads. What this
// cannot check: that the hardware follows the PTX fragment layout transcribed here (the CUDA
// cases of index_topk_test.cpp do, against the reference).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/kv_cache/kv_formats.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr int kDim = 128;
constexpr int kThreads = 128;  // a warpgroup

// Register `reg` of a thread's A fragment holds, for k-step s, bytes k = 4 (lane % 4) + b +
// 16 (reg / 2) of row 16 warp + lane / 4 + 8 (reg % 2).
int a_row(int thread, int reg) {
  return 16 * (thread / 32) + (thread % 32) / 4 + 8 * (reg % 2);
}
int a_k(int thread, int reg, int byte) {
  return 4 * (thread % 4) + byte + 16 * (reg / 2);
}

uint32_t word_of(const uint8_t* bytes) {
  uint32_t word;
  std::memcpy(&word, bytes, 4);
  return word;
}

TEST(IndexFp8Layout, EachStepCoversItsDimsOnce) {
  std::set<int> fp8, mxfp4;
  for (int step = 0; step < kFp8Steps; ++step) {
    std::set<int> group;
    for (int k = 0; k < 32; ++k) {
      ASSERT_TRUE(fp8.insert(fp8_key_dim(step, k)).second);
      ASSERT_TRUE(mxfp4.insert(mxfp4_key_dim(step, k)).second);
      group.insert(mxfp4_key_dim(step, k) / 32);
    }
    EXPECT_EQ(group, std::set<int>{step}) << "MXFP4 k-step " << step << " mixes scale groups";
  }
  EXPECT_EQ(fp8.size(), 128u);
  EXPECT_EQ(mxfp4.size(), 128u);
}

TEST(IndexFp8Layout, StagedChunksAreTheInverseOfTheKeyOrder) {
  for (int chunk = 0; chunk < 8; ++chunk) {
    for (int i = 0; i < 4; ++i) {
      for (int b = 0; b < 4; ++b) {
        const int step = chunk / 2, k = 16 * (chunk % 2) + 4 * i + b;
        // E4M3: byte b of word fp8_chunk_query_word is q's dim 4 word + b.
        EXPECT_EQ(4 * fp8_chunk_query_word(chunk, i) + b, fp8_key_dim(step, k));
        // MXFP4: code mxfp4_chunk_query_code of packed word mxfp4_chunk_query_word: dim
        // 8 word + code.
        EXPECT_EQ(8 * mxfp4_chunk_query_word(chunk, i) + mxfp4_chunk_query_code(chunk, b),
                  mxfp4_key_dim(step, k));
      }
    }
  }
}

// Every E2M1 code in every position of a word, the other codes random: byte i of the even
// (odd) translation is the E4M3 code of 2^-6 times code 2i's (2i + 1's) value, sign included.
TEST(IndexFp8Layout, E2m1TranslationKeepsEveryValueTimesTwoToTheMinusSix) {
  std::mt19937_64 rng(7);
  for (int n = 0; n < 8; ++n) {
    for (uint32_t code = 0; code < 16; ++code) {
      for (int trial = 0; trial < 64; ++trial) {
        const uint32_t word = (static_cast<uint32_t>(rng()) & ~(0xfu << (4 * n))) | code << (4 * n);
        const uint32_t bytes =
            n % 2 == 0 ? e2m1_even_as_scaled_e4m3(word) : e2m1_odd_as_scaled_e4m3(word);
        const uint8_t byte = static_cast<uint8_t>(bytes >> (8 * (n / 2)));
        const float want = std::ldexp(decode_e2m1(static_cast<uint8_t>(code)), -6);
        const float got = decode_e4m3(byte);
        ASSERT_EQ(got, want) << std::hex << word << " code " << n;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << word << " code " << n;
        ASSERT_EQ(got * kMxfp4KeyCodeScale, decode_e2m1(static_cast<uint8_t>(code)));
      }
    }
  }
}

TEST(IndexFp8Layout, KeyGroupScalesAreTheirUe8m0Values) {
  for (uint32_t byte = 0; byte < 256; ++byte) {
    const float want = decode_ue8m0(static_cast<uint8_t>(byte));
    for (int g = 0; g < 4; ++g) {
      // The other groups' bytes must not leak in: fill them with the byte's complement.
      const uint32_t others = (~byte & 0xffu) * 0x01010101u & ~(0xffu << (8 * g));
      const float got = mxfp4_group_scale(others | (byte << (8 * g)), g);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got)) << byte;
      } else {
        EXPECT_EQ(got, want) << byte << " group " << g;
      }
    }
  }
}

TEST(IndexFp8Layout, FoldedQueryExponentsStayExactInE4m3) {
  for (int exponent = -127; exponent <= 127; ++exponent) {
    const int folded = folded_query_exponent(exponent);
    EXPECT_GE(folded, -8);
    EXPECT_LE(folded, 6);
    if (exponent >= -8 && exponent <= 6) {
      EXPECT_EQ(folded, exponent);
    }
    for (uint8_t code = 1; code < 8; ++code) {
      const double value = std::ldexp(decode_e2m1(code), folded);
      EXPECT_EQ(decode_e4m3(encode_e4m3(static_cast<float>(value))), value) << exponent;
    }
  }
}

// One warpgroup's 64 x 64 product over a 64-entry tile, built as the kernel builds it, against
// the plain dot products: `mxfp4` picks the form. The q tile is staged byte for byte at
// fp8_query_chunk_offset; B element (k of step s, head h) is read back through the swizzle
// (row h, logical byte 32 s + k).
void check_product(bool mxfp4, uint64_t seed) {
  std::mt19937_64 rng(seed);
  constexpr int kHeads = 128;                              // two head tiles
  std::vector<uint8_t> keys(64 * kDim), q(kHeads * kDim);  // E4M3 codes of each value
  std::vector<uint8_t> packed_keys(64 * 64), packed_q(kHeads * 64);
  auto finite_e4m3 = [&] {
    uint8_t code;
    do {
      code = static_cast<uint8_t>(rng());
    } while ((code & 0x7f) == 0x7f);
    return code;
  };
  for (auto* codes : {&keys, &q}) {
    for (auto& c : *codes)
      c = finite_e4m3();
  }
  for (auto* packed : {&packed_keys, &packed_q}) {
    for (auto& byte : *packed)
      byte = static_cast<uint8_t>(rng());
  }
  auto value = [&](bool key, int row, int dim) -> double {
    if (!mxfp4) return decode_e4m3((key ? keys : q)[row * kDim + dim]);
    const uint8_t byte = (key ? packed_keys : packed_q)[row * 64 + dim / 2];
    return decode_e2m1(static_cast<uint8_t>((byte >> (4 * (dim % 2))) & 0xf));
  };
  // The staged B tiles: MXFP4 q enters as the E4M3 codes of its E2M1 values (scale folded
  // elsewhere: 2^0 here).
  std::vector<uint8_t> staged(2 * kFp8HeadTileBytes, 0xee);
  for (int head = 0; head < kHeads; ++head) {
    for (int chunk = 0; chunk < 8; ++chunk) {
      for (int i = 0; i < 4; ++i) {
        uint32_t word;
        if (!mxfp4) {
          word = word_of(&q[head * kDim + 4 * fp8_chunk_query_word(chunk, i)]);
        } else {
          // As stage_fp8_queries stages them: each code's value to E4M3.
          const uint32_t loaded =
              word_of(&packed_q[head * 64 + 4 * mxfp4_chunk_query_word(chunk, i)]);
          word = 0;
          for (int b = 0; b < 4; ++b) {
            const uint8_t code =
                static_cast<uint8_t>((loaded >> (4 * mxfp4_chunk_query_code(chunk, b))) & 0xfu);
            word |= static_cast<uint32_t>(encode_e4m3(decode_e2m1(code))) << (8 * b);
          }
        }
        std::memcpy(&staged[fp8_query_chunk_offset(head, chunk) + 4 * i], &word, 4);
      }
    }
  }
  auto b_element = [&](int step, int k, int head) {
    const int logical = 32 * step + k;
    return staged[fp8_query_chunk_offset(head, logical / 16) + logical % 16];
  };
  std::vector<double> product(64 * kHeads, 0.0);
  for (int thread = 0; thread < kThreads; ++thread) {
    const int t = thread % 4, upper = a_row(thread, 0);
    uint32_t fp8_rows[2][8], mxfp4_rows[2][4];
    for (int r = 0; r < 2; ++r) {
      const int entry = upper + 8 * r;
      for (int w = 0; w < 8; ++w)
        fp8_rows[r][w] = word_of(&keys[entry * kDim + 32 * t + 4 * w]);
      for (int g = 0; g < 4; ++g)
        mxfp4_rows[r][g] = word_of(&packed_keys[entry * 64 + 16 * g + 4 * t]);
    }
    for (int step = 0; step < kFp8Steps; ++step) {
      for (int reg = 0; reg < 4; ++reg) {
        const uint32_t a = mxfp4 ? mxfp4_step_fragment(mxfp4_rows[0], mxfp4_rows[1], step, reg)
                                 : fp8_step_fragment(fp8_rows[0], fp8_rows[1], step, reg);
        const int row = a_row(thread, reg);
        for (int byte = 0; byte < 4; ++byte) {
          const int k = a_k(thread, reg, byte);
          // The A byte must be the key's value at the dim the order names (MXFP4: 2^-6 times it,
          // the 2^6 applied once to an entry's sum).
          const double a_value = decode_e4m3(static_cast<uint8_t>(a >> (8 * byte))) *
                                 (mxfp4 ? kMxfp4KeyCodeScale : 1.0f);
          const int dim = mxfp4 ? mxfp4_key_dim(step, k) : fp8_key_dim(step, k);
          ASSERT_EQ(a_value, value(true, row, dim)) << "step " << step << " k " << k;
          for (int head = 0; head < kHeads; ++head)
            product[row * kHeads + head] += a_value * decode_e4m3(b_element(step, k, head));
        }
      }
    }
  }
  for (int entry = 0; entry < 64; ++entry) {
    for (int head = 0; head < kHeads; ++head) {
      double want = 0.0;
      for (int dim = 0; dim < kDim; ++dim)
        want += value(true, entry, dim) * value(false, head, dim);
      ASSERT_NEAR(product[entry * kHeads + head], want, 1e-9 * (1.0 + std::fabs(want)))
          << (mxfp4 ? "mxfp4" : "e4m3") << " entry " << entry << " head " << head;
    }
  }
}

// A key-ring tile: every (entry, chunk) at its own 16 bytes of the 8 KiB tile, chunk c of a row
// at position c ^ (row % 8) of its 128 bytes (the 128-byte swizzle).
TEST(IndexFp8Layout, KeyRingChunksFillTheTileOnce) {
  std::set<int> offsets;
  for (int row = 0; row < kFp8TileEntries; ++row) {
    for (int chunk = 0; chunk < 8; ++chunk) {
      const int offset = fp8_key_chunk_offset(row, chunk);
      ASSERT_EQ(offset, (row / 8) * 1024 + (row % 8) * 128 + ((chunk ^ (row % 8)) * 16));
      ASSERT_TRUE(offsets.insert(offset).second);
    }
  }
  EXPECT_EQ(static_cast<int>(offsets.size()) * 16, kFp8KeyTileBytes);
}

// What a thread loads from the key ring is what the one-launch kernel loads from memory (its
// entry's bytes 32 t .. 32 t + 31 as chunks 2 t and 2 t + 1), and the 8 lanes of a 16-byte load
// phase (two consecutive rows of a warp's 8, quad lanes t = 0..3, the same half) read 8 distinct
// 16-byte bank groups.
TEST(IndexFp8Layout, KeyRingGivesTheRegisterPathsPiecesWithoutBankConflicts) {
  std::vector<uint8_t> keys(kFp8TileEntries * kDim), tile(kFp8KeyTileBytes, 0xee);
  for (size_t i = 0; i < keys.size(); ++i)
    keys[i] = static_cast<uint8_t>(i * 7 + i / 128);
  for (int entry = 0; entry < kFp8TileEntries; ++entry) {
    for (int chunk = 0; chunk < 8; ++chunk)
      std::memcpy(&tile[fp8_key_chunk_offset(entry, chunk)], &keys[entry * kDim + 16 * chunk], 16);
  }
  for (int entry = 0; entry < kFp8TileEntries; ++entry) {
    for (int t = 0; t < 4; ++t) {
      for (int half = 0; half < 2; ++half) {
        ASSERT_EQ(std::memcmp(&tile[fp8_key_chunk_offset(entry, 2 * t + half)],
                              &keys[entry * kDim + 32 * t + 16 * half], 16),
                  0);
      }
    }
  }
  for (int first = 0; first < kFp8TileEntries; first += 2) {
    for (int half = 0; half < 2; ++half) {
      std::set<int> banks;
      for (int r = 0; r < 2; ++r) {
        for (int t = 0; t < 4; ++t)
          banks.insert((fp8_key_chunk_offset(first + r, 2 * t + half) % 128) / 16);
      }
      EXPECT_EQ(banks.size(), 8u) << "rows " << first << ", " << first + 1 << " half " << half;
    }
  }
}

// The MXFP4 key ring: every (entry, group chunk) at its own 16 bytes of the 4 KiB tile, and the
// 32 lanes of a warp's load of one group (8 rows, word t = 0..3 of the chunk) in 32 banks.
TEST(IndexFp8Layout, Mxfp4KeyRingFillsTheTileWithoutBankConflicts) {
  std::set<int> offsets;
  for (int row = 0; row < kFp8TileEntries; ++row) {
    for (int chunk = 0; chunk < 4; ++chunk) {
      const int offset = mxfp4_key_chunk_offset(row, chunk);
      ASSERT_EQ(offset % 16, 0);
      ASSERT_EQ(offset / 64, row);
      ASSERT_TRUE(offsets.insert(offset).second);
    }
  }
  EXPECT_EQ(static_cast<int>(offsets.size()) * 16, kMxfp4KeyTileBytes);
  for (int first = 0; first < kFp8TileEntries; first += 8) {
    for (int group = 0; group < 4; ++group) {
      std::set<int> banks;
      for (int r = 0; r < 8; ++r) {
        for (int t = 0; t < 4; ++t)
          banks.insert(((mxfp4_key_chunk_offset(first + r, group) + 4 * t) / 4) % 32);
      }
      EXPECT_EQ(banks.size(), 32u) << "rows " << first << ".. group " << group;
    }
  }
}

// A key-ring tile as a whole piece of its page (`entry_bytes` an entry, as stored) and the same
// tile as thread pairs copy it (16-byte chunk c of entry `row` at chunk_offset(row, c)).
struct RingTiles {
  std::vector<uint8_t> page, paired;
};
template <typename ChunkOffset>
RingTiles ring_tiles(int entry_bytes, ChunkOffset&& chunk_offset) {
  RingTiles tiles{std::vector<uint8_t>(kFp8TileEntries * entry_bytes),
                  std::vector<uint8_t>(kFp8TileEntries * entry_bytes)};
  for (size_t i = 0; i < tiles.page.size(); ++i)
    tiles.page[i] = static_cast<uint8_t>(i * 37 + i / entry_bytes);
  for (int row = 0; row < kFp8TileEntries; ++row) {
    for (int chunk = 0; chunk < entry_bytes / 16; ++chunk) {
      std::memcpy(&tiles.paired[chunk_offset(row, chunk)],
                  &tiles.page[row * entry_bytes + 16 * chunk], 16);
    }
  }
  return tiles;
}

// The packed q's loads give every thread the key's words 4 g + t of both its entries, whether
// thread pairs copied the tile (in the swizzle) or it came as a whole piece of its page.
TEST(IndexFp8Layout, Mxfp4KeyWordsAreTheKeysWordsInEitherTile) {
  const RingTiles tiles = ring_tiles(64, mxfp4_key_chunk_offset);
  ASSERT_EQ(static_cast<int>(tiles.page.size()), kMxfp4KeyTileBytes);
  auto word = [](const std::vector<uint8_t>& tile, int offset) {
    uint32_t w;
    std::memcpy(&w, &tile[offset], 4);
    return w;
  };
  for (int row = 0; row < kFp8TileEntries; ++row) {
    for (int g = 0; g < 4; ++g) {
      for (int t = 0; t < 4; ++t) {
        const uint32_t expected = word(tiles.page, row * 64 + 4 * (4 * g + t));
        EXPECT_EQ(word(tiles.page, mxfp4_key_word_offset(row, g, t, true)), expected);
        EXPECT_EQ(word(tiles.paired, mxfp4_key_word_offset(row, g, t, false)), expected);
      }
    }
  }
}

// The E4M3 q's loads give every thread the stored bytes 16 chunk .. + 15 of both its entries,
// whether thread pairs copied the tile (in the swizzle) or it came as a whole piece of its page.
TEST(IndexFp8Layout, E4m3KeyPiecesAreTheKeysBytesInEitherTile) {
  const RingTiles tiles = ring_tiles(128, fp8_key_chunk_offset);
  ASSERT_EQ(static_cast<int>(tiles.page.size()), kFp8KeyTileBytes);
  for (int row = 0; row < kFp8TileEntries; ++row) {
    for (int chunk = 0; chunk < 8; ++chunk) {
      const uint8_t* expected = &tiles.page[row * 128 + 16 * chunk];
      EXPECT_EQ(std::memcmp(&tiles.page[fp8_key_piece_offset(row, chunk, true)], expected, 16), 0)
          << row << " " << chunk;
      EXPECT_EQ(std::memcmp(&tiles.paired[fp8_key_piece_offset(row, chunk, false)], expected, 16),
                0)
          << row << " " << chunk;
    }
  }
}

TEST(IndexFp8Layout, E4m3WarpgroupProductIsTheDotProduct) {
  check_product(false, 1);
  check_product(false, 2);
}

TEST(IndexFp8Layout, Mxfp4WarpgroupProductIsTheDotProduct) {
  check_product(true, 3);
  check_product(true, 4);
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
