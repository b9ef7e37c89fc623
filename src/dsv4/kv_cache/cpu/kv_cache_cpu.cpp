#include "dsv4/kv_cache/cpu/kv_cache_cpu.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/element_io.h"
#include "core/float_convert.h"
#include "core/thread_pool.h"
#include "dsv4/kv_cache/compressor_math.h"
#include "dsv4/kv_cache/cpu/entry_decode.h"
#include "dsv4/kv_cache/cpu/key_encode.h"
#include "dsv4/kv_cache/kv_formats.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::load_floats;
using hdk::detail::parallel_for;

constexpr uint32_t kCanonicalNaN = 0x7fc00000u;

// Writes one MODEL1 entry from 512 floats; true when it holds a non-finite value.
bool write_entry(const PagedPool& pool, int64_t slot, const float* x) {
  const auto [page, offset] = pool.locate(slot);
  uint8_t* data = page + offset * kEntryDataBytes;
  uint8_t* scales = page + pool.block_size * kEntryDataBytes + offset * kEntryScaleBytes;
  bool nonfinite = false;
  for (int64_t g = 0; g < kNopeGroups; ++g) {
    const float* group = x + g * kNopeGroupSize;
    float amax = 0.0f;
    bool finite = true;
    for (int64_t i = 0; i < kNopeGroupSize; ++i) {
      finite = finite && is_finite(group[i]);
      amax = std::fmax(amax, std::fabs(group[i]));
    }
    if (!finite) {
      nonfinite = true;
      std::memset(data + g * kNopeGroupSize, kFp8NaN, kNopeGroupSize);
      scales[g] = kScaleNaN;
      continue;
    }
    const int e = fp8_scale_exponent(amax);
    const float inverse = power_of_two(-e);
    for (int64_t i = 0; i < kNopeGroupSize; ++i)
      data[g * kNopeGroupSize + i] = encode_e4m3(group[i] * inverse);
    scales[g] = static_cast<uint8_t>(e + 127);
  }
  scales[kNopeGroups] = 0;
  for (int64_t i = 0; i < kRopeDim; ++i) {
    const float value = x[kNopeDim + i];
    nonfinite = nonfinite || !is_finite(value);
    const uint16_t bits = hdk::detail::float_to_bf16(value);
    std::memcpy(data + kNopeDim + 2 * i, &bits, 2);
  }
  return nonfinite;
}

// Writes one indexer key from 128 floats (rotated first when asked); true when non-finite.
bool write_key(const PagedPool& pool, int64_t slot, KeyFormat format, bool rotate, float* x) {
  const auto [page, offset] = pool.locate(slot);
  const int64_t data_bytes = key_data_bytes(format);
  return encode_key(x, format, rotate, page + offset * data_bytes,
                    page + pool.block_size * data_bytes + offset * key_scale_bytes(format));
}

void store_value(void* out, DType dtype, int64_t offset, float value, bool nan) {
  if (dtype == DType::kBFloat16) {
    static_cast<uint16_t*>(out)[offset] =
        nan ? static_cast<uint16_t>(kCanonicalNaN >> 16) : hdk::detail::float_to_bf16(value);
  } else if (nan) {
    std::memcpy(static_cast<float*>(out) + offset, &kCanonicalNaN, 4);
  } else {
    static_cast<float*>(out)[offset] = value;
  }
}

}  // namespace

void store_entries_cpu(const StoreEntriesProblem& p) {
  std::atomic<int64_t> invalid{0};
  parallel_for(p.num_rows, [&](int64_t begin, int64_t end) {
    std::vector<float> x(kHeadDim);
    int64_t local = 0;
    for (int64_t n = begin; n < end; ++n) {
      const int64_t slot = p.slots.at(n);
      if (slot < 0) continue;
      load_floats(p.values, p.values_dtype, n * p.values_row_stride, kHeadDim, x.data());
      local += write_entry(p.cache, slot, x.data()) ? 1 : 0;
    }
    invalid += local;
  });
  add_to_counter(p.invalid_count, invalid.load());
}

void gather_entries_cpu(const GatherEntriesProblem& p) {
  parallel_for(p.num_rows * p.num_columns, [&](int64_t begin, int64_t end) {
    float values[kNopeDim];
    for (int64_t index = begin; index < end; ++index) {
      const int64_t n = index / p.num_columns, l = index % p.num_columns;
      const int64_t slot = p.slots.at(n, l);
      const int64_t base = n * p.out_row_stride + l * p.out_column_stride;
      if (slot < 0) {
        hdk::detail::store_zeros(p.out, p.out_dtype, base, kHeadDim);
        continue;
      }
      decode_entry_nope(p.cache, slot, values);
      for (int64_t i = 0; i < kNopeDim; ++i)
        store_value(p.out, p.out_dtype, base + i, values[i], std::isnan(values[i]));
      // RoPE values are copied bit for bit (a stored NaN keeps its payload in bf16).
      const uint8_t* rope = p.cache.page(slot) + (slot % p.cache.block_size) * kEntryDataBytes;
      for (int64_t i = 0; i < kRopeDim; ++i) {
        uint16_t bits;
        std::memcpy(&bits, rope + kNopeDim + 2 * i, 2);
        if (p.out_dtype == DType::kBFloat16) {
          static_cast<uint16_t*>(p.out)[base + kNopeDim + i] = bits;
        } else {
          static_cast<float*>(p.out)[base + kNopeDim + i] = hdk::detail::bf16_to_float(bits);
        }
      }
    }
  });
}

void store_indexer_keys_cpu(const StoreKeysProblem& p) {
  std::atomic<int64_t> invalid{0};
  parallel_for(p.num_rows, [&](int64_t begin, int64_t end) {
    float x[kIndexerKeyDim];
    int64_t local = 0;
    for (int64_t n = begin; n < end; ++n) {
      const int64_t slot = p.slots.at(n);
      if (slot < 0) continue;
      load_floats(p.keys, p.keys_dtype, n * p.keys_row_stride, kIndexerKeyDim, x);
      local += write_key(p.cache, slot, p.format, p.rotate, x) ? 1 : 0;
    }
    invalid += local;
  });
  add_to_counter(p.invalid_count, invalid.load());
}

void gather_indexer_keys_cpu(const GatherKeysProblem& p) {
  parallel_for(p.num_rows * p.num_columns, [&](int64_t begin, int64_t end) {
    float values[kIndexerKeyDim];
    for (int64_t index = begin; index < end; ++index) {
      const int64_t n = index / p.num_columns, l = index % p.num_columns;
      const int64_t slot = p.slots.at(n, l);
      const int64_t base = n * p.out_row_stride + l * p.out_column_stride;
      if (slot < 0) {
        hdk::detail::store_zeros(p.out, p.out_dtype, base, kIndexerKeyDim);
        continue;
      }
      decode_key(p.cache, slot, p.format, values);
      for (int64_t i = 0; i < kIndexerKeyDim; ++i)
        store_value(p.out, p.out_dtype, base + i, values[i], std::isnan(values[i]));
    }
  });
}

void compress_cpu(const CompressorProblem& p) {
  const int64_t d = p.dim, m = p.ratio, width = p.input_width();
  const int64_t accumulators = p.accumulators();
  std::atomic<int64_t> invalid{0};
  parallel_for(p.num_rows, [&](int64_t begin, int64_t end) {
    std::vector<SoftmaxAccumulator> acc(static_cast<size_t>(accumulators * d));
    std::vector<float> kv(width), score(width), entry(kHeadDim);
    int64_t local = 0;
    for (int64_t n = begin; n < end; ++n) {
      const int64_t state_slot = p.state_slots.at(n);
      if (state_slot < 0) continue;
      float* state = p.state + state_slot * p.state_slot_stride;
      for (int64_t a = 0; a < accumulators; ++a) {
        for (int64_t c = 0; c < d; ++c) {
          const float* base = state + a * p.accumulator_floats();
          acc[a * d + c] = SoftmaxAccumulator{base[c], base[d + c], base[2 * d + c]};
        }
      }
      for (int64_t t = 0; t < p.num_tokens; ++t) {
        const int64_t position = p.positions.at(n) + t;
        const int64_t window = position / m, row = position % m;
        const int64_t offset = n * p.input_row_stride + t * p.input_token_stride;
        load_floats(p.kv, p.input_dtype, offset, width, kv.data());
        load_floats(p.score, p.input_dtype, offset, width, score.data());
        const float* ape = p.ape + row * p.ape_row_stride;
        for (int64_t c = 0; c < width; ++c) {
          const int64_t a = !p.overlap ? 0
                            : c < d    ? first_half_accumulator(window)
                                       : kSecondHalfAccumulator;
          SoftmaxAccumulator& target = acc[a * d + c % d];
          if (row == 0) target = empty_accumulator();
          accumulate(target, score[c] + ape[c], kv[c]);
        }
        if (row != m - 1) continue;

        for (int64_t c = 0; c < d; ++c) {
          if (p.overlap) {
            const SoftmaxAccumulator previous =
                window > 0 ? acc[first_half_accumulator(window + 1) * d + c] : empty_accumulator();
            entry[c] = softmax_merge(previous, acc[kSecondHalfAccumulator * d + c]);
          } else {
            entry[c] = softmax_merge(empty_accumulator(), acc[c]);
          }
        }
        float sum_squares = 0.0f;
        for (int64_t c = 0; c < d; ++c)
          sum_squares += entry[c] * entry[c];
        const float inverse_rms =
            1.0f / std::sqrt(sum_squares / static_cast<float>(d) + p.norm_eps);
        for (int64_t c = 0; c < d; ++c)
          entry[c] = entry[c] * inverse_rms * p.norm_weight[c * p.norm_weight_stride];
        const int64_t first_position = window * m;
        for (int64_t i = 0; i < kRopeDim / 2; ++i) {
          rotate_pair(entry[d - kRopeDim + 2 * i], entry[d - kRopeDim + 2 * i + 1],
                      p.rope_cos[first_position * p.rope_cos_row_stride + i],
                      p.rope_sin[first_position * p.rope_sin_row_stride + i]);
        }
        const int64_t block = p.block_table.at(n, window / p.cache.block_size);
        const int64_t slot = block * p.cache.block_size + window % p.cache.block_size;
        const bool nonfinite = d == kHeadDim
                                   ? write_entry(p.cache, slot, entry.data())
                                   : write_key(p.cache, slot, p.key_format, p.rotate, entry.data());
        local += nonfinite ? 1 : 0;
      }
      for (int64_t a = 0; a < accumulators; ++a) {
        for (int64_t c = 0; c < d; ++c) {
          float* base = state + a * p.accumulator_floats();
          base[c] = acc[a * d + c].max;
          base[d + c] = acc[a * d + c].sum;
          base[2 * d + c] = acc[a * d + c].weighted;
        }
      }
    }
    invalid += local;
  });
  add_to_counter(p.invalid_count, invalid.load());
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
