#include "dsv4/attention/cpu/attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <vector>

#include "core/cpu_dot.h"
#include "core/element_io.h"
#include "core/thread_pool.h"
#include "dsv4/kv_cache/cpu/entry_decode.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "topk/topk_key.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::dot;
using hdk::detail::load_floats;
using hdk::detail::parallel_for;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Entries per task of the indexer's scoring: one long row still spreads over every thread.
constexpr int64_t kEntryChunk = 256;
// Heads per task of sparse_decode: each task decodes every entry of its row once, so fewer,
// wider tasks decode less; 16 heads keep 16 x 512 fp32 accumulators (32 KiB) in L1/L2.
constexpr int64_t kHeadBlock = 16;

bool all_finite(const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (!std::isfinite(x[i])) return false;
  }
  return true;
}

bool any_nan(const float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) {
    if (std::isnan(x[i])) return true;
  }
  return false;
}

// relu that keeps NaN (a key stored with NaN markers must score NaN, not 0).
inline float relu(float x) {
  return x < 0.0f ? 0.0f : x;
}

// The E2M1 values of 64 packed bytes (dim 2i in the low nibble of byte i), unscaled.
inline void decode_e2m1_values(const uint8_t* packed, float* out) {
  for (int64_t i = 0; i < kIndexerKeyDim; ++i)
    out[i] = decode_e2m1((packed[i / 2] >> (i % 2 ? 4 : 0)) & 0xf);
}

// One 32-dim group's term of the packed-MXFP4 form: its E2M1 dot product `dot` (exact: a multiple
// of 0.25 below 1152 in magnitude) times 2^(q_scale + key_scale - 254), rounded once to fp32
// (exact unless that leaves fp32's normal range); NaN for a NaN key scale.
inline float group_term(float dot, int q_scale, uint8_t key_scale) {
  if (key_scale == kScaleNaN) return kNaN;
  const int e = q_scale + key_scale - 254;
  return e >= -126 && e <= 127 ? dot * power_of_two(e) : std::ldexp(dot, e);
}

}  // namespace

// Scores, by q form (the order of every sum is fixed, so results do not depend on threading):
// - exact and E4M3 (q's codes decoded to fp32, exactly): per entry the key decoded to 128 fp32
//   values, per head the fp32 dot product of cpu_dot.h, relu, times the weight, summed over heads
//   in head order;
// - packed MXFP4: per entry the key's E2M1 values (unscaled) and scale bytes, per head and 32-dim
//   group the fp32 E2M1 dot product (exact), times both scales (group_term), summed over the
//   groups in order 0..3 in fp32, relu, times the weight, summed over heads in head order.
void index_topk_cpu(const IndexerProblem& p) {
  const int64_t N = p.num_rows, H = p.num_heads, K = p.top_k, D = kIndexerKeyDim;
  if (N == 0) return;
  const bool packed = p.q_form == IndexQueryForm::kMXFP4;
  constexpr int64_t kGroups = 4, kGroupSize = kIndexerKeyDim / kGroups;

  // Queries and weights in fp32 (packed MXFP4: the E2M1 values, with their scale bytes apart); a
  // row with a non-finite one (a NaN code or scale byte) sees no entries and is counted.
  std::vector<float> q(static_cast<size_t>(N * H * D)), w(static_cast<size_t>(N * H));
  std::vector<int> q_scales(static_cast<size_t>(packed ? N * H * kGroups : 0));
  std::vector<int64_t> count(static_cast<size_t>(N));
  std::vector<int64_t> score_offset(static_cast<size_t>(N + 1), 0);
  std::vector<int64_t> chunk_offset(static_cast<size_t>(N + 1), 0);
  int64_t invalid_rows = 0;
  for (int64_t n = 0; n < N; ++n) {
    float* qn = &q[n * H * D];
    bool valid = true;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t offset = n * p.q.row_stride + h * p.q.head_stride;  // elements (= bytes)
      const uint8_t* codes = static_cast<const uint8_t*>(p.q.data);
      switch (p.q_form) {
        case IndexQueryForm::kExact:
          load_floats(p.q.data, p.q.dtype, offset, D, qn + h * D);
          break;
        case IndexQueryForm::kE4M3:
          for (int64_t i = 0; i < D; ++i)
            qn[h * D + i] = decode_e4m3(codes[offset + i]);
          break;
        case IndexQueryForm::kMXFP4: {
          decode_e2m1_values(codes + offset, qn + h * D);
          const uint8_t* scales =
              p.q_scales + n * p.q_scales_row_stride + h * p.q_scales_head_stride;
          for (int64_t g = 0; g < kGroups; ++g) {
            q_scales[(n * H + h) * kGroups + g] = scales[g];
            valid = valid && scales[g] != kScaleNaN;
          }
          break;
        }
      }
      w[n * H + h] = p.weights[n * p.weights_row_stride + h * p.weights_head_stride];
    }
    valid = valid && all_finite(qn, H * D) && all_finite(&w[n * H], H);
    invalid_rows += valid ? 0 : 1;
    count[n] = valid ? p.num_entries.at(n) : 0;
    score_offset[n + 1] = score_offset[n] + count[n];
    chunk_offset[n + 1] = chunk_offset[n] + (count[n] + kEntryChunk - 1) / kEntryChunk;
  }

  std::vector<float> scores(static_cast<size_t>(score_offset[N]));
  parallel_for(chunk_offset[N], [&](int64_t begin, int64_t end) {
    float key[kIndexerKeyDim];
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t n = std::upper_bound(chunk_offset.begin(), chunk_offset.end(), chunk) -
                        chunk_offset.begin() - 1;
      const int64_t first = (chunk - chunk_offset[n]) * kEntryChunk;
      const int64_t last = std::min(count[n], first + kEntryChunk);
      const float* qn = &q[n * H * D];
      const float* wn = &w[n * H];
      for (int64_t s = first; s < last; ++s) {
        const int64_t slot = p.slot(n, s);
        float score = 0.0f;
        if (packed) {
          const PagedPool::Place place = p.keys.locate(slot);
          const uint8_t* data = place.page + place.offset * kKeyDataBytes;
          const uint8_t* key_scales = place.page + p.keys.block_size * kKeyDataBytes +
                                      place.offset * key_scale_bytes(KeyFormat::kMXFP4);
          decode_e2m1_values(data, key);
          const int* qs = &q_scales[n * H * kGroups];
          for (int64_t h = 0; h < H; ++h) {
            const float* qh = qn + h * D;
            float sum = 0.0f;
            for (int64_t g = 0; g < kGroups; ++g) {
              const float dot_g = dot(qh + g * kGroupSize, key + g * kGroupSize, kGroupSize);
              sum += group_term(dot_g, qs[h * kGroups + g], key_scales[g]);
            }
            score += relu(sum) * wn[h];
          }
        } else {
          decode_key(p.keys, slot, p.format, key);
          for (int64_t h = 0; h < H; ++h)
            score += relu(dot(qn + h * D, key, D)) * wn[h];
        }
        scores[score_offset[n] + s] = score;
      }
    }
  });

  // Best first, ties to the lower s, NaN below every number: the order of hdk::topk.
  parallel_for(N, [&](int64_t begin, int64_t end) {
    std::vector<uint64_t> ranked;
    for (int64_t n = begin; n < end; ++n) {
      const float* row = &scores[score_offset[n]];
      ranked.resize(static_cast<size_t>(count[n]));
      for (int64_t s = 0; s < count[n]; ++s) {
        ranked[s] =
            hdk::detail::ranked_entry(hdk::detail::ordered_key(row[s]), static_cast<uint32_t>(s));
      }
      const int64_t kept = std::min(K, count[n]);
      std::partial_sort(ranked.begin(), ranked.begin() + kept, ranked.end(),
                        std::greater<uint64_t>());
      int32_t* indices = p.topk_indices + n * p.topk_indices_row_stride;
      float* top_scores =
          p.topk_scores != nullptr ? p.topk_scores + n * p.topk_scores_row_stride : nullptr;
      int32_t* slots =
          p.topk_slots != nullptr ? p.topk_slots + n * p.topk_slots_row_stride : nullptr;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t s = j < kept ? static_cast<int64_t>(hdk::detail::column_of(ranked[j])) : -1;
        indices[j] = static_cast<int32_t>(s);
        if (top_scores != nullptr) top_scores[j] = s >= 0 ? row[s] : -kInf;
        if (slots != nullptr) slots[j] = s >= 0 ? static_cast<int32_t>(p.slot(n, s)) : -1;
      }
    }
  });
  add_to_counter(p.invalid_count, invalid_rows);
}

void sparse_decode_cpu(const SparseDecodeProblem& p) {
  const int64_t N = p.num_rows, H = p.num_heads, L = p.list_length(), D = kHeadDim;
  if (N == 0) return;
  const int64_t head_blocks = (H + kHeadBlock - 1) / kHeadBlock;
  // Per (row, head block): 1 when its q is not finite or its result is NaN. The whole row is then
  // zeroed below, so no head of a bad row looks plausible.
  std::vector<uint8_t> bad(static_cast<size_t>(N * head_blocks), 0);

  parallel_for(N * head_blocks, [&](int64_t begin, int64_t end) {
    std::vector<float> q(static_cast<size_t>(kHeadBlock * D));
    std::vector<float> acc(static_cast<size_t>(kHeadBlock * D));
    std::vector<float> entry(static_cast<size_t>(D));
    float running_max[kHeadBlock], sum[kHeadBlock];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t n = task / head_blocks;
      const int64_t h0 = (task % head_blocks) * kHeadBlock;
      const int64_t heads = std::min(kHeadBlock, H - h0);
      for (int64_t h = 0; h < heads; ++h) {
        load_floats(p.q.data, p.q.dtype, n * p.q.row_stride + (h0 + h) * p.q.head_stride, D,
                    &q[h * D]);
        running_max[h] = -kInf;
        sum[h] = 0.0f;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      if (!all_finite(q.data(), heads * D)) {
        bad[task] = 1;
        continue;
      }
      // One pass over the list with an online softmax per head: each entry is decoded once.
      for (int64_t j = 0; j < L; ++j) {
        const int64_t slot = p.list_slot(n, j);
        if (slot < 0) continue;
        decode_entry(p.list_pool(j), slot, entry.data());
        for (int64_t h = 0; h < heads; ++h) {
          const float s = dot(&q[h * D], entry.data(), D) * p.scale;
          float* a = &acc[h * D];
          if (s > running_max[h]) {  // rescale what was summed against the old maximum
            const float factor = std::exp(running_max[h] - s);
            sum[h] *= factor;
            for (int64_t i = 0; i < D; ++i)
              a[i] *= factor;
            running_max[h] = s;
          }
          // A NaN score (NaN markers) fails the test above and makes weight NaN: the row's
          // result turns NaN and is caught below.
          const float weight = std::exp(s - running_max[h]);
          sum[h] += weight;
          for (int64_t i = 0; i < D; ++i)
            a[i] += weight * entry[i];
        }
      }
      for (int64_t h = 0; h < heads; ++h) {
        const float sink = p.sink != nullptr ? p.sink[(h0 + h) * p.sink_stride] : -kInf;
        // A NaN sink must reach the result (an invalid row) even for an empty list, where
        // std::max(-inf, NaN) would drop it.
        const float top = std::isnan(sink) ? sink : std::max(running_max[h], sink);
        float* a = &acc[h * D];
        float lse = -kInf;
        if (top == -kInf) {  // empty list and no sink: o = 0, lse = -inf
          std::fill(a, a + D, 0.0f);
        } else {
          const float list_weight = std::exp(running_max[h] - top);
          const float denominator = sum[h] * list_weight + std::exp(sink - top);
          const float factor = list_weight / denominator;
          for (int64_t i = 0; i < D; ++i)
            a[i] *= factor;
          lse = top + std::log(denominator);
        }
        if (!p.lse_includes_sink) {
          lse = running_max[h] == -kInf ? -kInf : running_max[h] + std::log(sum[h]);
        }
        if (std::isnan(lse) || any_nan(a, D)) bad[task] = 1;
        hdk::detail::store_floats(p.out, p.out_dtype,
                                  n * p.out_row_stride + (h0 + h) * p.out_head_stride, D, a);
        if (p.lse != nullptr) p.lse[n * p.lse_row_stride + (h0 + h) * p.lse_head_stride] = lse;
      }
    }
  });

  int64_t invalid_rows = 0;
  for (int64_t n = 0; n < N; ++n) {
    if (std::none_of(&bad[n * head_blocks], &bad[(n + 1) * head_blocks],
                     [](uint8_t b) { return b != 0; })) {
      continue;
    }
    ++invalid_rows;
    for (int64_t h = 0; h < H; ++h) {
      hdk::detail::store_zeros(p.out, p.out_dtype, n * p.out_row_stride + h * p.out_head_stride, D);
      if (p.lse != nullptr) p.lse[n * p.lse_row_stride + h * p.lse_head_stride] = kNaN;
    }
  }
  add_to_counter(p.invalid_count, invalid_rows);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
