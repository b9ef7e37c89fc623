#include "dsv4/kv_cache/reference/kv_cache_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "core/element_io.h"
#include "core/float_convert.h"
#include "dsv4/kv_cache/kv_cache_validation.h"
#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace {

using detail::CompressorProblem;
using detail::IndexView;
using detail::PagedPool;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr uint32_t kCanonicalNaNBits = 0x7fc00000u;

// Every finite non-negative FP8 E4M3 value, by code 0x00 .. 0x7E.
const std::vector<double>& e4m3_values() {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (int code = 0; code <= 0x7e; ++code) {
      const int exponent = code >> 3, mantissa = code & 7;
      v.push_back(exponent == 0 ? mantissa * std::ldexp(1.0, -9)
                                : (1.0 + mantissa / 8.0) * std::ldexp(1.0, exponent - 7));
    }
    return v;
  }();
  return values;
}

const double kE2m1Values[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};

// The code of the nearest value (ties: the even code), saturating at the largest.
int nearest_code(const double* values, int count, double magnitude) {
  int best = 0;
  for (int code = 1; code < count; ++code) {
    const double distance = std::fabs(values[code] - magnitude);
    const double best_distance = std::fabs(values[best] - magnitude);
    if (distance < best_distance || (distance == best_distance && code % 2 == 0)) best = code;
  }
  return best;
}

uint8_t fp8_reference(double x) {
  const int code = nearest_code(e4m3_values().data(), 0x7f, std::fabs(x));
  return static_cast<uint8_t>((std::signbit(x) ? 0x80 : 0) | code);
}

uint8_t e2m1_reference(double x) {
  const int code = nearest_code(kE2m1Values, 8, std::fabs(x));
  return static_cast<uint8_t>((std::signbit(x) ? 8 : 0) | code);
}

// ceil(log2(max(amax, 1e-4) / qmax)), exactly.
int scale_exponent_reference(double amax, double qmax) {
  const double ratio = std::max(amax, 1e-4) / qmax;
  int e = static_cast<int>(std::ceil(std::log2(ratio)));
  while (std::ldexp(1.0, e) < ratio)
    ++e;
  while (std::ldexp(1.0, e - 1) >= ratio)
    --e;
  return e;
}

bool all_finite(const double* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

double amax_of(const double* x, int64_t count) {
  double amax = 0;
  for (int64_t i = 0; i < count; ++i)
    amax = std::max(amax, std::fabs(x[i]));
  return amax;
}

void add_to_counter(const TensorView& counter, int64_t count) {
  if (!counter.defined() || count == 0) return;
  if (counter.dtype == DType::kInt64) {
    *static_cast<int64_t*>(counter.data) += count;
  } else {
    *static_cast<int32_t*>(counter.data) += static_cast<int32_t>(count);
  }
}

std::vector<double> load_row(const TensorView& view, int64_t row, int64_t count,
                             int64_t token = -1) {
  std::vector<double> x(static_cast<size_t>(count));
  const int64_t base = row * view.strides[0] + (token >= 0 ? token * view.strides[1] : 0);
  for (int64_t i = 0; i < count; ++i)
    x[i] = hdk::detail::load_float(view.data, view.dtype, base + i);
  return x;
}

uint8_t* entry_data(const PagedPool& pool, int64_t slot) {
  return pool.page(slot) + (slot % pool.block_size) * detail::kEntryDataBytes;
}
uint8_t* entry_scales(const PagedPool& pool, int64_t slot) {
  return pool.page(slot) + pool.block_size * detail::kEntryDataBytes +
         (slot % pool.block_size) * detail::kEntryScaleBytes;
}

// Writes one entry from its 584-byte image (block_size 1 layout) into a page.
void place_entry(const PagedPool& pool, int64_t slot, const uint8_t* image) {
  std::memcpy(entry_data(pool, slot), image, detail::kEntryDataBytes);
  std::memcpy(entry_scales(pool, slot), image + detail::kEntryDataBytes, detail::kEntryScaleBytes);
}

void place_key(const PagedPool& pool, int64_t slot, KeyFormat format, const uint8_t* image) {
  const int64_t data_bytes = detail::key_data_bytes(format);
  const int64_t scale_bytes = detail::key_scale_bytes(format);
  const int64_t offset = slot % pool.block_size;
  uint8_t* page = pool.page(slot);
  std::memcpy(page + offset * data_bytes, image, static_cast<size_t>(data_bytes));
  std::memcpy(page + pool.block_size * data_bytes + offset * scale_bytes, image + data_bytes,
              static_cast<size_t>(scale_bytes));
}

void store_output(void* out, DType dtype, int64_t offset, double value) {
  if (std::isnan(value)) {
    if (dtype == DType::kBFloat16) {
      static_cast<uint16_t*>(out)[offset] = static_cast<uint16_t>(kCanonicalNaNBits >> 16);
    } else {
      std::memcpy(static_cast<float*>(out) + offset, &kCanonicalNaNBits, 4);
    }
    return;
  }
  const float single = static_cast<float>(value);
  if (dtype == DType::kBFloat16) {
    static_cast<uint16_t*>(out)[offset] = hdk::detail::float_to_bf16(single);
  } else {
    static_cast<float*>(out)[offset] = single;
  }
}

}  // namespace

bool encode_entry_reference(const double* values, uint8_t* entry) {
  bool nonfinite = false;
  for (int64_t g = 0; g < detail::kNopeGroups; ++g) {
    const double* group = values + g * detail::kNopeGroupSize;
    uint8_t* codes = entry + g * detail::kNopeGroupSize;
    if (!all_finite(group, detail::kNopeGroupSize)) {
      nonfinite = true;
      std::memset(codes, 0x7f, detail::kNopeGroupSize);
      entry[detail::kEntryDataBytes + g] = 0xff;
      continue;
    }
    const int e = scale_exponent_reference(amax_of(group, detail::kNopeGroupSize), 448.0);
    for (int64_t i = 0; i < detail::kNopeGroupSize; ++i)
      codes[i] = fp8_reference(std::ldexp(group[i], -e));
    entry[detail::kEntryDataBytes + g] = static_cast<uint8_t>(e + 127);
  }
  entry[detail::kEntryDataBytes + 7] = 0;
  for (int64_t i = 0; i < kRopeDim; ++i) {
    const double x = values[kNopeDim + i];
    if (!std::isfinite(x)) nonfinite = true;
    // The RoPE values arrive as floats (inputs) or float64 (compressor); bf16 of the float.
    const uint16_t bits = hdk::detail::float_to_bf16(static_cast<float>(x));
    std::memcpy(entry + kNopeDim + 2 * i, &bits, 2);
  }
  return nonfinite;
}

bool encode_key_reference(const double* values, KeyFormat format, uint8_t* key) {
  std::memset(key, 0, static_cast<size_t>(detail::key_entry_bytes(format)));
  if (format == KeyFormat::kFP8) {
    // 128 E4M3 codes of x / 2^e, then 2^e as a little-endian fp32; NaN markers for a key with a
    // NaN or infinity.
    uint8_t* scale = key + kIndexerKeyDim;
    uint32_t scale_bits = 0x7fc00000u;
    const bool finite = all_finite(values, kIndexerKeyDim);
    if (finite) {
      const int e = scale_exponent_reference(amax_of(values, kIndexerKeyDim), 448.0);
      for (int64_t i = 0; i < kIndexerKeyDim; ++i)
        key[i] = fp8_reference(std::ldexp(values[i], -e));
      const float power = std::ldexp(1.0f, e);
      std::memcpy(&scale_bits, &power, 4);
    } else {
      std::memset(key, 0x7f, kIndexerKeyDim);
    }
    for (int b = 0; b < 4; ++b)
      scale[b] = static_cast<uint8_t>(scale_bits >> (8 * b));
    return !finite;
  }
  const int64_t group_size = format == KeyFormat::kMXFP4 ? 32 : 16;
  const int64_t groups = kIndexerKeyDim / group_size;
  const int64_t data_bytes = detail::key_data_bytes(format);
  bool nonfinite = false;
  for (int64_t g = 0; g < groups; ++g) {
    const double* group = values + g * group_size;
    uint8_t* scale = key + data_bytes + g;
    uint8_t codes[32] = {};
    if (!all_finite(group, group_size)) {
      nonfinite = true;
      *scale = format == KeyFormat::kMXFP4 ? 0xff : 0x7f;
    } else if (format == KeyFormat::kMXFP4) {
      const int e = scale_exponent_reference(amax_of(group, group_size), 6.0);
      *scale = static_cast<uint8_t>(e + 127);
      for (int64_t i = 0; i < group_size; ++i)
        codes[i] = e2m1_reference(std::ldexp(group[i], -e));
    } else {
      const double amax = amax_of(group, group_size);
      const int code = nearest_code(e4m3_values().data(), 0x7f, amax / 6.0);
      *scale = static_cast<uint8_t>(code);
      const double scale_value = e4m3_values()[code];
      for (int64_t i = 0; i < group_size && scale_value > 0; ++i)
        codes[i] = e2m1_reference(group[i] / scale_value);
    }
    for (int64_t i = 0; i < group_size; ++i) {
      const int64_t index = g * group_size + i;
      key[index / 2] |= static_cast<uint8_t>(index % 2 ? codes[i] << 4 : codes[i]);
    }
  }
  return nonfinite;
}

std::vector<double> hadamard_reference(const std::vector<double>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<double> y(x.size(), 0.0);
  const double norm = 1.0 / std::sqrt(static_cast<double>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const bool odd = __builtin_popcountll(static_cast<unsigned long long>(i & j)) % 2;
      y[i] += odd ? -x[j] : x[j];
    }
    y[i] *= norm;
  }
  return y;
}

std::vector<double> decode_entry_reference(const uint8_t* page, int64_t block_size,
                                           int64_t offset) {
  std::vector<double> out(kHeadDim);
  const uint8_t* data = page + offset * detail::kEntryDataBytes;
  const uint8_t* scales =
      page + block_size * detail::kEntryDataBytes + offset * detail::kEntryScaleBytes;
  for (int64_t i = 0; i < kNopeDim; ++i) {
    const uint8_t code = data[i];
    const uint8_t scale = scales[i / detail::kNopeGroupSize];
    if ((code & 0x7f) == 0x7f || scale == 0xff) {
      out[i] = kNaN;
      continue;
    }
    const double magnitude = e4m3_values()[code & 0x7f];
    out[i] = (code & 0x80 ? -magnitude : magnitude) * std::ldexp(1.0, scale - 127);
  }
  for (int64_t i = 0; i < kRopeDim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, data + kNopeDim + 2 * i, 2);
    out[kNopeDim + i] = hdk::detail::bf16_to_float(bits);
  }
  return out;
}

std::vector<double> decode_key_reference(const uint8_t* page, int64_t block_size, int64_t offset,
                                         KeyFormat format) {
  const int64_t group_size = format == KeyFormat::kMXFP4 ? 32 : 16;
  const int64_t data_bytes = detail::key_data_bytes(format);
  const int64_t scale_bytes = detail::key_scale_bytes(format);
  const uint8_t* data = page + offset * data_bytes;
  const uint8_t* scales = page + block_size * data_bytes + offset * scale_bytes;
  std::vector<double> out(kIndexerKeyDim);
  if (format == KeyFormat::kFP8) {
    // Code x the key's fp32 scale, whatever fp32 it is (NaN codes and NaN scales give NaN).
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b)
      bits |= static_cast<uint32_t>(scales[b]) << (8 * b);
    float single;
    std::memcpy(&single, &bits, 4);
    const double scale = single;
    for (int64_t i = 0; i < kIndexerKeyDim; ++i) {
      const uint8_t code = data[i];
      if ((code & 0x7f) == 0x7f) {
        out[i] = kNaN;
        continue;
      }
      const double magnitude = e4m3_values()[code & 0x7f];
      out[i] = (code & 0x80 ? -magnitude : magnitude) * scale;
    }
    return out;
  }
  for (int64_t i = 0; i < kIndexerKeyDim; ++i) {
    const uint8_t code = (data[i / 2] >> (i % 2 ? 4 : 0)) & 0xf;
    const uint8_t scale_byte = scales[i / group_size];
    double scale;
    if (format == KeyFormat::kMXFP4) {
      scale = scale_byte == 0xff ? kNaN : std::ldexp(1.0, scale_byte - 127);
    } else {
      scale = (scale_byte & 0x7f) == 0x7f ? kNaN : e4m3_values()[scale_byte & 0x7f];
      if (scale_byte & 0x80) scale = -scale;
    }
    const double magnitude = kE2m1Values[code & 7];
    out[i] = (code & 8 ? -magnitude : magnitude) * scale;
  }
  return out;
}

void store_entries_reference(const StoreEntriesParams& params) {
  const detail::StoreEntriesProblem p = detail::validate_store_entries(params);
  detail::check_slots("hdk::dsv4::store_entries", p.slots, p.num_rows, 1, p.cache,
                      detail::SlotUse::kWrite);
  int64_t invalid = 0;
  for (int64_t n = 0; n < p.num_rows; ++n) {
    const int64_t slot = p.slots.at(n);
    if (slot < 0) continue;
    const std::vector<double> x = load_row(params.values, n, kHeadDim);
    uint8_t image[kEntryBytes];
    invalid += encode_entry_reference(x.data(), image) ? 1 : 0;
    place_entry(p.cache, slot, image);
  }
  add_to_counter(params.invalid_count, invalid);
}

void gather_entries_reference(const GatherEntriesParams& params) {
  const detail::GatherEntriesProblem p = detail::validate_gather_entries(params);
  detail::check_slots("hdk::dsv4::gather_entries", p.slots, p.num_rows, p.num_columns, p.cache,
                      detail::SlotUse::kRead);
  for (int64_t n = 0; n < p.num_rows; ++n) {
    for (int64_t l = 0; l < p.num_columns; ++l) {
      const int64_t slot = p.slots.at(n, l);
      const int64_t base = n * p.out_row_stride + l * p.out_column_stride;
      std::vector<double> values(kHeadDim, 0.0);
      if (slot >= 0)
        values = decode_entry_reference(p.cache.page(slot), p.cache.block_size,
                                        slot % p.cache.block_size);
      for (int64_t i = 0; i < kHeadDim; ++i)
        store_output(p.out, p.out_dtype, base + i, values[i]);
    }
  }
}

void store_indexer_keys_reference(const StoreIndexerKeysParams& params) {
  const detail::StoreKeysProblem p = detail::validate_store_indexer_keys(params);
  detail::check_slots("hdk::dsv4::store_indexer_keys", p.slots, p.num_rows, 1, p.cache,
                      detail::SlotUse::kWrite);
  int64_t invalid = 0;
  for (int64_t n = 0; n < p.num_rows; ++n) {
    const int64_t slot = p.slots.at(n);
    if (slot < 0) continue;
    std::vector<double> x = load_row(params.keys, n, kIndexerKeyDim);
    if (p.rotate) x = hadamard_reference(x);
    uint8_t image[kFp8KeyBytes];
    invalid += encode_key_reference(x.data(), p.format, image) ? 1 : 0;
    place_key(p.cache, slot, p.format, image);
  }
  add_to_counter(params.invalid_count, invalid);
}

void gather_indexer_keys_reference(const GatherIndexerKeysParams& params) {
  const detail::GatherKeysProblem p = detail::validate_gather_indexer_keys(params);
  detail::check_slots("hdk::dsv4::gather_indexer_keys", p.slots, p.num_rows, p.num_columns, p.cache,
                      detail::SlotUse::kRead);
  for (int64_t n = 0; n < p.num_rows; ++n) {
    for (int64_t l = 0; l < p.num_columns; ++l) {
      const int64_t slot = p.slots.at(n, l);
      const int64_t base = n * p.out_row_stride + l * p.out_column_stride;
      std::vector<double> values(kIndexerKeyDim, 0.0);
      if (slot >= 0) {
        values = decode_key_reference(p.cache.page(slot), p.cache.block_size,
                                      slot % p.cache.block_size, p.format);
      }
      for (int64_t i = 0; i < kIndexerKeyDim; ++i)
        store_output(p.out, p.out_dtype, base + i, values[i]);
    }
  }
}

// ---- Compressor -----------------------------------------------------------------------------

CompressorReference::CompressorReference(int64_t ratio, int64_t dim)
    : ratio_(ratio), dim_(dim), overlap_(ratio == 4) {}

std::vector<CompressorReference::Entry> CompressorReference::run(const CompressorParams& params) {
  const CompressorProblem p = detail::validate_compress(params);
  detail::check_compressor_indices(p);
  if (p.ratio != ratio_ || p.dim != dim_) {
    throw Error("CompressorReference: built for ratio " + std::to_string(ratio_) +
                ", d = " + std::to_string(dim_) + ", called with ratio " + std::to_string(p.ratio) +
                ", d = " + std::to_string(p.dim));
  }
  const int64_t d = dim_, m = ratio_, width = p.input_width();
  std::vector<Entry> entries;
  int64_t invalid = 0;
  for (int64_t n = 0; n < p.num_rows; ++n) {
    const int64_t state_slot = p.state_slots.at(n);
    if (state_slot < 0) continue;
    Rows& rows = rows_[state_slot];
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const int64_t position = p.positions.at(n) + t;
      const int64_t window = position / m;
      const int64_t row = position % m;
      if (row == 0) {
        // A new window: what an older request left in this state slot is gone, and only the
        // previous window (CSA) stays.
        for (auto* table : {&rows.kv, &rows.score}) {
          for (auto it = table->begin(); it != table->end();) {
            it = (it->first == window - 1 && overlap_) ? std::next(it) : table->erase(it);
          }
        }
        rows.kv[window].assign(m, std::vector<double>(width, 0.0));
        rows.score[window].assign(m, std::vector<double>(width, 0.0));
      }
      const int64_t base = n * p.input_row_stride + t * p.input_token_stride;
      for (int64_t c = 0; c < width; ++c) {
        rows.kv[window][row][c] = hdk::detail::load_float(p.kv, p.input_dtype, base + c);
        rows.score[window][row][c] = hdk::detail::load_float(p.score, p.input_dtype, base + c) +
                                     static_cast<double>(p.ape[row * p.ape_row_stride + c]);
      }
      if (row != m - 1) continue;

      // The window is complete: softmax per channel over its rows (and, CSA, the previous
      // window's first-d channels, score -inf / kv 0 when there is none).
      Entry entry;
      entry.state_slot = state_slot;
      entry.row = n;
      entry.index = window;
      entry.value.assign(d, 0.0);
      const bool has_previous = overlap_ && rows.kv.count(window - 1) > 0;
      for (int64_t c = 0; c < d; ++c) {
        std::vector<double> kv_column, score_column;
        if (overlap_) {
          for (int64_t r = 0; r < m; ++r) {
            kv_column.push_back(has_previous ? rows.kv[window - 1][r][c] : 0.0);
            score_column.push_back(has_previous ? rows.score[window - 1][r][c]
                                                : -std::numeric_limits<double>::infinity());
          }
        }
        const int64_t channel = overlap_ ? d + c : c;
        for (int64_t r = 0; r < m; ++r) {
          kv_column.push_back(rows.kv[window][r][channel]);
          score_column.push_back(rows.score[window][r][channel]);
        }
        const double top = *std::max_element(score_column.begin(), score_column.end());
        double numerator = 0, denominator = 0;
        bool nan_score = false;
        for (size_t r = 0; r < score_column.size(); ++r) {
          if (std::isnan(score_column[r])) nan_score = true;
          const double w = std::exp(score_column[r] - top);
          numerator += kv_column[r] * w;
          denominator += w;
        }
        entry.value[c] = nan_score ? kNaN : numerator / denominator;
      }
      // RMSNorm (weighted), then RoPE on the last 64 channels at the window's first position.
      double mean_square = 0;
      for (double v : entry.value)
        mean_square += v * v;
      mean_square /= static_cast<double>(d);
      const double inverse_rms = 1.0 / std::sqrt(mean_square + static_cast<double>(p.norm_eps));
      for (int64_t c = 0; c < d; ++c)
        entry.value[c] *= inverse_rms * p.norm_weight[c * p.norm_weight_stride];
      const int64_t first_position = window * m;
      for (int64_t i = 0; i < kRopeDim / 2; ++i) {
        const double cosine = p.rope_cos[first_position * p.rope_cos_row_stride + i];
        const double sine = p.rope_sin[first_position * p.rope_sin_row_stride + i];
        double& x0 = entry.value[d - kRopeDim + 2 * i];
        double& x1 = entry.value[d - kRopeDim + 2 * i + 1];
        const double y0 = x0 * cosine - x1 * sine;
        const double y1 = x0 * sine + x1 * cosine;
        x0 = y0, x1 = y1;
      }
      const int64_t page = window / p.cache.block_size;
      entry.slot = p.block_table.at(n, page) * p.cache.block_size + window % p.cache.block_size;
      uint8_t image[kEntryBytes];
      if (d == kHeadDim) {
        entry.stored = entry.value;
        entry.nonfinite = encode_entry_reference(entry.stored.data(), image);
        place_entry(p.cache, entry.slot, image);
      } else {
        entry.stored = p.rotate ? hadamard_reference(entry.value) : entry.value;
        entry.nonfinite = encode_key_reference(entry.stored.data(), p.key_format, image);
        place_key(p.cache, entry.slot, p.key_format, image);
      }
      invalid += entry.nonfinite ? 1 : 0;
      entries.push_back(std::move(entry));
    }
  }
  add_to_counter(params.invalid_count, invalid);
  return entries;
}

std::vector<float> CompressorReference::export_state(int64_t state_slot,
                                                     int64_t next_position) const {
  const int64_t d = dim_, m = ratio_;
  const int64_t accumulators = overlap_ ? 3 : 1;
  std::vector<float> state(static_cast<size_t>(accumulators * 3 * d), 0.0f);
  auto it = rows_.find(state_slot);
  if (it == rows_.end()) return state;
  const Rows& rows = it->second;
  // Accumulator a over rows [0, count) of `window`, channels offset .. offset + d.
  auto fill = [&](int64_t a, int64_t window, int64_t count, int64_t offset) {
    float* base = state.data() + a * 3 * d;
    const auto kv = rows.kv.find(window);
    const auto score = rows.score.find(window);
    for (int64_t c = 0; c < d; ++c) {
      double top = -std::numeric_limits<double>::infinity(), sum = 0, weighted = 0;
      for (int64_t r = 0; r < count; ++r)
        top = std::max(top, score->second[r][offset + c]);
      for (int64_t r = 0; r < count; ++r) {
        const double w = std::exp(score->second[r][offset + c] - top);
        sum += w;
        weighted += w * kv->second[r][offset + c];
      }
      base[c] = static_cast<float>(top);
      base[d + c] = static_cast<float>(sum);
      base[2 * d + c] = static_cast<float>(weighted);
    }
  };
  const int64_t window = next_position / m;
  const int64_t filled = next_position % m;
  if (overlap_) {
    if (filled > 0) {
      fill(window & 1, window, filled, 0);
      fill(2, window, filled, d);
    }
    if (window > 0 && rows.kv.count(window - 1)) fill((window - 1) & 1, window - 1, m, 0);
  } else if (filled > 0) {
    fill(0, window, filled, 0);
  }
  return state;
}

}  // namespace dsv4
}  // namespace hdk
