#include "dsv4/router/reference/router_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>

#include "core/float_convert.h"
#include "dsv4/router/router_validation.h"
#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace {

double load_real(const TensorView& view, int64_t i, int64_t j) {
  const int64_t offset = i * view.strides[0] + j * view.strides[1];
  if (view.dtype == DType::kBFloat16) {
    return hdk::detail::bf16_to_float(static_cast<const uint16_t*>(view.data)[offset]);
  }
  return static_cast<const float*>(view.data)[offset];
}

int64_t load_integer(const TensorView& view, int64_t i, int64_t j = 0) {
  int64_t offset = i * view.strides[0];
  if (view.ndim > 1) offset += j * view.strides[1];
  if (view.dtype == DType::kInt64) return static_cast<const int64_t*>(view.data)[offset];
  return static_cast<const int32_t*>(view.data)[offset];
}

// log(1 + e^x) without overflow for large x; NaN stays NaN, -inf gives 0, +inf gives +inf.
double softplus(double x) {
  return x > 0 ? x + std::log1p(std::exp(-x)) : std::log1p(std::exp(x));
}

}  // namespace

RouterReference compute_router_reference(const RouterParams& p, bool out_of_table_is_invalid) {
  const detail::RouterProblem problem = detail::validate_route(p);
  if (!p.topk_ids.device.is_cpu()) {
    throw Error("hdk::dsv4::compute_router_reference: tensors must be readable on the host");
  }
  const int64_t N = problem.num_tokens;
  const int64_t E = problem.num_experts;
  const int64_t K = problem.top_k;
  RouterReference ref;
  ref.num_tokens = N;
  ref.num_experts = E;
  ref.top_k = K;
  ref.hash = problem.mode == detail::RoutingMode::kHash;
  ref.weights_scale = p.route_scale;
  ref.logits.assign(N * E, 0.0);
  ref.logit_magnitude.assign(N * E, 0.0);
  ref.scores.assign(N * E, 0.0);
  ref.keys.assign(N * E, 0.0);
  ref.invalid.assign(N, 0);
  ref.ids.assign(N * K, -1);
  ref.weights.assign(N * K, 0.0);

  std::vector<int64_t> order(E);
  for (int64_t n = 0; n < N; ++n) {
    bool invalid = false;
    for (int64_t e = 0; e < E; ++e) {
      double logit = 0.0;
      double magnitude = 0.0;
      if (problem.fused_gate) {
        for (int64_t d = 0; d < problem.hidden_size; ++d) {
          const double product = load_real(p.hidden, n, d) * load_real(p.gate_weight, e, d);
          logit += product;
          magnitude += std::fabs(product);
        }
      } else {
        logit = load_real(p.logits, n, e);
      }
      const double s = std::sqrt(softplus(logit));
      const double bias =
          p.bias.defined() ? static_cast<const float*>(p.bias.data)[e * p.bias.strides[0]] : 0.0;
      ref.logits[n * E + e] = logit;
      ref.logit_magnitude[n * E + e] = magnitude;
      ref.scores[n * E + e] = s;
      ref.keys[n * E + e] = s + bias;
      if (std::isnan(logit)) invalid = true;
      if (!ref.hash && std::isnan(s + bias)) invalid = true;
    }

    int32_t* ids = &ref.ids[n * K];
    if (ref.hash) {
      const int64_t token = load_integer(p.token_ids, n);
      const int64_t vocab = p.tid2eid.shape[0];
      if (token < 0 || token >= vocab) {
        if (!out_of_table_is_invalid) {
          throw Error("hdk::dsv4::route (reference): token_ids[" + std::to_string(n) +
                      "] = " + std::to_string(token) + " is outside tid2eid");
        }
        invalid = true;
      } else {
        for (int64_t j = 0; j < K; ++j) {
          const int64_t expert = load_integer(p.tid2eid, token, j);
          if (expert < 0 || expert >= E) {
            if (!out_of_table_is_invalid) {
              throw Error("hdk::dsv4::route (reference): tid2eid[" + std::to_string(token) + ", " +
                          std::to_string(j) + "] is not an expert id");
            }
            invalid = true;
          } else {
            ids[j] = static_cast<int32_t>(expert);
          }
        }
      }
    } else if (!invalid) {
      const double* keys = &ref.keys[n * E];
      std::iota(order.begin(), order.end(), int64_t{0});
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t a, int64_t b) { return keys[a] > keys[b]; });
      for (int64_t j = 0; j < K; ++j)
        ids[j] = static_cast<int32_t>(order[j]);
    }

    if (!invalid) {
      double sum = 0.0;
      for (int64_t j = 0; j < K; ++j)
        sum += ref.scores[n * E + ids[j]];
      if (!(sum > 0.0) || !std::isfinite(sum)) invalid = true;
      for (int64_t j = 0; j < K && !invalid; ++j) {
        ref.weights[n * K + j] = ref.scores[n * E + ids[j]] / sum * p.route_scale;
      }
    }
    if (invalid) {
      ref.invalid[n] = 1;
      ++ref.invalid_rows;
      std::fill(ids, ids + K, -1);
      std::fill(&ref.weights[n * K], &ref.weights[n * K] + K, 0.0);
    }
  }
  return ref;
}

void route_reference(const RouterParams& p) {
  const RouterReference ref = compute_router_reference(p, false);
  const int64_t N = ref.num_tokens, E = ref.num_experts, K = ref.top_k;
  for (int64_t n = 0; n < N; ++n) {
    int32_t* ids = static_cast<int32_t*>(p.topk_ids.data) + n * p.topk_ids.strides[0];
    float* weights = static_cast<float*>(p.topk_weights.data) + n * p.topk_weights.strides[0];
    for (int64_t j = 0; j < K; ++j) {
      ids[j] = ref.ids[n * K + j];
      weights[j] = static_cast<float>(ref.weights[n * K + j]);
    }
    if (p.logits_workspace.defined()) {
      float* row = static_cast<float*>(p.logits_workspace.data) + n * p.logits_workspace.strides[1];
      for (int64_t e = 0; e < E; ++e)
        row[e] = static_cast<float>(ref.logits[n * E + e]);
    }
  }
  if (p.invalid_count.defined() && ref.invalid_rows > 0) {
    if (p.invalid_count.dtype == DType::kInt64) {
      *static_cast<int64_t*>(p.invalid_count.data) += ref.invalid_rows;
    } else {
      *static_cast<int32_t*>(p.invalid_count.data) += static_cast<int32_t>(ref.invalid_rows);
    }
  }
}

namespace {

// How far a backend's fp32 value may be from the oracle: fp32 rounding of the score path, plus,
// for the fused gate, fp32 accumulation over D (bounded by the sum of |products|).
double logit_tolerance(const RouterReference& ref, int64_t index) {
  return 1e-5 * ref.logit_magnitude[index] + 1e-6 * std::fabs(ref.logits[index]);
}

double key_tolerance(const RouterReference& ref, int64_t index) {
  // |ds/dlogit| <= 1/2 everywhere.
  return 1e-6 * (1.0 + std::fabs(ref.keys[index])) + 0.5 * logit_tolerance(ref, index);
}

}  // namespace

RouterCheck check_route_outputs(const RouterReference& ref, const int32_t* topk_ids,
                                int64_t ids_row_stride, const float* topk_weights,
                                int64_t weights_row_stride, const float* logits_workspace,
                                int64_t workspace_row_stride) {
  RouterCheck result;
  const int64_t N = ref.num_tokens, E = ref.num_experts, K = ref.top_k;
  auto fail = [&](int64_t n, const std::string& what) {
    if (result.ok) result.first_failure = "row " + std::to_string(n) + ": " + what;
    result.ok = false;
  };
  std::vector<uint8_t> chosen(E);
  for (int64_t n = 0; n < N; ++n) {
    const int32_t* ids = topk_ids + n * ids_row_stride;
    const float* weights = topk_weights + n * weights_row_stride;
    const int32_t* want_ids = &ref.ids[n * K];

    if (logits_workspace != nullptr) {
      const float* row = logits_workspace + n * workspace_row_stride;
      for (int64_t e = 0; e < E; ++e) {
        const double want = ref.logits[n * E + e];
        const double got = row[e];
        if (std::isnan(want) != std::isnan(got) ||
            (!std::isnan(want) && std::fabs(got - want) > logit_tolerance(ref, n * E + e))) {
          fail(n, "logits_workspace[" + std::to_string(e) + "] = " + std::to_string(got) +
                      ", oracle " + std::to_string(want));
        }
        if (!std::isnan(want) && ref.logit_magnitude[n * E + e] > 0) {
          result.max_logit_error = std::max(result.max_logit_error,
                                            std::fabs(got - want) / ref.logit_magnitude[n * E + e]);
        }
      }
    }

    if (ref.invalid[n]) {
      for (int64_t j = 0; j < K; ++j) {
        if (ids[j] != -1 || weights[j] != 0.0f) {
          fail(n, "an invalid row must have ids -1 and weights 0, got id " +
                      std::to_string(ids[j]) + " weight " + std::to_string(weights[j]) +
                      " at slot " + std::to_string(j));
          break;
        }
      }
      continue;
    }

    bool ids_ok = true;
    std::fill(chosen.begin(), chosen.end(), 0);
    for (int64_t j = 0; j < K; ++j) {
      if (ids[j] < 0 || ids[j] >= E) {
        fail(n, "topk_ids[" + std::to_string(j) + "] = " + std::to_string(ids[j]) +
                    " is not an expert id (the oracle's row is valid)");
        ids_ok = false;
        break;
      }
      if (ref.hash) {
        if (ids[j] != want_ids[j]) {
          fail(n, "hash routing: topk_ids[" + std::to_string(j) + "] = " + std::to_string(ids[j]) +
                      ", tid2eid says " + std::to_string(want_ids[j]));
          ids_ok = false;
        }
      } else {
        if (chosen[ids[j]]) {
          fail(n, "expert " + std::to_string(ids[j]) + " selected twice");
          ids_ok = false;
        }
        chosen[ids[j]] = 1;
      }
    }
    if (!ids_ok) continue;

    if (!ref.hash) {
      const double* keys = &ref.keys[n * E];
      auto tolerance = [&](int64_t e) { return key_tolerance(ref, n * E + e); };
      for (int64_t j = 0; j + 1 < K; ++j) {
        const int64_t a = ids[j], b = ids[j + 1];
        const bool ordered =
            keys[a] == keys[b] ? a < b : keys[a] >= keys[b] - tolerance(a) - tolerance(b);
        if (!ordered) {
          fail(n, "slots " + std::to_string(j) + ", " + std::to_string(j + 1) + " hold experts " +
                      std::to_string(a) + ", " + std::to_string(b) + " out of order (keys " +
                      std::to_string(keys[a]) + ", " + std::to_string(keys[b]) + ")");
        }
      }
      for (int64_t u = 0; u < E; ++u) {
        if (chosen[u]) continue;
        for (int64_t j = 0; j < K; ++j) {
          const int64_t a = ids[j];
          const bool beaten =
              keys[u] == keys[a] ? u > a : keys[u] <= keys[a] + tolerance(a) + tolerance(u);
          if (!beaten) {
            fail(n, "expert " + std::to_string(u) + " (key " + std::to_string(keys[u]) +
                        ") ranks above selected expert " + std::to_string(a) + " (key " +
                        std::to_string(keys[a]) + ") but was not selected");
            break;
          }
        }
      }
      if (!std::equal(ids, ids + K, want_ids)) ++result.near_tie_rows;
    }

    // Weights: the oracle's formula at the backend's ids.
    double sum = 0.0;
    double worst_logit_tolerance = 0.0;
    for (int64_t j = 0; j < K; ++j) {
      sum += ref.scores[n * E + ids[j]];
      worst_logit_tolerance = std::max(worst_logit_tolerance, logit_tolerance(ref, n * E + ids[j]));
    }
    const double scale = ref.weights_scale;
    const double tolerance = 1e-5 + 2.0 * worst_logit_tolerance;
    for (int64_t j = 0; j < K; ++j) {
      const double want = ref.scores[n * E + ids[j]] / sum * scale;
      const double error = std::fabs(weights[j] - want) / std::max(std::fabs(want), 1e-6);
      result.max_weight_error = std::max(result.max_weight_error, error);
      if (!(error <= tolerance)) {
        fail(n, "topk_weights[" + std::to_string(j) + "] = " + std::to_string(weights[j]) +
                    ", oracle " + std::to_string(want) + " (relative error " +
                    std::to_string(error) + ")");
      }
    }
  }
  return result;
}

}  // namespace dsv4
}  // namespace hdk
