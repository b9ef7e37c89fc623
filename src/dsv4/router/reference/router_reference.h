// The float64 oracle of hdk::dsv4::route: the spec's formulas written out as plainly as possible,
// for tests and `hdk-bench router --verify`, plus the comparison of a backend's outputs against
// it. Slow on purpose; never a user-facing backend. Shares no semantics code with the backends.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "hdk/dsv4/router.h"

namespace hdk {
namespace dsv4 {

// Every intermediate of the oracle, per row n and expert e (row-major [N, E]).
struct RouterReference {
  int64_t num_tokens = 0;
  int64_t num_experts = 0;
  int64_t top_k = 0;
  bool hash = false;
  double weights_scale = 1.0;           // route_scale
  std::vector<double> logits;           // given, or hidden · gate_weightᵀ in float64
  std::vector<double> logit_magnitude;  // fused gate: sum_d |hidden * gate_weight|, else 0
  std::vector<double> scores;           // s = sqrt(softplus(logit))
  std::vector<double> keys;             // s + bias (dense routing)
  std::vector<uint8_t> invalid;         // [N]: the row gets ids -1 and weights 0
  std::vector<int32_t> ids;             // [N, top_k]
  std::vector<double> weights;          // [N, top_k]
  int64_t invalid_rows = 0;
};

// Computes the oracle for a call whose tensors are readable on the host (validated first).
// out_of_table_is_invalid: the CUDA contract for a token id or table entry out of range (the row
// is invalid and counted); false: the CPU contract (hdk::Error).
RouterReference compute_router_reference(const RouterParams& params,
                                         bool out_of_table_is_invalid = false);

// Same contract as route() for CPU tensors: writes topk_ids, topk_weights, logits_workspace and
// invalid_count, rounding each value once.
void route_reference(const RouterParams& params);

struct RouterCheck {
  bool ok = true;
  std::string first_failure;    // empty when ok
  int64_t near_tie_rows = 0;    // rows whose selection differs from the oracle's within tolerance
  double max_weight_error = 0;  // relative
  double max_logit_error = 0;   // relative to sum_d |hidden * gate_weight|
};

// Compares a backend's outputs (host copies; row strides in elements) with the oracle. A dense
// row may select differently from the oracle only where fp32 rounding can reorder keys: every
// chosen key must be within tolerance of the oracle's ranking, exact ties must go to the lower
// index, and the weights must match the oracle's formula at the chosen ids.
// logits_workspace may be nullptr (not checked).
RouterCheck check_route_outputs(const RouterReference& reference, const int32_t* topk_ids,
                                int64_t ids_row_stride, const float* topk_weights,
                                int64_t weights_row_stride, const float* logits_workspace,
                                int64_t workspace_row_stride);

}  // namespace dsv4
}  // namespace hdk
