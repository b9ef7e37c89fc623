#include "dsv4_bench_data.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "core/float_convert.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace bench {

namespace {

uint8_t finite_e4m3(uint8_t code) {
  return (code & 0x7F) == 0x7F ? static_cast<uint8_t>(code & 0xFE) : code;
}

}  // namespace

void fill_entry_pages(std::vector<uint8_t>& pages, int64_t num_blocks, int64_t block_size,
                      FastRandom& random) {
  pages.resize(static_cast<size_t>(num_blocks * block_size * dsv4::kEntryBytes));
  for (int64_t b = 0; b < num_blocks; ++b) {
    uint8_t* page = pages.data() + b * block_size * dsv4::kEntryBytes;
    for (int64_t i = 0; i < block_size; ++i) {
      uint8_t* entry = page + i * 576;
      for (int64_t j = 0; j < 448; j += 8) {
        uint64_t bits = random.next();
        for (int64_t k = 0; k < 8; ++k, bits >>= 8) {
          const auto code = static_cast<uint8_t>(bits);
          entry[j + k] = finite_e4m3(code);
        }
      }
      for (int64_t j = 0; j < 64; ++j) {
        const uint64_t bits = random.next();
        const auto value = static_cast<uint16_t>(
            ((bits & 1) << 15) | ((125 + (bits >> 1) % 4) << 7) | ((bits >> 8) & 0x7F));
        std::memcpy(entry + 448 + 2 * j, &value, 2);
      }
      uint8_t* scales = page + block_size * 576 + i * 8;
      for (int64_t g = 0; g < 7; ++g)
        scales[g] = static_cast<uint8_t>(119 + random.below(3));
      scales[7] = 0;
    }
  }
}

void fill_key_pages(std::vector<uint8_t>& pages, int64_t num_blocks, int64_t block_size,
                    FastRandom& random) {
  pages.resize(static_cast<size_t>(num_blocks * block_size * dsv4::kMxfp4KeyBytes));
  for (int64_t b = 0; b < num_blocks; ++b) {
    uint8_t* page = pages.data() + b * block_size * dsv4::kMxfp4KeyBytes;
    for (int64_t j = 0; j < block_size * 64; j += 8) {
      const uint64_t bits = random.next();
      std::memcpy(page + j, &bits, 8);
    }
    for (int64_t j = 0; j < block_size * 4; ++j)
      page[block_size * 64 + j] = static_cast<uint8_t>(124 + random.below(7));
  }
}

void fill_fp8_key_pages(std::vector<uint8_t>& pages, int64_t num_blocks, int64_t block_size,
                        FastRandom& random) {
  pages.resize(static_cast<size_t>(num_blocks * block_size * dsv4::kFp8KeyBytes));
  for (int64_t b = 0; b < num_blocks; ++b) {
    uint8_t* page = pages.data() + b * block_size * dsv4::kFp8KeyBytes;
    for (int64_t j = 0; j < block_size * 128; j += 8) {
      uint64_t bits = random.next();
      for (int64_t k = 0; k < 8; ++k, bits >>= 8)
        page[j + k] = finite_e4m3(static_cast<uint8_t>(bits));
    }
    for (int64_t i = 0; i < block_size; ++i) {
      const float scale = std::ldexp(1.0f, static_cast<int>(random.below(7)) - 3);
      std::memcpy(page + block_size * 128 + i * 4, &scale, 4);
    }
  }
}

std::vector<uint8_t> random_e4m3(int64_t count, FastRandom& random) {
  std::vector<uint8_t> codes(static_cast<size_t>(count));
  for (uint8_t& code : codes)
    code = finite_e4m3(static_cast<uint8_t>(random.next() >> 24));
  return codes;
}

std::vector<uint16_t> normal_bf16(std::mt19937_64& rng, int64_t count, float sigma) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<uint16_t> out(static_cast<size_t>(count));
  for (uint16_t& v : out)
    v = hdk::detail::float_to_bf16(normal(rng));
  return out;
}

std::vector<float> normal_floats(std::mt19937_64& rng, int64_t count, float sigma) {
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> out(static_cast<size_t>(count));
  for (float& v : out)
    v = normal(rng);
  return out;
}

std::vector<int32_t> shuffled_blocks(int64_t count, std::mt19937_64& rng) {
  std::vector<int32_t> blocks(static_cast<size_t>(count));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  return blocks;
}

}  // namespace bench
}  // namespace hdk
