#include "dsv4/attention/reference/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>

#include "core/float_convert.h"
#include "dsv4/attention/attention_validation.h"
#include "dsv4/kv_cache/reference/kv_cache_reference.h"

namespace hdk {
namespace dsv4 {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// log(sum_j e^{x_j}); -inf for an empty list.
double log_sum_exp(const std::vector<double>& x) {
  double top = -std::numeric_limits<double>::infinity();
  for (double v : x)
    top = std::max(top, v);
  if (top == -std::numeric_limits<double>::infinity()) return top;
  double sum = 0.0;
  for (double v : x)
    sum += std::exp(v - top);
  return top + std::log(sum);
}

double load_value(const void* base, DType dtype, int64_t offset) {
  if (dtype == DType::kBFloat16) {
    return hdk::detail::bf16_to_float(static_cast<const uint16_t*>(base)[offset]);
  }
  return static_cast<const float*>(base)[offset];
}

// Row n's queries [H][width] in float64; false when one is not finite.
bool load_queries(const detail::QueryView& q, int64_t n, int64_t heads, int64_t width,
                  std::vector<double>& out) {
  out.resize(static_cast<size_t>(heads * width));
  bool finite = true;
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < width; ++i) {
      out[h * width + i] = load_value(q.data, q.dtype, n * q.row_stride + h * q.head_stride + i);
      finite = finite && std::isfinite(out[h * width + i]);
    }
  }
  return finite;
}

// An FP8 E4M3 code's value: sign, 4 exponent bits (bias 7, subnormals below), 3 mantissa bits;
// NaN for 0x7F and 0xFF.
double e4m3_reference(uint8_t code) {
  const int exponent = (code >> 3) & 0xf, mantissa = code & 7;
  if (exponent == 0xf && mantissa == 7) return kNaN;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                                         : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return code & 0x80 ? -magnitude : magnitude;
}

// An E2M1 code's value (sign bit 3, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6).
double e2m1_reference(uint8_t code) {
  const int exponent = (code >> 1) & 3, mantissa = code & 1;
  const double magnitude =
      exponent == 0 ? mantissa * 0.5 : std::ldexp(1.0 + mantissa * 0.5, exponent - 1);
  return code & 8 ? -magnitude : magnitude;
}

// Row n's indexer queries [H][128] in float64, dequantized from whichever form q takes: exact
// values, E4M3 codes, or packed E2M1 codes x 2^(their group's UE8M0 byte - 127). False when one
// is not finite (a NaN code or scale byte).
bool load_index_queries(const detail::IndexerProblem& p, int64_t n, std::vector<double>& out) {
  const int64_t H = p.num_heads, D = kIndexerKeyDim;
  if (p.q_form == detail::IndexQueryForm::kExact) return load_queries(p.q, n, H, D, out);
  out.resize(static_cast<size_t>(H * D));
  bool finite = true;
  for (int64_t h = 0; h < H; ++h) {
    const uint8_t* codes =
        static_cast<const uint8_t*>(p.q.data) + n * p.q.row_stride + h * p.q.head_stride;
    for (int64_t d = 0; d < D; ++d) {
      double value;
      if (p.q_form == detail::IndexQueryForm::kE4M3) {
        value = e4m3_reference(codes[d]);
      } else {
        const uint8_t scale =
            p.q_scales[n * p.q_scales_row_stride + h * p.q_scales_head_stride + d / 32];
        const uint8_t nibble = d % 2 == 0 ? codes[d / 2] & 0xf : codes[d / 2] >> 4;
        value = scale == 0xff ? kNaN : std::ldexp(e2m1_reference(nibble), scale - 127);
      }
      out[h * D + d] = value;
      finite = finite && std::isfinite(value);
    }
  }
  return finite;
}

void add_to_counter(const TensorView& counter, int64_t count) {
  if (!counter.defined()) return;
  if (counter.dtype == DType::kInt64) {
    *static_cast<int64_t*>(counter.data) += count;
  } else {
    *static_cast<int32_t*>(counter.data) += static_cast<int32_t>(count);
  }
}

}  // namespace

IndexerReference index_topk_reference(const IndexerParams& params) {
  const detail::IndexerProblem p = detail::validate_index_topk(params);
  detail::check_indexer_indices(p);
  const int64_t N = p.num_rows, H = p.num_heads, K = p.top_k, D = kIndexerKeyDim;
  IndexerReference ref;
  ref.num_rows = N;
  ref.top_k = K;
  ref.invalid.assign(N, 0);
  ref.scores.resize(N);
  ref.magnitudes.resize(N);
  ref.indices.assign(N * K, -1);
  ref.top_scores.assign(N * K, -kInf);
  std::vector<double> q;
  // The packed-MXFP4 form's scores are exact per 32-dim group, so its error scale sums the
  // groups' magnitudes instead of the products'.
  const int64_t group = p.q_form == detail::IndexQueryForm::kMXFP4 ? 32 : 1;
  for (int64_t n = 0; n < N; ++n) {
    bool valid = load_index_queries(p, n, q);
    std::vector<double> w(H);
    for (int64_t h = 0; h < H; ++h) {
      w[h] = p.weights[n * p.weights_row_stride + h * p.weights_head_stride];
      valid = valid && std::isfinite(w[h]);
    }
    if (!valid) {
      ref.invalid[n] = 1;
      ++ref.invalid_rows;
      continue;
    }
    const int64_t count = p.num_entries.at(n);
    std::vector<double>& scores = ref.scores[n];
    std::vector<double>& magnitudes = ref.magnitudes[n];
    scores.assign(count, 0.0);
    magnitudes.assign(count, 0.0);
    for (int64_t s = 0; s < count; ++s) {
      const int64_t slot = p.slot(n, s);
      const std::vector<double> key = decode_key_reference(p.keys.page(slot), p.keys.block_size,
                                                           slot % p.keys.block_size, p.format);
      for (int64_t h = 0; h < H; ++h) {
        double dot = 0.0, magnitude = 0.0;
        for (int64_t g = 0; g < D; g += group) {
          double part = 0.0;
          for (int64_t d = g; d < g + group; ++d)
            part += q[h * D + d] * key[d];
          dot += part;
          magnitude += std::fabs(part);
        }
        scores[s] += (dot < 0.0 ? 0.0 : dot) * w[h];  // relu, NaN kept
        magnitudes[s] += magnitude * std::fabs(w[h]);
      }
    }
    std::vector<int64_t> order(count);
    std::iota(order.begin(), order.end(), int64_t{0});
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
      if (std::isnan(scores[a])) return false;
      if (std::isnan(scores[b])) return true;
      return scores[a] > scores[b];
    });
    for (int64_t j = 0; j < std::min(K, count); ++j) {
      ref.indices[n * K + j] = static_cast<int32_t>(order[j]);
      ref.top_scores[n * K + j] = scores[order[j]];
    }
  }
  add_to_counter(params.invalid_count, ref.invalid_rows);
  return ref;
}

SparseDecodeReference sparse_decode_reference(const SparseDecodeParams& params) {
  const detail::SparseDecodeProblem p = detail::validate_sparse_decode(params);
  detail::check_sparse_indices(p);
  const int64_t N = p.num_rows, H = p.num_heads, L = p.list_length(), D = kHeadDim;
  const double scale = params.scale != 0.0f ? params.scale : 1.0 / std::sqrt(512.0);
  SparseDecodeReference ref;
  ref.num_rows = N;
  ref.num_heads = H;
  ref.invalid.assign(N, 0);
  ref.out.assign(N * H * D, 0.0);
  ref.lse.assign(N * H, -kInf);
  ref.score_magnitude.assign(N, 0.0);
  ref.value_magnitude.assign(N, 0.0);
  std::vector<double> q;
  for (int64_t n = 0; n < N; ++n) {
    bool valid = load_queries(p.q, n, H, D, q);
    std::vector<std::vector<double>> entries;
    for (int64_t j = 0; j < L && valid; ++j) {
      const int64_t slot = p.list_slot(n, j);
      if (slot < 0) continue;
      const detail::PagedPool& pool = p.list_pool(j);
      entries.push_back(
          decode_entry_reference(pool.page(slot), pool.block_size, slot % pool.block_size));
      for (double v : entries.back()) {
        if (std::isfinite(v))
          ref.value_magnitude[n] = std::max(ref.value_magnitude[n], std::fabs(v));
      }
    }
    for (int64_t h = 0; h < H && valid; ++h) {
      const double* qh = &q[h * D];
      std::vector<double> s(entries.size());
      double top = p.sink != nullptr ? p.sink[h * p.sink_stride] : -kInf;
      for (size_t j = 0; j < entries.size(); ++j) {
        double dot = 0.0, magnitude = 0.0;
        for (int64_t i = 0; i < D; ++i) {
          dot += qh[i] * entries[j][i];
          magnitude += std::fabs(qh[i] * entries[j][i]);
        }
        s[j] = scale * dot;
        ref.score_magnitude[n] = std::max(ref.score_magnitude[n], std::fabs(scale) * magnitude);
        if (s[j] > top) top = s[j];
      }
      double* o = &ref.out[(n * H + h) * D];
      if (top == -kInf) continue;  // empty list, no sink: o = 0, lse = -inf
      const double sink = p.sink != nullptr ? p.sink[h * p.sink_stride] : -kInf;
      double denominator = std::exp(sink - top);
      for (size_t j = 0; j < entries.size(); ++j) {
        const double weight = std::exp(s[j] - top);
        denominator += weight;
        for (int64_t i = 0; i < D; ++i)
          o[i] += weight * entries[j][i];
      }
      for (int64_t i = 0; i < D; ++i) {
        o[i] /= denominator;
        valid = valid && !std::isnan(o[i]);
      }
      ref.lse[n * H + h] = top + std::log(denominator);
      if (!p.lse_includes_sink) ref.lse[n * H + h] = log_sum_exp(s);
      valid = valid && !std::isnan(ref.lse[n * H + h]);
    }
    if (!valid) {
      ref.invalid[n] = 1;
      ++ref.invalid_rows;
      std::fill(&ref.out[n * H * D], &ref.out[(n + 1) * H * D], 0.0);
      std::fill(&ref.lse[n * H], &ref.lse[(n + 1) * H], kNaN);
    }
  }
  add_to_counter(params.invalid_count, ref.invalid_rows);
  return ref;
}

}  // namespace dsv4
}  // namespace hdk
