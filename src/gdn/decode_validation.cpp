#include "gdn/decode_validation.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/argument_checks.h"

namespace hdk {
namespace gdn {
namespace detail {
namespace {

using hdk::detail::ArgumentChecks;
using hdk::detail::NamedView;

constexpr const char* kOperation = "hdk::gdn::decode";

TokenTensor token_tensor(const TensorView& view, bool variable_length) {
  TokenTensor tensor;
  tensor.data = view.data;
  tensor.dtype = view.dtype;
  tensor.stride_request = variable_length ? 0 : view.strides[0];
  tensor.stride_token = view.strides[1];
  tensor.stride_head = view.strides[2];
  return tensor;
}

IndexView index_view(const TensorView& view) {
  IndexView index;
  if (!view.defined()) return index;
  index.data = view.data;
  index.dtype = view.dtype;
  index.row_stride = view.ndim >= 1 ? view.strides[0] : 0;
  index.column_stride = view.ndim >= 2 ? view.strides[1] : 0;
  return index;
}

}  // namespace

DecodeProblem validate_decode(const DecodeParams& p) {
  const ArgumentChecks check(kOperation);
  DecodeProblem problem;

  check.require(p.q, "q", "(queries, [B, T, H, K])");
  check.require(p.k, "k", "(keys, [B, T, H, K])");
  check.require(p.v, "v", "(values, [B, T, HV, V])");
  check.require(p.state, "state", "(the state pool)");
  check.require(p.out, "out", "(the output, [B, T, HV, V])");

  const std::initializer_list<NamedView> inputs = {
      {&p.q, "q"},
      {&p.k, "k"},
      {&p.v, "v"},
      {&p.A_log, "A_log"},
      {&p.a, "a"},
      {&p.dt_bias, "dt_bias"},
      {&p.b, "b"},
      {&p.g, "g"},
      {&p.beta, "beta"},
      {&p.state_indices, "state_indices"},
      {&p.output_state_indices, "output_state_indices"},
      {&p.num_accepted_tokens, "num_accepted_tokens"},
      {&p.cu_seqlens, "cu_seqlens"}};
  // The pool is read even when it is not written, so it must not alias an output either.
  const std::initializer_list<NamedView> outputs = {
      {&p.out, "out"},
      {&p.intermediate_states, "intermediate_states"},
      {&p.invalid_index_count, "invalid_index_count"},
      {&p.nonfinite_head_count, "nonfinite_head_count"},
      {&p.state, "state"}};
  check.same_device(inputs, outputs);

  // Per-token tensors and the sizes they define.
  const bool variable_length = p.cu_seqlens.defined();
  problem.variable_length = variable_length;
  check.rank_in(p.q, "q", {4}, "[B, T, H, K]");
  check.dtype_in(p.q, "q", {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  check.innermost_contiguous(p.q, "q");
  if (variable_length) {
    check.rank_in(p.cu_seqlens, "cu_seqlens", {1}, "[B + 1]");
    check.dtype_in(p.cu_seqlens, "cu_seqlens", {DType::kInt32, DType::kInt64});
    if (p.cu_seqlens.shape[0] < 1) {
      check.fail("argument 'cu_seqlens' must have at least one entry ([B + 1]), got shape " +
                 p.cu_seqlens.shape_str());
    }
    if (p.q.shape[0] != 1) {
      check.fail("with cu_seqlens, argument 'q' must have shape [1, total_tokens, H, K], got " +
                 p.q.shape_str());
    }
    problem.num_requests = p.cu_seqlens.shape[0] - 1;
  } else {
    problem.num_requests = p.q.shape[0];
  }
  const int64_t dim0 = p.q.shape[0];
  const int64_t dim1 = p.q.shape[1];
  problem.total_tokens = variable_length ? dim1 : dim0 * dim1;
  problem.num_qk_heads = p.q.shape[2];
  problem.head_k = p.q.shape[3];
  const char* token_dims = variable_length ? "[1, total_tokens, H, K]" : "[B, T, H, K]";
  check.shape_is(p.k, "k", {dim0, dim1, problem.num_qk_heads, problem.head_k}, token_dims);
  check.same_dtype(p.k, "k", p.q, "q");
  check.innermost_contiguous(p.k, "k");

  check.rank_in(p.v, "v", {4}, variable_length ? "[1, total_tokens, HV, V]" : "[B, T, HV, V]");
  problem.num_v_heads = p.v.shape[2];
  problem.head_v = p.v.shape[3];
  const char* value_dims = variable_length ? "[1, total_tokens, HV, V]" : "[B, T, HV, V]";
  check.shape_is(p.v, "v", {dim0, dim1, problem.num_v_heads, problem.head_v}, value_dims);
  check.same_dtype(p.v, "v", p.q, "q");
  check.innermost_contiguous(p.v, "v");

  const int64_t H = problem.num_qk_heads;
  const int64_t HV = problem.num_v_heads;
  const int64_t K = problem.head_k;
  const int64_t V = problem.head_v;
  if (H < 1 || K < 1) {
    check.fail("argument 'q' must have at least one head and K >= 1, got shape " + p.q.shape_str());
  }
  if (HV < 1 || V < 1) {
    check.fail("argument 'v' must have at least one head and V >= 1, got shape " + p.v.shape_str());
  }
  if (HV % H != 0) {
    check.fail("the number of value heads HV (" + std::to_string(HV) +
               ", dim 2 of 'v') must be a multiple of the number of query/key heads H (" +
               std::to_string(H) + ", dim 2 of 'q')");
  }

  check.shape_is(p.out, "out", {dim0, dim1, HV, V}, value_dims);
  check.dtype_in(p.out, "out", {DType::kBFloat16, DType::kFloat16, DType::kFloat32});
  check.innermost_contiguous(p.out, "out");

  problem.q = token_tensor(p.q, variable_length);
  problem.k = token_tensor(p.k, variable_length);
  problem.v = token_tensor(p.v, variable_length);
  problem.out = token_tensor(p.out, variable_length);

  // Gating: exactly one complete set.
  const char* head_dims = variable_length ? "[1, total_tokens, HV]" : "[B, T, HV]";
  const bool any_fused = p.A_log.defined() || p.a.defined() || p.dt_bias.defined() || p.b.defined();
  const bool any_precomputed = p.g.defined() || p.beta.defined();
  if (any_fused && any_precomputed) {
    check.fail(
        "give exactly one gating set: either (A_log, a, dt_bias, b) for fused gating or (g, "
        "beta) precomputed, not arguments of both");
  }
  if (!any_fused && !any_precomputed) {
    check.fail(
        "no gating given: pass (A_log, a, dt_bias, b) for fused gating or (g, beta) "
        "precomputed");
  }
  problem.fused_gating = any_fused;
  auto per_token_scalar = [&](const TensorView& view, const char* name,
                              std::initializer_list<DType> dtypes) {
    check.shape_is(view, name, {dim0, dim1, HV}, head_dims);
    check.dtype_in(view, name, dtypes);
    return token_tensor(view, variable_length);
  };
  if (any_fused) {
    const char* why = "for fused gating (A_log, a, dt_bias and b go together)";
    check.require(p.A_log, "A_log", why);
    check.require(p.a, "a", why);
    check.require(p.dt_bias, "dt_bias", why);
    check.require(p.b, "b", why);
    check.shape_is(p.A_log, "A_log", {HV}, "[HV]");
    check.dtype_in(p.A_log, "A_log", {DType::kFloat32});
    check.shape_is(p.dt_bias, "dt_bias", {HV}, "[HV]");
    check.dtype_in(p.dt_bias, "dt_bias", {DType::kFloat32, DType::kBFloat16});
    const std::initializer_list<DType> activations = {DType::kBFloat16, DType::kFloat16,
                                                      DType::kFloat32};
    problem.a = per_token_scalar(p.a, "a", activations);
    problem.b = per_token_scalar(p.b, "b", activations);
    problem.A_log = static_cast<const float*>(p.A_log.data);
    problem.A_log_stride = p.A_log.strides[0];
    problem.dt_bias = p.dt_bias.data;
    problem.dt_bias_dtype = p.dt_bias.dtype;
    problem.dt_bias_stride = p.dt_bias.strides[0];
  } else {
    const char* why = "for precomputed gating (g and beta go together)";
    check.require(p.g, "g", why);
    check.require(p.beta, "beta", why);
    problem.g = per_token_scalar(p.g, "g", {DType::kFloat32});
    problem.beta = per_token_scalar(p.beta, "beta", {DType::kFloat32});
  }

  // The state pool.
  problem.layout = p.layout;
  const bool vk = p.layout == StateLayout::kVK;
  const char* state_dims = vk ? "[P, HV, V, K] (layout kVK)" : "[P, HV, K, V] (layout kKV)";
  check.rank_in(p.state, "state", {4}, state_dims);
  check.dtype_in(p.state, "state", {DType::kFloat32, DType::kBFloat16});
  problem.state_dtype = p.state.dtype;
  problem.pool_size = p.state.shape[0];
  check.shape_is(p.state, "state", {problem.pool_size, HV, vk ? V : K, vk ? K : V}, state_dims);
  const int64_t matrix = V * K;
  const int64_t slot_elements = HV * matrix;
  const bool block_contiguous = p.state.strides[3] == 1 && p.state.strides[2] == (vk ? K : V) &&
                                (HV == 1 || p.state.strides[1] == matrix);
  if (!block_contiguous) {
    check.fail("argument 'state' must store each slot's [HV, " + std::string(vk ? "V, K" : "K, V") +
               "] block contiguously (strides [pitch, " + std::to_string(matrix) + ", " +
               std::to_string(vk ? K : V) + ", 1]), got strides " + p.state.strides_str());
  }
  problem.head_pitch = matrix;
  problem.slot_pitch = problem.pool_size > 1 ? p.state.strides[0] : slot_elements;
  if (problem.slot_pitch < slot_elements) {
    check.fail("argument 'state' has slot pitch (stride of dim 0) " +
               std::to_string(problem.slot_pitch) + " elements, smaller than one slot (HV*V*K = " +
               std::to_string(slot_elements) + "): slots would overlap");
  }
  problem.state = p.state.data;

  // Index tensors.
  const int64_t B = problem.num_requests;
  const std::initializer_list<DType> index_dtypes = {DType::kInt32, DType::kInt64};
  int64_t capacity = variable_length ? problem.total_tokens : dim1;
  if (p.state_indices.defined()) {
    check.rank_in(p.state_indices, "state_indices", {1, 2}, "[B] or [B, C]");
    check.dtype_in(p.state_indices, "state_indices", index_dtypes);
    if (p.state_indices.ndim == 1) {
      check.shape_is(p.state_indices, "state_indices", {B}, "[B]");
      problem.index_mode = IndexMode::kPerRequest;
    } else {
      if (p.state_indices.shape[0] != B) {
        check.fail("argument 'state_indices' must have shape [B, C] with B = " + std::to_string(B) +
                   ", got " + p.state_indices.shape_str());
      }
      const int64_t columns = p.state_indices.shape[1];
      if (!variable_length && columns < dim1) {
        check.fail(
            "argument 'state_indices' of shape [B, C] needs C >= T = " + std::to_string(dim1) +
            " (one slot per token), got " + p.state_indices.shape_str());
      }
      if (columns < 1) {
        check.fail("argument 'state_indices' of shape [B, C] needs C >= 1, got " +
                   p.state_indices.shape_str());
      }
      capacity = std::min(capacity, columns);
      problem.index_columns = columns;
      problem.index_mode = IndexMode::kPerToken;
      check.forbid(p.output_state_indices, "output_state_indices",
                   "with 2-D state_indices (each token's state goes to state_indices[n, t])");
    }
  } else {
    if (problem.pool_size < B) {
      check.fail("without state_indices request n uses slot n, so 'state' needs at least B = " +
                 std::to_string(B) + " slots, got " + std::to_string(problem.pool_size));
    }
    problem.index_mode = IndexMode::kIdentity;
  }
  if (p.num_accepted_tokens.defined()) {
    if (problem.index_mode != IndexMode::kPerToken) {
      check.fail("argument 'num_accepted_tokens' needs 2-D state_indices [B, C]");
    }
    check.shape_is(p.num_accepted_tokens, "num_accepted_tokens", {B}, "[B]");
    check.dtype_in(p.num_accepted_tokens, "num_accepted_tokens", index_dtypes);
  }
  if (p.output_state_indices.defined()) {
    check.shape_is(p.output_state_indices, "output_state_indices", {B}, "[B]");
    check.dtype_in(p.output_state_indices, "output_state_indices", index_dtypes);
  }
  problem.state_indices = index_view(p.state_indices);
  problem.output_state_indices = index_view(p.output_state_indices);
  problem.num_accepted_tokens = index_view(p.num_accepted_tokens);
  problem.cu_seqlens = index_view(p.cu_seqlens);

  // Per-token state cache.
  if (p.intermediate_states.defined()) {
    const char* cache_dims = vk ? "[B, C, HV, V, K]" : "[B, C, HV, K, V]";
    check.rank_in(p.intermediate_states, "intermediate_states", {5}, cache_dims);
    check.same_dtype(p.intermediate_states, "intermediate_states", p.state, "state");
    const int64_t columns = p.intermediate_states.shape[1];
    check.shape_is(p.intermediate_states, "intermediate_states",
                   {B, columns, HV, vk ? V : K, vk ? K : V}, cache_dims);
    if (!variable_length && columns < dim1) {
      check.fail("argument 'intermediate_states' of shape " + std::string(cache_dims) +
                 " needs C >= T = " + std::to_string(dim1) + ", got " +
                 p.intermediate_states.shape_str());
    }
    const TensorView& cache = p.intermediate_states;
    const bool cache_contiguous = cache.strides[4] == 1 && cache.strides[3] == (vk ? K : V) &&
                                  (HV == 1 || cache.strides[2] == matrix);
    if (!cache_contiguous) {
      check.fail("argument 'intermediate_states' must store each [HV, " +
                 std::string(vk ? "V, K" : "K, V") + "] block contiguously, got strides " +
                 cache.strides_str());
    }
    capacity = std::min(capacity, columns);
    problem.intermediate_states = cache.data;
    problem.intermediate_stride_request = cache.strides[0];
    problem.intermediate_stride_token = cache.strides[1];
  }
  if (p.max_tokens_per_request < 0) {
    check.fail("option 'max_tokens_per_request' must be >= 0 (0 = no bound), got " +
               std::to_string(p.max_tokens_per_request));
  }
  if (p.max_tokens_per_request > 0) {
    if (!variable_length && dim1 > p.max_tokens_per_request) {
      check.fail("option 'max_tokens_per_request' is " + std::to_string(p.max_tokens_per_request) +
                 " but every request has T = " + std::to_string(dim1) + " tokens (dim 1 of 'q')");
    }
    capacity = std::min(capacity, p.max_tokens_per_request);
  }
  problem.token_capacity = capacity;
  problem.tokens_per_request = variable_length ? capacity : dim1;

  struct Counter {
    const TensorView& view;
    const char* name;
    void*& data;
    DType& dtype;
  };
  for (const Counter& counter :
       {Counter{p.invalid_index_count, "invalid_index_count", problem.invalid_index_count,
                problem.invalid_index_count_dtype},
        Counter{p.nonfinite_head_count, "nonfinite_head_count", problem.nonfinite_head_count,
                problem.nonfinite_head_count_dtype}}) {
    if (!counter.view.defined()) continue;
    if (!(counter.view.ndim == 0 || (counter.view.ndim == 1 && counter.view.shape[0] == 1))) {
      check.fail("argument '" + std::string(counter.name) +
                 "' must be a scalar or have shape [1], got " + counter.view.shape_str());
    }
    check.dtype_in(counter.view, counter.name, index_dtypes);
    counter.data = counter.view.data;
    counter.dtype = counter.view.dtype;
  }

  // Options.
  if (!std::isfinite(p.scale)) {
    check.fail("option 'scale' must be finite (0 selects K^-0.5), got " + std::to_string(p.scale));
  }
  problem.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(K));
  if (!(p.l2norm_eps >= 0.0f) || !std::isfinite(p.l2norm_eps)) {
    check.fail("option 'l2norm_eps' must be finite and >= 0, got " + std::to_string(p.l2norm_eps));
  }
  if (!(p.softplus_beta > 0.0f) || !std::isfinite(p.softplus_beta)) {
    check.fail("option 'softplus_beta' must be finite and > 0, got " +
               std::to_string(p.softplus_beta));
  }
  if (std::isnan(p.softplus_threshold)) check.fail("option 'softplus_threshold' must not be NaN");
  problem.use_qk_l2norm = p.use_qk_l2norm;
  problem.l2norm_eps = p.l2norm_eps;
  problem.softplus_beta = p.softplus_beta;
  problem.softplus_threshold = p.softplus_threshold;
  problem.update_state = p.update_state;

  // Aliasing: what the call writes must not share bytes with anything else it touches.
  check.disjoint_outputs(outputs, inputs);
  return problem;
}

void check_index_data(const DecodeProblem& problem) {
  const ArgumentChecks check(kOperation);
  // Who writes and who reads each slot, to find writes that race with another request.
  std::unordered_map<int64_t, int64_t> writer_of;
  std::unordered_map<int64_t, std::vector<int64_t>> readers_of;
  auto describe = [](int64_t n) { return "request " + std::to_string(n); };
  for (int64_t n = 0; n < problem.num_requests; ++n) {
    const RequestPlan plan = plan_request(problem, n);
    if (plan.invalid) {
      std::string detail;
      if (problem.variable_length) {
        detail = "cu_seqlens[" + std::to_string(n) + "..] = (" +
                 std::to_string(problem.cu_seqlens.at(n)) + ", " +
                 std::to_string(problem.cu_seqlens.at(n + 1)) + ") with total_tokens " +
                 std::to_string(problem.total_tokens) + " and capacity " +
                 std::to_string(problem.token_capacity) + "; ";
      }
      if (problem.num_accepted_tokens.given()) {
        detail += "num_accepted_tokens = " + std::to_string(problem.num_accepted_tokens.at(n)) +
                  " (allowed 1.." + std::to_string(problem.index_columns) + "); ";
      }
      check.fail("check_indices: " + describe(n) + " has an index that cannot be honoured (" +
                 detail + "pool size P = " + std::to_string(problem.pool_size) +
                 "): an index >= P, an accepted-token count out of range or a bad cu_seqlens "
                 "range");
    }
    if (plan.read_slot < 0) continue;
    readers_of[plan.read_slot].push_back(n);
    auto note_write = [&](int64_t slot) {
      if (slot < 0) return;
      auto [it, inserted] = writer_of.emplace(slot, n);
      if (!inserted && it->second != n) {
        check.fail("check_indices: slot " + std::to_string(slot) + " is written by " +
                   describe(it->second) + " and by " + describe(n));
      }
    };
    if (problem.index_mode == IndexMode::kPerToken) {
      for (int64_t t = 0; t < plan.num_tokens; ++t)
        note_write(per_token_write_slot(problem, n, t));
    } else {
      note_write(plan.final_slot);
    }
  }
  for (const auto& [slot, writer] : writer_of) {
    auto readers = readers_of.find(slot);
    if (readers == readers_of.end()) continue;
    for (int64_t reader : readers->second) {
      if (reader == writer) continue;
      check.fail("check_indices: slot " + std::to_string(slot) + " is written by " +
                 describe(writer) + " and read by " + describe(reader) +
                 "; the result would depend on the order requests run in");
    }
  }
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
