// The tensor-core scoring of index_topk's CUDA kernel, checked on the CPU: the fragment ownership
// functions of dsv4/index_mma_layout.h (the PTX ISA's m16n8k16 layout) cover each matrix element
// once, the k permutation covers each key dim once, and a warp's scoring of an 8-entry tile,
// emulated lane by lane with the very fragment builders the kernel calls (query staging, key
// dequantization, the head reduction over C fragments), equals a plain float64 matmul of the
// same queries and keys. What this cannot check: that the hardware follows the PTX layout the
// functions transcribe (the CUDA tests in attention_test.cpp do, against the CUDA-core path and
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

#include "dsv4/index_mma_layout.h"
#include "dsv4/kv_cache_problem.h"
#include "dsv4/kv_formats.h"
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
};

// 8 keys as stored bytes (random codes, random finite scales), queries and weights; the warp's
// scores as the kernel computes them, against float64.
void check_tile(const TileCase& tc, uint64_t seed) {
  SCOPED_TRACE("H=" + std::to_string(tc.heads) +
               (tc.format == KeyFormat::kMXFP4 ? " mxfp4" : " nvfp4") +
               (tc.fp32_q ? " fp32 q" : " bf16 q") + " seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int H = tc.heads;
  const int scale_bytes = static_cast<int>(key_scale_bytes(tc.format));
  std::vector<uint8_t> data(kMmaN * kKeyDataBytes), scales(kMmaN * scale_bytes);
  for (auto& byte : data)
    byte = static_cast<uint8_t>(rng());
  for (auto& byte : scales) {
    byte = tc.format == KeyFormat::kMXFP4 ? static_cast<uint8_t>(120 + rng() % 12)
                                          : static_cast<uint8_t>(rng() % 0x7f);  // no NaN
  }
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(H) * kDim), w(static_cast<size_t>(H));
  for (float& v : q)
    v = tc.fp32_q ? normal(rng) : bf16_bits_value(bf16_rn_bits(normal(rng)));
  for (float& v : w)
    v = 0.1f * normal(rng);

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

      // float64 from the key decoded the CPU backend's way (dim d: nibble d of the data).
      double key[kDim];
      const int group_size = tc.format == KeyFormat::kMXFP4 ? 32 : 16;
      for (int d = 0; d < kDim; ++d) {
        const uint8_t byte = data[entry * kKeyDataBytes + d / 2];
        const uint8_t* entry_scales = &scales[entry * scale_bytes];
        const float scale = tc.format == KeyFormat::kMXFP4
                                ? decode_ue8m0(entry_scales[d / group_size])
                                : decode_e4m3(entry_scales[d / group_size]);
        key[d] = static_cast<double>(decode_e2m1((byte >> (d % 2 ? 4 : 0)) & 0xf)) * scale;
      }
      double expected = 0.0, magnitude = 0.0;
      for (int h = 0; h < H; ++h) {
        double dot = 0.0, dot_magnitude = 0.0;
        for (int d = 0; d < kDim; ++d) {
          dot += static_cast<double>(q[h * kDim + d]) * key[d];
          dot_magnitude += std::fabs(static_cast<double>(q[h * kDim + d]) * key[d]);
        }
        expected += (dot < 0.0 ? 0.0 : dot) * w[h];
        magnitude += std::fabs(static_cast<double>(w[h])) * dot_magnitude;
      }
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

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
