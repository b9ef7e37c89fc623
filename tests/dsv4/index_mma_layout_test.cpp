// The tensor-core scoring of index_topk's CUDA kernel, checked on the CPU: the fragment ownership
// functions of dsv4/index_topk/index_mma_layout.h (the PTX ISA's m16n8k16 layout) cover each matrix
// element once, the k permutation covers each key dim once, and a warp's scoring of an 8-entry
// tile, emulated lane by lane with the very fragment builders the kernel calls (query staging, key
// dequantization, the head reduction over C fragments), equals a plain float64 matmul of the
// same queries and keys. What this cannot check: that the hardware follows the PTX layout the
// functions transcribe (the CUDA tests in index_topk_test.cpp do, against the CUDA-core path and
// the reference).
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/bf16_pairs.h"
#include "dsv4/index_topk/index_mma_layout.h"
#include "dsv4/index_topk/index_wgmma_layout.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr int kLanes = 32;
constexpr int kDim = 128;

TEST(IndexMmaLayout, FragmentsCoverEachMatrixElementOnce) {
  std::set<std::pair<int, int>> a, b, c;
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int i = 0; i < 8; ++i) {
      ASSERT_TRUE(a.insert({mma_a_row(lane, i), mma_a_col(lane, i)}).second) << lane << " " << i;
    }
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(b.insert({mma_b_row(lane, i), mma_b_col(lane, i)}).second) << lane << " " << i;
      ASSERT_TRUE(c.insert({mma_c_row(lane, i), mma_c_col(lane, i)}).second) << lane << " " << i;
    }
  }
  for (const auto& rc : a)
    ASSERT_TRUE(rc.first >= 0 && rc.first < kMmaM && rc.second >= 0 && rc.second < kMmaK);
  for (const auto& rc : b)
    ASSERT_TRUE(rc.first >= 0 && rc.first < kMmaK && rc.second >= 0 && rc.second < kMmaN);
  for (const auto& rc : c)
    ASSERT_TRUE(rc.first >= 0 && rc.first < kMmaM && rc.second >= 0 && rc.second < kMmaN);
  EXPECT_EQ(a.size(), 256u);
  EXPECT_EQ(b.size(), 128u);
  EXPECT_EQ(c.size(), 128u);
  // Spot checks against the PTX ISA's tables: lane 5 is groupID 1, threadID_in_group 1.
  EXPECT_EQ(mma_a_row(5, 2), 9);
  EXPECT_EQ(mma_a_col(5, 5), 11);
  EXPECT_EQ(mma_b_row(5, 3), 11);
  EXPECT_EQ(mma_c_row(5, 3), 9);
  EXPECT_EQ(mma_c_col(5, 3), 3);
}

TEST(IndexMmaLayout, KeyPermutationCoversEachDimOnceAndLanesReadTheirOwnBytes) {
  std::set<int> dims;
  for (int step = 0; step < kKeySteps; ++step) {
    for (int k = 0; k < kMmaK; ++k)
      ASSERT_TRUE(dims.insert(index_key_dim(step, k)).second) << step << " " << k;
  }
  EXPECT_EQ(dims.size(), 128u);
  EXPECT_EQ(*dims.rbegin(), 127);
  // The B elements of quad lane t are dims 32t + 4 step + i: its own 16 bytes, in nibble order.
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int step = 0; step < kKeySteps; ++step) {
      for (int i = 0; i < 4; ++i)
        ASSERT_EQ(index_key_dim(step, mma_b_row(lane, i)), 32 * (lane & 3) + 4 * step + i);
    }
  }
}

// decode_e2m1 builds its values from bits: every code against the E2M1 table, sign of zero
// included.
TEST(IndexMmaLayout, E2m1CodesDecodeToTheirTableValues) {
  const float magnitudes[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (uint32_t code = 0; code < 16; ++code) {
    const float want = code & 8u ? -magnitudes[code & 7u] : magnitudes[code & 7u];
    const float got = decode_e2m1(static_cast<uint8_t>(code));
    EXPECT_EQ(got, want) << code;
    EXPECT_EQ(std::signbit(got), std::signbit(want)) << code;
  }
}

TEST(IndexMmaLayout, KeyValuesAreExactInBf16) {
  // Every E2M1 code times every UE8M0 scale and every finite E4M3 scale survives bf16.
  std::vector<float> scales;
  for (int byte = 0; byte < 255; ++byte)
    scales.push_back(decode_ue8m0(static_cast<uint8_t>(byte)));
  for (int byte = 0; byte < 256; ++byte) {
    if ((byte & 0x7f) != kE4m3ScaleNaN) scales.push_back(decode_e4m3(static_cast<uint8_t>(byte)));
  }
  for (float scale : scales) {
    for (uint32_t code = 0; code < 16; ++code) {
      const float value = decode_e2m1(static_cast<uint8_t>(code)) * scale;
      ASSERT_EQ(bf16_bits_value(bf16_rn_bits(value)), value) << code << " x " << scale;
    }
  }
  EXPECT_TRUE(std::isnan(bf16_bits_value(bf16_rn_bits(decode_e2m1(3) * decode_ue8m0(0xff)))));
}

// The kernel's byte-table decode of 4 codes at a time, against the CPU decoder: every 16-bit
// chunk of codes (in either half of its word) for a spread of scales, and every scale (NaN
// included) for random chunks.
void check_key_fragment(uint32_t chunk, float scale) {
  for (int step = 0; step < 2; ++step) {
    uint32_t words[4] = {0x9abcdef0u, 0x12345678u, 0u, 0u};
    words[0] = step == 0 ? (0x5a5a0000u | chunk) : ((chunk << 16) | 0xa5a5u);
    uint32_t b[2];
    key_fragment(words, step, pack_floats_bf16x2(scale, scale), b[0], b[1]);
    for (int i = 0; i < 4; ++i) {
      const float got = bf16_bits_value(i % 2 ? b[i / 2] >> 16 : b[i / 2] & 0xffffu);
      const float want = decode_e2m1(static_cast<uint8_t>((chunk >> (4 * i)) & 0xfu)) * scale;
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << std::hex << chunk << " " << i;
      } else {
        ASSERT_EQ(got, want) << std::hex << chunk << " " << i << " scale " << scale;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << chunk << " " << i;
      }
    }
  }
}

TEST(IndexMmaLayout, KeyFragmentsDecodeLikeTheCpu) {
  for (float scale :
       {1.0f, 0.25f, 6.0f, 448.0f, 0.001953125f, std::ldexp(1.0f, -120), std::ldexp(1.0f, 100)})
    for (uint32_t chunk = 0; chunk < 65536; ++chunk)
      check_key_fragment(chunk, scale);
  std::mt19937_64 rng(7);
  for (int byte = 0; byte < 256; ++byte) {
    for (float scale :
         {decode_ue8m0(static_cast<uint8_t>(byte)), decode_e4m3(static_cast<uint8_t>(byte))}) {
      for (int trial = 0; trial < 64; ++trial)
        check_key_fragment(static_cast<uint32_t>(rng() & 0xffffu), scale);
    }
  }
}

TEST(IndexMmaLayout, Fp32QueriesSplitIntoTwoBf16) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int i = 0; i < 100000; ++i) {
    const float value = normal(rng);
    uint32_t hi, lo;
    split_bf16(value, hi, lo);
    const double sum = static_cast<double>(bf16_bits_value(hi)) + bf16_bits_value(lo);
    ASSERT_LE(std::fabs(sum - value), std::ldexp(std::fabs(value), -16)) << value;
  }
}

// The kernels' check of staged bf16 query pairs (index_topk's staging, sparse_decode's queries)
// ORs each pair's non-finite bits over a thread's pairs: bit 15 flags the low value and bit 31
// the high one, exactly the non-finite ones, for every bf16 value in either half next to finite
// and non-finite neighbours, and ORed pairs flag a non-finite value anywhere among them.
TEST(Bf16Pairs, NonfiniteBitsFlagExactlyTheNonfiniteHalves) {
  const uint32_t others[] = {0x0000u, 0x8000u, 0x3f80u, 0x7f7fu, 0xff7fu, 0x0001u,
                             0x7f80u, 0xff80u, 0x7fc0u, 0xffffu, 0x7f81u};
  for (uint32_t bits = 0; bits <= 0xffffu; ++bits) {
    const uint32_t flag = std::isfinite(bf16_bits_value(bits)) ? 0u : 1u;
    for (const uint32_t other : others) {
      const uint32_t other_flag = std::isfinite(bf16_bits_value(other)) ? 0u : 1u;
      ASSERT_EQ(bf16x2_nonfinite_bits(pack_bf16x2(bits, other)), (flag << 15) | (other_flag << 31))
          << std::hex << bits << " " << other;
      ASSERT_EQ(bf16x2_nonfinite_bits(pack_bf16x2(other, bits)), (other_flag << 15) | (flag << 31))
          << std::hex << bits << " " << other;
    }
    const uint32_t ored = bf16x2_nonfinite_bits(pack_bf16x2(0x3f80u, 0x4000u)) |
                          bf16x2_nonfinite_bits(pack_bf16x2(0x0001u, bits));
    ASSERT_EQ(ored == 0, flag == 0) << std::hex << bits;
  }
}

// ---- A warp's tile, emulated
// ---------------------------------------------------------------------

float bf16_low(uint32_t reg) {
  return bf16_bits_value(reg & 0xffffu);
}
float bf16_high(uint32_t reg) {
  return bf16_bits_value(reg >> 16);
}

// mma.sync m16n8k16 for one warp: the registers of the 32 lanes turned into A, B and C by the
// ownership functions, D = A B + C (exact products, fp32 result), handed back the same way.
void emulate_mma(float (&c)[kLanes][4], const uint32_t (&a)[kLanes][4],
                 const uint32_t (&b)[kLanes][2]) {
  double A[kMmaM][kMmaK], B[kMmaK][kMmaN], C[kMmaM][kMmaN];
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int i = 0; i < 8; ++i) {
      const uint32_t reg = a[lane][i / 2];
      A[mma_a_row(lane, i)][mma_a_col(lane, i)] = i % 2 ? bf16_high(reg) : bf16_low(reg);
    }
    for (int i = 0; i < 4; ++i) {
      const uint32_t reg = b[lane][i / 2];
      B[mma_b_row(lane, i)][mma_b_col(lane, i)] = i % 2 ? bf16_high(reg) : bf16_low(reg);
      C[mma_c_row(lane, i)][mma_c_col(lane, i)] = c[lane][i];
    }
  }
  for (int lane = 0; lane < kLanes; ++lane) {
    for (int i = 0; i < 4; ++i) {
      const int row = mma_c_row(lane, i), col = mma_c_col(lane, i);
      double d = C[row][col];
      for (int k = 0; k < kMmaK; ++k)
        d += A[row][k] * B[k][col];
      c[lane][i] = static_cast<float>(d);
    }
  }
}

struct TileCase {
  int heads;
  KeyFormat format;
  bool fp32_q;

  std::string describe(uint64_t seed) const {
    return "H=" + std::to_string(heads) + (format == KeyFormat::kMXFP4 ? " mxfp4" : " nvfp4") +
           (fp32_q ? " fp32 q" : " bf16 q") + " seed " + std::to_string(seed);
  }
};

// The score of entry `entry` in float64 from the key decoded the CPU backend's way (dim d: nibble
// d of its data), and the sum of the magnitudes of its terms (for the tolerance).
double expected_score(const TileCase& tc, const std::vector<uint8_t>& data,
                      const std::vector<uint8_t>& scales, int entry, const std::vector<float>& q,
                      const std::vector<float>& w, double* magnitude) {
  const int scale_bytes = static_cast<int>(key_scale_bytes(tc.format));
  double key[kDim];
  const int group_size = tc.format == KeyFormat::kMXFP4 ? 32 : 16;
  for (int d = 0; d < kDim; ++d) {
    const uint8_t byte = data[entry * kKeyDataBytes + d / 2];
    const uint8_t* entry_scales = &scales[entry * scale_bytes];
    const float scale = tc.format == KeyFormat::kMXFP4 ? decode_ue8m0(entry_scales[d / group_size])
                                                       : decode_e4m3(entry_scales[d / group_size]);
    key[d] = static_cast<double>(decode_e2m1((byte >> (d % 2 ? 4 : 0)) & 0xf)) * scale;
  }
  double expected = 0.0;
  *magnitude = 0.0;
  for (int h = 0; h < tc.heads; ++h) {
    double dot = 0.0, dot_magnitude = 0.0;
    for (int d = 0; d < kDim; ++d) {
      dot += static_cast<double>(q[h * kDim + d]) * key[d];
      dot_magnitude += std::fabs(static_cast<double>(q[h * kDim + d]) * key[d]);
    }
    expected += (dot < 0.0 ? 0.0 : dot) * w[h];
    *magnitude += std::fabs(static_cast<double>(w[h])) * dot_magnitude;
  }
  return expected;
}

// Random stored keys (codes, finite scales; MXFP4 scale bytes from `lowest_scale_byte` to + 11),
// queries (bf16 values unless fp32_q) and weights for a tile of `entries`.
struct TileInputs {
  std::vector<uint8_t> data, scales;
  std::vector<float> q, w;
};

TileInputs make_tile_inputs(const TileCase& tc, std::mt19937_64& rng, int entries,
                            int lowest_scale_byte) {
  TileInputs in;
  const int scale_bytes = static_cast<int>(key_scale_bytes(tc.format));
  in.data.resize(static_cast<size_t>(entries) * kKeyDataBytes);
  in.scales.resize(static_cast<size_t>(entries) * scale_bytes);
  for (auto& byte : in.data)
    byte = static_cast<uint8_t>(rng());
  for (auto& byte : in.scales) {
    byte = tc.format == KeyFormat::kMXFP4 ? static_cast<uint8_t>(lowest_scale_byte + rng() % 12)
                                          : static_cast<uint8_t>(rng() % 0x7f);  // no NaN
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  in.q.resize(static_cast<size_t>(tc.heads) * kDim);
  in.w.resize(static_cast<size_t>(tc.heads));
  for (float& v : in.q)
    v = tc.fp32_q ? normal(rng) : bf16_bits_value(bf16_rn_bits(normal(rng)));
  for (float& v : in.w)
    v = 0.1f * normal(rng);
  return in;
}

// 8 keys as stored bytes (random codes, random finite scales), queries and weights; the warp's
// scores as the kernel computes them, against float64.
void check_tile(const TileCase& tc, uint64_t seed) {
  SCOPED_TRACE(tc.describe(seed));
  std::mt19937_64 rng(seed);
  const int H = tc.heads;
  const int scale_bytes = static_cast<int>(key_scale_bytes(tc.format));
  const TileInputs in = make_tile_inputs(tc, rng, kMmaN, 120);
  const std::vector<uint8_t>&data = in.data, &scales = in.scales;
  const std::vector<float>&q = in.q, &w = in.w;

  // Staged queries, as stage_queries writes them: words[q_fragment_word][register].
  const int m_tiles = (H + kMmaM - 1) / kMmaM;
  std::vector<std::array<uint32_t, 4>> hi(static_cast<size_t>(m_tiles) * kKeySteps * kLanes),
      lo(hi.size());
  for (int mt = 0; mt < m_tiles; ++mt) {
    for (int step = 0; step < kKeySteps; ++step) {
      for (int lane = 0; lane < kLanes; ++lane) {
        const int64_t word = q_fragment_word(mt, step, lane);
        for (int reg = 0; reg < 4; ++reg) {
          uint32_t h_bits[2], l_bits[2];
          for (int e = 0; e < 2; ++e) {
            const int i = 2 * reg + e;
            const int head = q_fragment_head(mt, lane, i);
            const float value = head < H ? q[head * kDim + q_fragment_dim(step, lane, i)] : 0.0f;
            if (tc.fp32_q) {
              split_bf16(value, h_bits[e], l_bits[e]);
            } else {
              h_bits[e] = bf16_rn_bits(value);
              l_bits[e] = 0;
            }
          }
          hi[word][reg] = pack_bf16x2(h_bits[0], h_bits[1]);
          lo[word][reg] = pack_bf16x2(l_bits[0], l_bits[1]);
        }
      }
    }
  }
  std::vector<float> weights(static_cast<size_t>(m_tiles) * kMmaM, 0.0f);
  for (int h = 0; h < H; ++h)
    weights[h] = w[h];

  // Key fragments: lane (group g, quad t) holds bytes 16t .. 16t + 15 of entry g.
  uint32_t b[kKeySteps][kLanes][2];
  for (int lane = 0; lane < kLanes; ++lane) {
    const int g = lane >> 2, t = lane & 3;
    uint32_t words[4];
    std::memcpy(words, &data[g * kKeyDataBytes + 16 * t], 16);
    for (int step = 0; step < kKeySteps; ++step) {
      const float scale = key_lane_scale(tc.format, &scales[g * scale_bytes], t, step);
      key_fragment(words, step, pack_floats_bf16x2(scale, scale), b[step][lane][0],
                   b[step][lane][1]);
    }
  }

  // The kernel's loop: per m-tile, 8 k-steps of mma (two for fp32 q), relu x weight per C
  // element, then the sum over the 8 lanes of each quad position.
  float sum[kLanes][2] = {};
  for (int mt = 0; mt < m_tiles; ++mt) {
    float c[kLanes][4] = {};
    for (int step = 0; step < kKeySteps; ++step) {
      uint32_t a[kLanes][4], a_lo[kLanes][4];
      for (int lane = 0; lane < kLanes; ++lane) {
        for (int reg = 0; reg < 4; ++reg) {
          a[lane][reg] = hi[q_fragment_word(mt, step, lane)][reg];
          a_lo[lane][reg] = lo[q_fragment_word(mt, step, lane)][reg];
        }
      }
      emulate_mma(c, a, b[step]);
      if (tc.fp32_q) emulate_mma(c, a_lo, b[step]);
    }
    for (int lane = 0; lane < kLanes; ++lane) {
      for (int i = 0; i < 4; ++i) {
        const float x = c[lane][i];
        sum[lane][i & 1] += (x < 0.0f ? 0.0f : x) * weights[mt * kMmaM + mma_c_row(lane, i)];
      }
    }
  }
  for (int t = 0; t < 4; ++t) {
    for (int i = 0; i < 2; ++i) {
      double total = 0.0;
      for (int g = 0; g < 8; ++g)
        total += sum[4 * g + t][i];
      const int entry = mma_c_col(t, i);  // lane t of group 0

      double magnitude = 0.0;
      const double expected = expected_score(tc, data, scales, entry, q, w, &magnitude);
      // fp32 accumulation (2^-24 per term, with slack), and 2^-16 per fp32 query value.
      const double tolerance = (1e-5 + (tc.fp32_q ? 1.6e-5 : 0.0)) * magnitude + 1e-30;
      EXPECT_NEAR(total, expected, tolerance) << "entry " << entry;
      // A wrong permutation or layout is off by the score's own size, not by rounding.
      EXPECT_GT(magnitude, 0.0);
    }
  }
}

TEST(IndexMmaLayout, EmulatedWarpTileEqualsAPlainMatmul) {
  uint64_t seed = 100;
  for (int heads : {64, 24, 1}) {
    for (KeyFormat format : {KeyFormat::kMXFP4, KeyFormat::kNVFP4}) {
      for (bool fp32_q : {false, true})
        check_tile(TileCase{heads, format, fp32_q}, seed++);
    }
  }
}

// ---- A warpgroup's tile (score_warpgroup), emulated ------------------------------------------

constexpr int kWarpgroupThreads = 128;

TEST(IndexWgmmaLayout, KeyPermutationCoversEachDimOnceAndThreadsReadTheirOwnBytes) {
  std::set<int> dims;
  for (int step = 0; step < kWarpgroupSteps; ++step) {
    for (int col = 0; col < 16; ++col)
      ASSERT_TRUE(dims.insert(warpgroup_key_dim(step, col)).second) << step << " " << col;
  }
  EXPECT_EQ(dims.size(), 128u);
  EXPECT_EQ(*dims.rbegin(), 127);
  // Every A element of quad lane t is one of dims 32t .. 32t + 31, the lane's own 16 bytes, and
  // its register and half are the pair and code that place_e2m1_word gives that dim.
  for (int thread = 0; thread < kWarpgroupThreads; ++thread) {
    const int t = thread % 4;
    for (int step = 0; step < kWarpgroupSteps; ++step) {
      for (int reg = 0; reg < 4; ++reg) {
        for (int half = 0; half < 2; ++half) {
          const int dim = warpgroup_key_dim(step, wgmma_a_coord(thread, reg, half).col);
          ASSERT_EQ(dim / 32, t);
          const int pair = 2 * step + reg / 2;  // step_fragment's register of the entry
          ASSERT_EQ(dim % 32, 8 * (pair / 4) + pair % 4 + 4 * half);
        }
      }
    }
  }
}

TEST(IndexWgmmaLayout, ChunkPairsInvertTheKeyPermutation) {
  // Each 16-byte chunk of a bf16 q row lands as four pairs (k, k + 1), and the 64 pairs of a
  // row cover the tile's 128 columns once.
  std::set<int> columns;
  for (int chunk = 0; chunk < 16; ++chunk) {
    for (int j = 0; j < 4; ++j) {
      const int k = warpgroup_chunk_pair_k(chunk, j);
      ASSERT_EQ(k % 2, 0) << chunk << " " << j;
      ASSERT_EQ(warpgroup_key_dim(k / 16, k % 16), 8 * chunk + j) << chunk << " " << j;
      ASSERT_EQ(warpgroup_key_dim((k + 1) / 16, (k + 1) % 16), 8 * chunk + j + 4);
      ASSERT_TRUE(columns.insert(k).second && columns.insert(k + 1).second);
    }
  }
  EXPECT_EQ(columns.size(), 128u);
}

TEST(IndexWgmmaLayout, PlacedCodesAreTheCodesTimesTwoToTheMinus126) {
  std::mt19937_64 rng(11);
  for (int position = 0; position < 8; ++position) {
    for (uint32_t code = 0; code < 16; ++code) {
      for (int trial = 0; trial < 16; ++trial) {
        uint32_t word = static_cast<uint32_t>(rng());
        word = (word & ~(0xfu << (4 * position))) | (code << (4 * position));
        uint32_t pairs[4];
        place_e2m1_word(word, pairs);
        const uint32_t reg = pairs[position % 4];
        const uint32_t bits = position < 4 ? reg & 0xffffu : reg >> 16;
        const float got = bf16_bits_value(bits);
        const float want = std::ldexp(decode_e2m1(static_cast<uint8_t>(code)), -126);
        ASSERT_EQ(got, want) << std::hex << word << " position " << position;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << word;
      }
    }
  }
}

// Every value of a piece against the CPU decoder's, times 2^-kPlacedShift: MXFP4 with each scale
// byte (one step where it applies, two steps always, as a warp with a large scale does), NVFP4
// with each pair of bytes (one step). Exact from scale byte 16; below (scales under 2^-111, which
// the write side never stores) the products are bf16 subnormals, within half their spacing.
void check_entry_fragments(const uint32_t (&words)[4], float scale_low, float scale_high,
                           const uint32_t (&registers)[16], const std::string& what,
                           bool exact = true) {
  for (int w = 0; w < 4; ++w) {
    for (int i = 0; i < 4; ++i) {
      for (int half = 0; half < 2; ++half) {
        const int code_index = i + 4 * half;
        const uint32_t reg = registers[4 * w + i];
        const float got = bf16_bits_value(half ? reg >> 16 : reg & 0xffffu);
        const float want = decode_e2m1(static_cast<uint8_t>((words[w] >> (4 * code_index)) & 0xf)) *
                           ((w < 2 ? scale_low : scale_high) / kPlacedScoreFactor);
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(got)) << what;
        } else if (exact) {
          ASSERT_EQ(got, want) << what << " word " << w << " code " << code_index;
          ASSERT_EQ(std::signbit(got), std::signbit(want)) << what;
        } else {
          ASSERT_LE(std::fabs(got - want), 0x1p-134f) << what << " word " << w;
        }
      }
    }
  }
}

TEST(IndexWgmmaLayout, EntryFragmentsDecodeLikeTheCpu) {
  std::mt19937_64 rng(12);
  for (int byte = 0; byte < 256; ++byte) {
    const float scale = decode_ue8m0(static_cast<uint8_t>(byte));
    const bool exact = byte >= 16;
    for (int trial = 0; trial < 32; ++trial) {
      uint32_t words[4], registers[16];
      for (uint32_t& word : words)
        word = static_cast<uint32_t>(rng());
      const std::string what = "ue8m0 byte " + std::to_string(byte);
      if (!mxfp4_needs_two_steps(static_cast<uint32_t>(byte))) {
        const uint32_t multiplier = mxfp4_placed_multiplier(static_cast<uint32_t>(byte));
        entry_fragments<false>(words, multiplier, multiplier, registers);
        check_entry_fragments(words, scale, scale, registers, what + " one step", exact);
      }
      entry_fragments<true>(words, scale_pair(scale), scale_pair(scale), registers);
      check_entry_fragments(words, scale, scale, registers, what + " two steps", exact);
    }
  }
  // Bytes 129 .. 136 take one step since the shift (2^kPlacedShift more range).
  EXPECT_FALSE(mxfp4_needs_two_steps(136));
  EXPECT_TRUE(mxfp4_needs_two_steps(137));
  EXPECT_TRUE(mxfp4_needs_two_steps(255));
  for (int low = 0; low < 256; ++low) {
    const int high = static_cast<int>(rng() % 256);
    const float scale_low = decode_e4m3(static_cast<uint8_t>(low));
    const float scale_high = decode_e4m3(static_cast<uint8_t>(high));
    uint32_t words[4], registers[16];
    for (uint32_t& word : words)
      word = static_cast<uint32_t>(rng());
    entry_fragments<false>(words, nvfp4_placed_multiplier(scale_low),
                           nvfp4_placed_multiplier(scale_high), registers);
    check_entry_fragments(words, scale_low, scale_high, registers,
                          "e4m3 bytes " + std::to_string(low) + ", " + std::to_string(high));
  }
}

// 64 keys as stored bytes, queries and weights; the warpgroup's scores as score_warpgroup
// computes them (the staged B tile read back through its offsets, the A fragments of every thread
// placed by wgmma_a_coord, the epilogue over wgmma_d_coord's accumulators), against float64.
void check_warpgroup_tile(const TileCase& tc, uint64_t seed) {
  SCOPED_TRACE(tc.describe(seed));
  std::mt19937_64 rng(seed);
  const int H = tc.heads;
  const int scale_bytes = static_cast<int>(key_scale_bytes(tc.format));
  // MXFP4: scale bytes on both sides of 136, so that some warps take the two-multiply path.
  const TileInputs in = make_tile_inputs(tc, rng, kWarpgroupEntries, 126);
  const std::vector<uint8_t>&data = in.data, &scales = in.scales;
  const std::vector<float>&q = in.q, &w = in.w;

  // The staged B tiles (hi, lo), as stage_queries writes them, read back as B[k][head].
  std::vector<uint8_t> hi_tile(kWarpgroupHeads * kDim * 2, 0xee), lo_tile(hi_tile.size(), 0xee);
  for (int head = 0; head < kWarpgroupHeads; ++head) {
    for (int k = 0; k < kDim; ++k) {
      const float value = head < H ? q[head * kDim + warpgroup_key_dim(k / 16, k % 16)] : 0.0f;
      uint32_t h_bits = bf16_rn_bits(value), l_bits = 0;
      if (tc.fp32_q) split_bf16(value, h_bits, l_bits);
      const int offset = warpgroup_query_offset(head, k);
      hi_tile[offset] = static_cast<uint8_t>(h_bits), hi_tile[offset + 1] = h_bits >> 8;
      lo_tile[offset] = static_cast<uint8_t>(l_bits), lo_tile[offset + 1] = l_bits >> 8;
    }
  }
  auto read_b = [](const std::vector<uint8_t>& tile, int k, int head) {
    const int offset = warpgroup_query_offset(head, k);
    return static_cast<double>(bf16_bits_value(tile[offset] | (tile[offset + 1] << 8)));
  };

  // A: each thread's two entries' fragments; the two-step choice is per warp.
  std::vector<double> A(kWarpgroupEntries * kDim, std::nan(""));
  for (int warp = 0; warp < 4; ++warp) {
    bool two_steps = tc.format == KeyFormat::kNVFP4;
    for (int lane = 0; lane < kLanes && tc.format == KeyFormat::kMXFP4; ++lane) {
      const int thread = 32 * warp + lane, upper = wgmma_d_coord(thread, 0).row;
      for (int row : {upper, upper + 8})
        two_steps |= mxfp4_needs_two_steps(scales[row * scale_bytes + lane % 4]);
    }
    for (int lane = 0; lane < kLanes; ++lane) {
      const int thread = 32 * warp + lane, t = lane % 4, upper = wgmma_d_coord(thread, 0).row;
      uint32_t fragments[2][16];
      for (int r = 0; r < 2; ++r) {
        const int row = upper + 8 * r;
        uint32_t words[4];
        std::memcpy(words, &data[row * kKeyDataBytes + 16 * t], 16);
        const uint8_t* entry_scales = &scales[row * scale_bytes];
        if (tc.format == KeyFormat::kNVFP4) {
          entry_fragments<false>(words, nvfp4_placed_multiplier(decode_e4m3(entry_scales[2 * t])),
                                 nvfp4_placed_multiplier(decode_e4m3(entry_scales[2 * t + 1])),
                                 fragments[r]);
        } else if (two_steps) {
          const uint32_t scale = scale_pair(decode_ue8m0(entry_scales[t]));
          entry_fragments<true>(words, scale, scale, fragments[r]);
        } else {
          const uint32_t multiplier = mxfp4_placed_multiplier(entry_scales[t]);
          entry_fragments<false>(words, multiplier, multiplier, fragments[r]);
        }
      }
      for (int step = 0; step < kWarpgroupSteps; ++step) {
        for (int reg = 0; reg < 4; ++reg) {
          const uint32_t value = step_fragment(fragments[0], fragments[1], step, reg);
          for (int half = 0; half < 2; ++half) {
            const MatrixCoord at = wgmma_a_coord(thread, reg, half);
            A[at.row * kDim + 16 * step + at.col] = half ? bf16_high(value) : bf16_low(value);
          }
        }
      }
    }
  }

  // D = A B (+ A B_lo), then each thread's relu x weight sums and the quad's shuffle sum, times
  // the placement's 2^kPlacedShift.
  std::vector<double> quad_sum(kWarpgroupEntries, 0.0);
  for (int thread = 0; thread < kWarpgroupThreads; ++thread) {
    for (int i = 0; i < 32; ++i) {
      const MatrixCoord at = wgmma_d_coord(thread, i);
      double d = 0.0;
      for (int k = 0; k < kDim; ++k) {
        d += A[at.row * kDim + k] * read_b(hi_tile, k, at.col);
        if (tc.fp32_q) d += A[at.row * kDim + k] * read_b(lo_tile, k, at.col);
      }
      const float x = static_cast<float>(d);
      quad_sum[at.row] += (x < 0.0f ? 0.0f : x) * (at.col < H ? w[at.col] : 0.0f);
    }
  }
  for (int entry = 0; entry < kWarpgroupEntries; ++entry) {
    double magnitude = 0.0;
    const double expected = expected_score(tc, data, scales, entry, q, w, &magnitude);
    const double tolerance = (1e-5 + (tc.fp32_q ? 1.6e-5 : 0.0)) * magnitude + 1e-30;
    EXPECT_NEAR(quad_sum[entry] * kPlacedScoreFactor, expected, tolerance) << "entry " << entry;
    EXPECT_GT(magnitude, 0.0);
  }
}

TEST(IndexWgmmaLayout, EmulatedWarpgroupTileEqualsAPlainMatmul) {
  uint64_t seed = 200;
  for (int heads : {64, 24, 1}) {
    for (KeyFormat format : {KeyFormat::kMXFP4, KeyFormat::kNVFP4}) {
      for (bool fp32_q : {false, true})
        check_warpgroup_tile(TileCase{heads, format, fp32_q}, seed++);
    }
  }
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
