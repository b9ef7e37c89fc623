#include "support/kv_cache_case.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "core/float_convert.h"

namespace hdk {
namespace testing {

void put_float(std::vector<uint8_t>& bytes, DType dtype, size_t index, float value) {
  if (dtype == DType::kBFloat16) {
    const uint16_t bits = hdk::detail::float_to_bf16(value);
    std::memcpy(bytes.data() + 2 * index, &bits, 2);
  } else {
    std::memcpy(bytes.data() + 4 * index, &value, 4);
  }
}

void put_index(std::vector<uint8_t>& bytes, DType dtype, size_t index, int64_t value) {
  if (dtype == DType::kInt64) {
    std::memcpy(bytes.data() + 8 * index, &value, 8);
  } else {
    const auto narrow = static_cast<int32_t>(value);
    std::memcpy(bytes.data() + 4 * index, &narrow, 4);
  }
}

int64_t read_counter(const std::vector<uint8_t>& bytes, DType dtype) {
  if (dtype == DType::kInt64) {
    int64_t value;
    std::memcpy(&value, bytes.data(), 8);
    return value;
  }
  int32_t value;
  std::memcpy(&value, bytes.data(), 4);
  return value;
}

std::vector<uint8_t> counter_bytes(DType dtype, int64_t value) {
  std::vector<uint8_t> bytes(8, 0);
  put_index(bytes, dtype, 0, value);
  return bytes;
}

std::vector<float> normal_values(std::mt19937_64& rng, int64_t count, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values)
    v = normal(rng);
  return values;
}

std::vector<float> random_rows(std::mt19937_64& rng, int64_t rows, int64_t width, bool special,
                               int64_t group_size) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x(static_cast<size_t>(rows * width));
  for (int64_t n = 0; n < rows; ++n) {
    float* row = &x[n * width];
    const float magnitude = std::exp2(static_cast<float>(static_cast<int>(rng() % 16)) - 6.0f);
    for (int64_t i = 0; i < width; ++i)
      row[i] = normal(rng) * magnitude;
    int pattern = static_cast<int>(n % 10);
    if (!special && pattern != 8) pattern = pattern % 2;
    const int64_t group = static_cast<int64_t>(rng() % static_cast<uint64_t>(width / group_size));
    float* g = row + group * group_size;
    switch (pattern) {
      case 2:
        std::fill(g, g + group_size, 0.0f);
        break;
      case 3:
        for (int64_t i = 0; i < group_size; ++i)
          g[i] = normal(rng) * 1e30f;
        g[0] = 1.0e38f;
        break;
      case 4:
        for (int64_t i = 0; i < group_size; ++i)
          g[i] = normal(rng) * (i % 2 ? 1e-6f : 1e-39f);
        break;
      case 5: {
        // amax = 448 * 2^-3 fixes the FP8 scale at 2^-3 (and the E2M1 one at 2^4 ... for 56):
        // then midpoints between neighbouring codes, times the scale, are exact ties.
        g[0] = 56.0f;
        const float fp8_ties[] = {1.0625f, 1.1875f, 0.0029296875f, 13.0f, 15.0f, 0.5f * 1.125f};
        const float e2m1_ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
        for (int64_t i = 1; i < group_size; ++i) {
          const float sign = i % 3 ? 1.0f : -1.0f;
          g[i] = sign * (i % 2 ? fp8_ties[i % 6] * 0.125f : e2m1_ties[i % 7] * 16.0f);
        }
        break;
      }
      case 6:
        g[rng() % group_size] = nan;
        break;
      case 7:
        row[width - 1 - static_cast<int64_t>(rng() % 8)] = (rng() % 2) ? inf : -inf;
        break;
      case 8:
        for (int64_t i = 0; i < group_size; ++i)
          g[i] = normal(rng) * (unit(rng) < 0.5f ? 1e3f : 1e-5f);
        break;
      case 9:
        for (int64_t i = 0; i < group_size; ++i)
          g[i] = i % 2 ? -0.0f : -1e-12f;
        break;
      default:
        break;
    }
  }
  return x;
}

std::vector<uint8_t> encode_rows(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i)
    put_float(bytes, dtype, i, values[i]);
  return bytes;
}

std::vector<int64_t> distinct_slots(std::mt19937_64& rng, int64_t rows, int64_t num_slots,
                                    bool with_skips) {
  std::vector<int64_t> all(static_cast<size_t>(num_slots));
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), rng);
  std::vector<int64_t> slots(static_cast<size_t>(rows));
  for (int64_t n = 0; n < rows; ++n) {
    slots[n] = (with_skips && n % 5 == 3) ? -1 - static_cast<int64_t>(rng() % 3) : all[n];
  }
  return slots;
}

std::vector<uint8_t> index_bytes(const std::vector<int64_t>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(dtype));
  for (size_t i = 0; i < values.size(); ++i)
    put_index(bytes, dtype, i, values[i]);
  return bytes;
}

namespace {

std::string describe(const char* what, size_t i, double got, double want, double bound) {
  return std::string(what) + " value " + std::to_string(i) + ": stored " + std::to_string(got) +
         ", float64 " + std::to_string(want) + ", error bound " + std::to_string(bound);
}

// A non-finite original must come back as NaN (the NaN markers), and only then: true when value i
// is such a case (a mismatch is recorded in `result`), false when its error is to be measured.
bool checked_as_nan(size_t i, double got, double x, StoredError& result) {
  if (std::isfinite(x) && !std::isnan(got)) return false;
  if (std::isfinite(x) == std::isnan(got) && result.failure.empty()) {
    result.failure = describe("NaN mismatch at", i, got, x, 0);
  }
  return true;
}

}  // namespace

StoredError check_stored_entry(const std::vector<double>& stored, const std::vector<double>& want,
                               const uint8_t* scale_bytes, double slack) {
  StoredError result;
  for (size_t i = 0; i < want.size(); ++i) {
    const double x = want[i], got = stored[i];
    if (checked_as_nan(i, got, x, result)) continue;
    double bound;
    double amax = 0;
    if (i < 448) {
      const size_t g = i / 64;
      for (size_t j = g * 64; j < g * 64 + 64; ++j)
        amax = std::max(amax, std::fabs(want[j]));
      const double scale = std::ldexp(1.0, scale_bytes[g] - 127);
      bound = 0.0625 * std::fabs(x) + std::ldexp(scale, -10) + slack * amax;
    } else {
      amax = std::fabs(x);
      bound = std::ldexp(std::fabs(x), -8) + slack * std::fabs(x);
    }
    const double error = std::fabs(got - x);
    result.max_relative =
        std::max(result.max_relative, error / std::max(std::fabs(x), amax * 1.0 / 256));
    if (error > bound && result.failure.empty()) {
      result.failure = describe(i < 448 ? "FP8" : "RoPE", i, got, x, bound);
    }
  }
  return result;
}

StoredError check_stored_key(const std::vector<double>& stored, const std::vector<double>& want,
                             double slack, dsv4::KeyFormat format) {
  StoredError result;
  if (format == dsv4::KeyFormat::kFP8) {
    // One power-of-two scale per key: below 2 max(amax, 1e-4) / 448 (a backend's fp32 rotation
    // may give a slightly other amax than float64's, so the bound allows the next power).
    double amax = 0;
    bool finite = true;
    for (double x : want) {
      finite = finite && std::isfinite(x);
      if (std::isfinite(x)) amax = std::max(amax, std::fabs(x));
    }
    const double scale = 2 * std::max(amax, 1e-4) / 448 * (1 + slack);
    for (size_t i = 0; i < want.size(); ++i) {
      if (!finite) {  // the whole key is marked
        if (!std::isnan(stored[i]) && result.failure.empty()) {
          result.failure = describe("FP8 key not marked NaN at", i, stored[i], want[i], 0);
        }
        continue;
      }
      const double x = want[i], got = stored[i];
      if (checked_as_nan(i, got, x, result)) continue;
      const double bound = 0.0625 * std::fabs(x) + std::ldexp(scale, -10) + slack * amax;
      const double error = std::fabs(got - x);
      result.max_relative =
          std::max(result.max_relative, error / std::max(std::fabs(x), amax / 256));
      if (error > bound && result.failure.empty()) {
        result.failure = describe("FP8 key", i, got, x, bound);
      }
    }
    return result;
  }
  for (size_t i = 0; i < want.size(); ++i) {
    const double x = want[i], got = stored[i];
    if (checked_as_nan(i, got, x, result)) continue;
    double amax = 0;
    const size_t first = i / 32 * 32;
    for (size_t j = first; j < first + 32; ++j)
      amax = std::max(amax, std::fabs(want[j]));
    // The scale is at most 2 amax / 6 (MXFP4's power of two) or amax / 6 rounded (NVFP4).
    const double scale = amax / 3.0;
    const double bound =
        0.25 * std::max(scale, std::fabs(x)) + 0.0625 * std::fabs(x) + std::max(1e-4, slack) * amax;
    const double error = std::fabs(got - x);
    result.max_relative = std::max(result.max_relative, error / std::max(amax, 1e-30));
    if (error > bound && result.failure.empty()) {
      result.failure = describe("FP4", i, got, x, bound);
    }
  }
  return result;
}

const char* key_format_name(dsv4::KeyFormat format) {
  switch (format) {
    case dsv4::KeyFormat::kMXFP4:
      return "mxfp4";
    case dsv4::KeyFormat::kNVFP4:
      return "nvfp4";
    case dsv4::KeyFormat::kFP8:
      return "fp8";
  }
  return "?";
}

}  // namespace testing
}  // namespace hdk
