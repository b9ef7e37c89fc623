// Inputs for the KV cache tests: host tensors as bytes, random rows with the formats' hard cases
// (all-zero groups, values beyond FP8's range, denormal-range values, exact rounding ties, NaN
// and infinity), and the comparison of stored values against float64 ones.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"
#include "hdk/tensor_view.h"

namespace hdk {
namespace testing {

// Element i of a byte buffer holding `dtype` values.
void put_float(std::vector<uint8_t>& bytes, DType dtype, size_t index, float value);
void put_index(std::vector<uint8_t>& bytes, DType dtype, size_t index, int64_t value);
int64_t read_counter(const std::vector<uint8_t>& bytes, DType dtype);
std::vector<uint8_t> counter_bytes(DType dtype, int64_t value);

// `count` values drawn from N(0, scale^2).
std::vector<float> normal_values(std::mt19937_64& rng, int64_t count, float scale);

// Rows of `width` values; row n follows pattern n % 10 (0, 1: plain; 2: a zero group; 3: values
// up to 1e38; 4: values below the scale floor and in the float denormal range; 5: exact FP8 /
// E2M1 rounding ties; 6: a NaN; 7: an infinity; 8: magnitudes 1e3 and 1e-5 in one group; 9:
// negative zeros and tiny negatives). special = false: patterns 0, 1 and 8 only.
std::vector<float> random_rows(std::mt19937_64& rng, int64_t rows, int64_t width, bool special,
                               int64_t group_size);

// Encodes `values` ([rows, width] floats) as `dtype` bytes.
std::vector<uint8_t> encode_rows(const std::vector<float>& values, DType dtype);

// Distinct slots in [0, num_slots) for `rows` rows, every fifth one negative (skipped).
std::vector<int64_t> distinct_slots(std::mt19937_64& rng, int64_t rows, int64_t num_slots,
                                    bool with_skips);

std::vector<uint8_t> index_bytes(const std::vector<int64_t>& values, DType dtype);

// Bounds of a stored value against its float64 original (see kv_cache.h):
// FP8 non-RoPE values: |x' - x| <= 2^-4 |x| + 2^-10 scale + slack; bf16 RoPE: 2^-8 |x| + slack;
// FP4 keys: 0.25 max(scale, |x|) + saturation + slack; FP8 keys (one scale per key):
// 2^-4 |x| + 2^-10 scale + slack, and NaN everywhere for a key holding a NaN or infinity.
// Returns "" or the first failure.
struct StoredError {
  std::string failure;
  double max_relative = 0;  // largest |x' - x| / max(|x|, group amax * 2^-8) seen
};
StoredError check_stored_entry(const std::vector<double>& stored, const std::vector<double>& want,
                               const uint8_t* scale_bytes, double slack);
// max_relative: FP4 keys relative to the group amax, FP8 keys as for entries.
StoredError check_stored_key(const std::vector<double>& stored, const std::vector<double>& want,
                             double slack, dsv4::KeyFormat format = dsv4::KeyFormat::kMXFP4);

// "mxfp4", "nvfp4" or "fp8" (test names and traces).
const char* key_format_name(dsv4::KeyFormat format);

}  // namespace testing
}  // namespace hdk
