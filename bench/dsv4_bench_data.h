// Inputs of the DeepSeek-V4 benchmarks: pages of valid stored data drawn at random (the kernels
// read bytes, not their history, and a long-context point is GBs of pages), bf16 / fp32 normals,
// and pages handed out in no particular order.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace hdk {
namespace bench {

// xorshift64*: fills hundreds of MB of pages in well under a second.
class FastRandom {
 public:
  explicit FastRandom(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint64_t next() {
    state_ ^= state_ >> 12;
    state_ ^= state_ << 25;
    state_ ^= state_ >> 27;
    return state_ * 0x2545F4914F6CDD1Dull;
  }
  uint64_t below(uint64_t bound) { return next() % bound; }

 private:
  uint64_t state_;
};

// MODEL1 pages of valid entries: FP8 codes drawn uniformly except the NaN codes (0x7F, 0xFF
// become +-448), bf16 RoPE values of magnitude 0.25..4, scale bytes 119..121 (2^-8..2^-6, so the
// decoded non-RoPE values have an RMS near 1, like stored RMS-normalized entries).
void fill_entry_pages(std::vector<uint8_t>& pages, int64_t num_blocks, int64_t block_size,
                      FastRandom& random);

// MXFP4 key pages: any nibble is a valid E2M1 code; scale bytes 124..130 (2^-3..2^3).
void fill_key_pages(std::vector<uint8_t>& pages, int64_t num_blocks, int64_t block_size,
                    FastRandom& random);

// FP8 key pages (DeepGEMM's Hopper layout): 128 E4M3 codes a key, any code but NaN (0x7F, 0xFF
// become +-448), then one fp32 scale a key, a power of two 2^-3..2^3.
void fill_fp8_key_pages(std::vector<uint8_t>& pages, int64_t num_blocks, int64_t block_size,
                        FastRandom& random);

// E4M3 codes of finite values (no NaN code), count bytes.
std::vector<uint8_t> random_e4m3(int64_t count, FastRandom& random);

// bf16 bytes of normal values.
std::vector<uint16_t> normal_bf16(std::mt19937_64& rng, int64_t count, float sigma);

std::vector<float> normal_floats(std::mt19937_64& rng, int64_t count, float sigma);

// A random permutation of 0 .. count-1: pages handed out in no particular order, as an
// allocator's free list does after a while.
std::vector<int32_t> shuffled_blocks(int64_t count, std::mt19937_64& rng);

}  // namespace bench
}  // namespace hdk
