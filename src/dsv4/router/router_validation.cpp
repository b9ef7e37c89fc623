#include "dsv4/router/router_validation.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/argument_checks.h"
#include "hdk/topk.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::ArgumentChecks;
using hdk::detail::NamedView;

constexpr const char* kOperation = "hdk::dsv4::route";

}  // namespace

RouterProblem validate_route(const RouterParams& p) {
  const ArgumentChecks check(kOperation);
  RouterProblem problem;

  check.require(p.topk_ids, "topk_ids", "(the selected experts, [N, top_k] int32)");
  check.require(p.topk_weights, "topk_weights", "(the routing weights, [N, top_k] fp32)");

  const std::initializer_list<NamedView> inputs = {
      {&p.logits, "logits"}, {&p.hidden, "hidden"},       {&p.gate_weight, "gate_weight"},
      {&p.bias, "bias"},     {&p.token_ids, "token_ids"}, {&p.tid2eid, "tid2eid"}};
  const std::initializer_list<NamedView> outputs = {{&p.topk_ids, "topk_ids"},
                                                    {&p.topk_weights, "topk_weights"},
                                                    {&p.logits_workspace, "logits_workspace"},
                                                    {&p.invalid_count, "invalid_count"}};
  check.same_device(inputs, outputs);
  const Device device = p.topk_ids.device;

  // Scores: logits, or hidden with gate_weight.
  const bool fused = p.hidden.defined() || p.gate_weight.defined();
  if (fused && p.logits.defined()) {
    check.fail(
        "give either 'logits' or 'hidden' with 'gate_weight' (the fused gate GEMM), not both");
  }
  if (!fused && !p.logits.defined()) {
    check.fail(
        "no scores given: pass 'logits' [N, E], or 'hidden' [N, D] with 'gate_weight' [E, D]; "
        "hash routing needs them too, for the weights");
  }
  problem.fused_gate = fused;
  int64_t N = 0;
  int64_t E = 0;
  if (fused) {
    const char* why = "for the fused gate (hidden and gate_weight go together)";
    check.require(p.hidden, "hidden", why);
    check.require(p.gate_weight, "gate_weight", why);
    check.rank_in(p.hidden, "hidden", {2}, "[N, D]");
    check.dtype_in(p.hidden, "hidden", {DType::kBFloat16});
    check.innermost_contiguous(p.hidden, "hidden");
    check.rank_in(p.gate_weight, "gate_weight", {2}, "[E, D]");
    check.dtype_in(p.gate_weight, "gate_weight", {DType::kBFloat16});
    check.innermost_contiguous(p.gate_weight, "gate_weight");
    N = p.hidden.shape[0];
    const int64_t D = p.hidden.shape[1];
    E = p.gate_weight.shape[0];
    check.shape_is(p.gate_weight, "gate_weight", {E, D}, "[E, D]");
    if (D < 1) check.fail("argument 'hidden' must have D >= 1, got shape " + p.hidden.shape_str());
    problem.hidden_size = D;
    problem.hidden = static_cast<const uint16_t*>(p.hidden.data);
    problem.hidden_row_stride = p.hidden.strides[0];
    problem.gate_weight = static_cast<const uint16_t*>(p.gate_weight.data);
    problem.gate_weight_row_stride = p.gate_weight.strides[0];
  } else {
    check.rank_in(p.logits, "logits", {2}, "[N, E]");
    check.dtype_in(p.logits, "logits", {DType::kFloat32, DType::kBFloat16});
    check.innermost_contiguous(p.logits, "logits");
    N = p.logits.shape[0];
    E = p.logits.shape[1];
    problem.logits = p.logits.data;
    problem.logits_dtype = p.logits.dtype;
    problem.logits_row_stride = p.logits.strides[0];
  }
  if (E < 1) {
    check.fail(std::string("argument '") + (fused ? "gate_weight" : "logits") +
               "' must have at least one expert (E >= 1), got E = " + std::to_string(E));
  }
  problem.num_tokens = N;
  problem.num_experts = E;

  // Options.
  if (p.top_k < 1) {
    check.fail("option 'top_k' must be at least 1, got " + std::to_string(p.top_k));
  }
  if (p.top_k > kMaxTopK) {
    check.fail("option 'top_k' must be at most " + std::to_string(kMaxTopK) + ", got " +
               std::to_string(p.top_k));
  }
  if (p.top_k > E) {
    check.fail("option 'top_k' must be at most E = " + std::to_string(E) +
               " (the number of experts), got " + std::to_string(p.top_k));
  }
  problem.top_k = p.top_k;
  if (!std::isfinite(p.route_scale)) {
    check.fail("option 'route_scale' must be finite, got " + std::to_string(p.route_scale));
  }
  problem.route_scale = p.route_scale;

  // Routing mode.
  const bool hash = p.token_ids.defined() || p.tid2eid.defined();
  problem.mode = hash ? RoutingMode::kHash : RoutingMode::kDense;
  if (hash) {
    const char* why = "for hash routing (token_ids and tid2eid go together)";
    check.require(p.token_ids, "token_ids", why);
    check.require(p.tid2eid, "tid2eid", why);
    check.forbid(p.bias, "bias",
                 "with hash routing (tid2eid fixes the experts; bias only affects selection)");
    check.shape_is(p.token_ids, "token_ids", {N}, "[N]");
    check.dtype_in(p.token_ids, "token_ids", {DType::kInt32, DType::kInt64});
    check.rank_in(p.tid2eid, "tid2eid", {2}, "[vocab, top_k]");
    check.shape_is(p.tid2eid, "tid2eid", {p.tid2eid.shape[0], p.top_k}, "[vocab, top_k]");
    check.dtype_in(p.tid2eid, "tid2eid", {DType::kInt32});
    problem.vocab_size = p.tid2eid.shape[0];
    problem.token_ids = p.token_ids.data;
    problem.token_ids_dtype = p.token_ids.dtype;
    problem.token_ids_stride = p.token_ids.strides[0];
    problem.tid2eid = static_cast<const int32_t*>(p.tid2eid.data);
    problem.tid2eid_row_stride = p.tid2eid.strides[0];
    problem.tid2eid_column_stride = p.tid2eid.strides[1];
  }
  if (p.bias.defined()) {
    check.shape_is(p.bias, "bias", {E}, "[E]");
    check.dtype_in(p.bias, "bias", {DType::kFloat32});
    problem.bias = static_cast<const float*>(p.bias.data);
    problem.bias_stride = p.bias.strides[0];
  }

  // Outputs.
  check.shape_is(p.topk_ids, "topk_ids", {N, p.top_k}, "[N, top_k]");
  check.dtype_in(p.topk_ids, "topk_ids", {DType::kInt32});
  check.innermost_contiguous(p.topk_ids, "topk_ids");
  check.shape_is(p.topk_weights, "topk_weights", {N, p.top_k}, "[N, top_k]");
  check.dtype_in(p.topk_weights, "topk_weights", {DType::kFloat32});
  check.innermost_contiguous(p.topk_weights, "topk_weights");
  problem.topk_ids = static_cast<int32_t*>(p.topk_ids.data);
  problem.topk_ids_row_stride = p.topk_ids.strides[0];
  problem.topk_weights = static_cast<float*>(p.topk_weights.data);
  problem.topk_weights_row_stride = p.topk_weights.strides[0];

  if (p.logits_workspace.defined()) {
    if (!fused) {
      check.fail(
          "argument 'logits_workspace' is only for the fused gate (hidden + gate_weight); with "
          "'logits' given there is nothing to compute into it");
    }
    const TensorView& workspace = p.logits_workspace;
    const int64_t slabs = route_workspace_slabs(N);
    if (workspace.ndim != 3 || workspace.shape[0] < slabs || workspace.shape[1] != N ||
        workspace.shape[2] != E) {
      check.fail("argument 'logits_workspace' must have shape [S, N, E] = " +
                 hdk::detail::shape_string({slabs, N, E}) +
                 " (S = route_workspace_slabs(N); more slabs are allowed), got " +
                 workspace.shape_str());
    }
    check.dtype_in(workspace, "logits_workspace", {DType::kFloat32});
    check.innermost_contiguous(workspace, "logits_workspace");
    problem.logits_workspace = static_cast<float*>(workspace.data);
    problem.logits_workspace_slab_stride = workspace.strides[0];
    problem.logits_workspace_row_stride = workspace.strides[1];
    problem.logits_workspace_slabs = workspace.shape[0];
  } else if (fused && device.is_cuda()) {
    check.fail("argument 'logits_workspace' ([S, N, E] = " +
               hdk::detail::shape_string({route_workspace_slabs(N), N, E}) + " fp32 on " +
               device.str() +
               ", S = route_workspace_slabs(N)) is required for the fused gate on CUDA: it holds "
               "the GEMM's partial logits between the GEMM and the per-row epilogue, and hdk "
               "allocates nothing on the call path");
  }

  if (p.invalid_count.defined()) {
    const TensorView& counter = p.invalid_count;
    if (!(counter.ndim == 0 || (counter.ndim == 1 && counter.shape[0] == 1))) {
      check.fail("argument 'invalid_count' must be a scalar or have shape [1], got " +
                 counter.shape_str());
    }
    check.dtype_in(counter, "invalid_count", {DType::kInt32, DType::kInt64});
    problem.invalid_count = counter.data;
    problem.invalid_count_dtype = counter.dtype;
  }

  check.disjoint_outputs(outputs, inputs);
  return problem;
}

void check_hash_indices(const RouterProblem& p) {
  if (p.mode != RoutingMode::kHash) return;
  const ArgumentChecks check(kOperation);
  for (int64_t n = 0; n < p.num_tokens; ++n) {
    const int64_t token = p.token_id(n);
    if (token < 0 || token >= p.vocab_size) {
      check.fail("token_ids[" + std::to_string(n) + "] = " + std::to_string(token) +
                 " is outside tid2eid, which has " + std::to_string(p.vocab_size) +
                 " rows (expected 0.." + std::to_string(p.vocab_size - 1) + ")");
    }
    for (int64_t j = 0; j < p.top_k; ++j) {
      const int32_t expert = p.table_entry(token, j);
      if (expert < 0 || expert >= p.num_experts) {
        check.fail("tid2eid[" + std::to_string(token) + ", " + std::to_string(j) +
                   "] = " + std::to_string(expert) + " (used by token_ids[" + std::to_string(n) +
                   "]) is not an expert id: expected 0.." + std::to_string(p.num_experts - 1));
      }
    }
  }
}

}  // namespace detail

int64_t route_workspace_slabs(int64_t num_tokens) {
  const int64_t row_blocks = std::max<int64_t>(
      1, (num_tokens + detail::kWorkspaceRowBlock - 1) / detail::kWorkspaceRowBlock);
  return std::max<int64_t>(1, detail::kWorkspaceMaxSlabs / row_blocks);
}

}  // namespace dsv4
}  // namespace hdk
