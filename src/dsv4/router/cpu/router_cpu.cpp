#include "dsv4/router/cpu/router_cpu.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/cpu_dot.h"
#include "core/element_io.h"
#include "core/thread_pool.h"
#include "dsv4/router/router_math.h"
#include "topk/topk_key.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::dot;
using hdk::detail::load_floats;
using hdk::detail::ordered_key;
using hdk::detail::parallel_for;
using hdk::detail::ranked_entry;

// logits[n, e] = hidden[n] · gate_weight[e] in fp32, over experts in parallel: each gate row is
// converted once and meets every token while it is in cache.
void gate_gemm(const RouterProblem& p, float* logits, int64_t logits_row_stride) {
  const int64_t N = p.num_tokens, E = p.num_experts, D = p.hidden_size;
  std::vector<float> hidden(static_cast<size_t>(N * D));
  for (int64_t n = 0; n < N; ++n) {
    load_floats(p.hidden, DType::kBFloat16, n * p.hidden_row_stride, D, &hidden[n * D]);
  }
  parallel_for(E, [&](int64_t begin, int64_t end) {
    std::vector<float> weight(static_cast<size_t>(D));
    for (int64_t e = begin; e < end; ++e) {
      load_floats(p.gate_weight, DType::kBFloat16, e * p.gate_weight_row_stride, D, weight.data());
      for (int64_t n = 0; n < N; ++n) {
        logits[n * logits_row_stride + e] = dot(&hidden[n * D], weight.data(), D);
      }
    }
  });
}

}  // namespace

void route_cpu(const RouterProblem& p) {
  const int64_t N = p.num_tokens, E = p.num_experts, K = p.top_k;
  if (N == 0) return;

  const void* logits = p.logits;
  DType logits_dtype = p.logits_dtype;
  int64_t logits_row_stride = p.logits_row_stride;
  std::vector<float> gemm_out;
  if (p.fused_gate) {
    float* target = p.logits_workspace;
    int64_t stride = p.logits_workspace_row_stride;
    if (target == nullptr) {
      gemm_out.resize(static_cast<size_t>(N * E));
      target = gemm_out.data();
      stride = E;
    }
    gate_gemm(p, target, stride);
    logits = target;
    logits_dtype = DType::kFloat32;
    logits_row_stride = stride;
  }

  std::vector<int64_t> invalid_per_row(static_cast<size_t>(N), 0);
  parallel_for(N, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(E));
    std::vector<float> scores(static_cast<size_t>(E));
    std::vector<uint64_t> ranked(static_cast<size_t>(E));
    std::vector<int32_t> selected(static_cast<size_t>(K));
    for (int64_t n = begin; n < end; ++n) {
      load_floats(logits, logits_dtype, n * logits_row_stride, E, row.data());
      bool invalid = false;
      for (int64_t e = 0; e < E; ++e) {
        scores[e] = router_score(row[e]);
        if (std::isnan(row[e])) invalid = true;
      }
      if (p.mode == RoutingMode::kDense && !invalid) {
        for (int64_t e = 0; e < E; ++e) {
          const float key = p.bias != nullptr ? scores[e] + p.bias[e * p.bias_stride] : scores[e];
          if (std::isnan(key)) invalid = true;
          ranked[e] = ranked_entry(ordered_key(key), static_cast<uint32_t>(e));
        }
        std::partial_sort(ranked.begin(), ranked.begin() + K, ranked.end(),
                          std::greater<uint64_t>());
        for (int64_t j = 0; j < K; ++j) {
          selected[j] = static_cast<int32_t>(hdk::detail::column_of(ranked[j]));
        }
      } else if (p.mode == RoutingMode::kHash) {
        const int64_t token = p.token_id(n);
        for (int64_t j = 0; j < K; ++j)
          selected[j] = p.table_entry(token, j);
      }
      // The sum runs in slot order in fp32, as the CUDA epilogue does.
      float sum = 0.0f;
      if (!invalid) {
        for (int64_t j = 0; j < K; ++j)
          sum += scores[selected[j]];
        invalid = !weights_formable(sum);
      }
      int32_t* ids = p.topk_ids + n * p.topk_ids_row_stride;
      float* weights = p.topk_weights + n * p.topk_weights_row_stride;
      for (int64_t j = 0; j < K; ++j) {
        ids[j] = invalid ? -1 : selected[j];
        weights[j] = invalid ? 0.0f : scores[selected[j]] / sum * p.route_scale;
      }
      invalid_per_row[n] = invalid ? 1 : 0;
    }
  });

  if (p.invalid_count != nullptr) {
    int64_t invalid_rows = 0;
    for (int64_t count : invalid_per_row)
      invalid_rows += count;
    if (p.invalid_count_dtype == DType::kInt64) {
      *static_cast<int64_t*>(p.invalid_count) += invalid_rows;
    } else {
      *static_cast<int32_t*>(p.invalid_count) += static_cast<int32_t>(invalid_rows);
    }
  }
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
