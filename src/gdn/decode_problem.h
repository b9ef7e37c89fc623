// A validated GDN decode call, reduced to sizes, modes, pointers and element strides.
// validate_decode() builds it; the CPU and CUDA backends read nothing else. It is trivially
// copyable so a CUDA kernel can take it by value.
#pragma once

#include <cstdint>

#include "core/host_device.h"
#include "core/index_view.h"
#include "hdk/dtype.h"
#include "hdk/gdn/decode.h"

namespace hdk {
namespace gdn {
namespace detail {

enum class IndexMode : uint8_t {
  kIdentity,    // no state_indices: request n uses slot n
  kPerRequest,  // state_indices [B]
  kPerToken,    // state_indices [B, C] (+ num_accepted_tokens)
};

// One per-token input or output: [B, T, heads, dim] or [1, total_tokens, heads, dim].
struct TokenTensor {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t stride_request = 0;  // 0 in variable-length mode (dim 0 has size 1)
  int64_t stride_token = 0;
  int64_t stride_head = 0;  // per-head scalars (a, b, g, beta) use this as their last stride
};

using hdk::detail::IndexView;

struct DecodeProblem {
  // Field order: what a fixed-length, per-request-indexed step reads comes first and the rest
  // last. A kernel's parameters are read through the SM's constant cache, which starts cold at
  // every launch and serves its misses one 64-byte line after another (60-75 ns each on an
  // H100, measured): at small batches every line a warp touches on its way to the state is on
  // the step's critical path.

  // Sizes.
  int64_t tokens_per_request = 0;  // T; in variable-length mode the largest allowed (= capacity)
  int64_t num_qk_heads = 0;        // H
  int64_t num_v_heads = 0;         // HV
  int64_t head_v = 0;              // V
  int64_t pool_size = 0;           // P
  int64_t slot_pitch = 0;          // elements between consecutive pool slots
  int64_t head_pitch = 0;          // elements between consecutive heads of one slot (= V * K)

  // Modes.
  bool variable_length = false;
  IndexMode index_mode = IndexMode::kIdentity;
  bool fused_gating = true;
  gdn::StateLayout layout = gdn::StateLayout::kVK;
  DType state_dtype = DType::kFloat32;
  bool use_qk_l2norm = true;
  bool update_state = true;
  float scale = 0.0f;  // resolved: never 0
  float l2norm_eps = 1e-6f;
  float softplus_beta = 1.0f;
  float softplus_threshold = 20.0f;

  // Per-token tensors; a, b (fused gating) or g, beta (below), stride_head is the stride of
  // the HV dim.
  TokenTensor q, k, v, out;
  TokenTensor a, b;

  // Per-head parameters of fused gating.
  const float* A_log = nullptr;
  int64_t A_log_stride = 0;
  const void* dt_bias = nullptr;
  DType dt_bias_dtype = DType::kFloat32;
  int64_t dt_bias_stride = 0;

  // State pool and per-token cache.
  void* state = nullptr;
  void* intermediate_states = nullptr;  // nullptr: not requested
  int64_t intermediate_stride_request = 0;
  int64_t intermediate_stride_token = 0;

  IndexView state_indices, output_state_indices;

  void* invalid_index_count = nullptr;
  DType invalid_index_count_dtype = DType::kInt32;
  void* nonfinite_head_count = nullptr;  // nullptr: refused heads are not counted
  DType nonfinite_head_count_dtype = DType::kInt32;

  // Read on the host, in the other modes (variable length, per-token indices, unfused gating)
  // and by the kernels no small batch runs (the general kernel's grid check, kKV).
  int64_t num_requests = 0;    // B
  int64_t token_capacity = 0;  // most tokens a request may have (T, index columns, cache C)
  int64_t index_columns = 0;   // C of 2-D state_indices: num_accepted_tokens lies in 1..C
  int64_t head_k = 0;          // K
  int64_t total_tokens = 0;    // size of the token dim (B * T, or total_tokens)
  TokenTensor g, beta;         // gating without fusion
  IndexView num_accepted_tokens, cu_seqlens;

  HDK_HOST_DEVICE int64_t qk_head_of(int64_t v_head) const {
    return v_head / (num_v_heads / num_qk_heads);
  }
};

// What one request does, resolved from the index tensors. Shared by the CPU and CUDA backends
// so both honour the same pool semantics; the float64 reference re-derives it on its own.
struct RequestPlan {
  int64_t token_origin = 0;  // position of the request's first token along the token dim
  int64_t num_tokens = 0;
  int64_t read_slot = -1;   // -1: padding row (zero output, no slot touched)
  int64_t final_slot = -1;  // slot for the final state (per-request modes), -1: none
  bool invalid = false;     // an index could not be honoured: run as padding and count it
};

// The slot a per-request plan stores its final state to: an index past the pool makes the request
// invalid, a negative one means no store.
HDK_HOST_DEVICE void set_final_slot(RequestPlan& plan, int64_t slot, int64_t pool_size) {
  plan.final_slot = slot;
  if (plan.final_slot >= pool_size) plan.invalid = true;
  if (plan.final_slot < 0) plan.final_slot = -1;
}

// An invalid request runs as padding: no slot read, none written.
HDK_HOST_DEVICE void drop_if_invalid(RequestPlan& plan) {
  if (plan.invalid) {
    plan.read_slot = -1;
    plan.final_slot = -1;
  }
}

HDK_HOST_DEVICE RequestPlan plan_request(const DecodeProblem& p, int64_t n) {
  RequestPlan plan;
  if (p.variable_length) {
    const int64_t begin = p.cu_seqlens.at(n);
    const int64_t end = p.cu_seqlens.at(n + 1);
    if (begin < 0 || end < begin || end > p.total_tokens || end - begin > p.token_capacity) {
      plan.invalid = true;  // token range unknown: nothing of this request is touched
      return plan;
    }
    plan.token_origin = begin;
    plan.num_tokens = end - begin;
  } else {
    plan.num_tokens = p.tokens_per_request;
  }
  if (plan.num_tokens == 0) return plan;

  const bool writes = p.update_state;
  switch (p.index_mode) {
    case IndexMode::kIdentity:
      plan.read_slot = n;
      break;
    case IndexMode::kPerRequest:
      plan.read_slot = p.state_indices.at(n);
      break;
    case IndexMode::kPerToken: {
      int64_t column = 0;
      if (p.num_accepted_tokens.given()) {
        const int64_t accepted = p.num_accepted_tokens.at(n);
        if (accepted < 1 || accepted > p.index_columns) {
          plan.invalid = true;
          break;
        }
        column = accepted - 1;
      }
      plan.read_slot = p.state_indices.at(n, column);
      break;
    }
  }
  if (plan.invalid || plan.read_slot < 0) {
    plan.read_slot = -1;
    return plan;
  }
  if (plan.read_slot >= p.pool_size) plan.invalid = true;

  if (writes && p.index_mode == IndexMode::kPerToken) {
    for (int64_t t = 0; t < plan.num_tokens; ++t) {
      if (p.state_indices.at(n, t) >= p.pool_size) plan.invalid = true;
    }
  } else if (writes) {
    set_final_slot(plan,
                   p.output_state_indices.given() ? p.output_state_indices.at(n) : plan.read_slot,
                   p.pool_size);
  }
  drop_if_invalid(plan);
  return plan;
}

// Slot that receives the state after token t in per-token mode; -1: none.
HDK_HOST_DEVICE int64_t per_token_write_slot(const DecodeProblem& p, int64_t n, int64_t t) {
  if (!p.update_state || p.index_mode != IndexMode::kPerToken) return -1;
  const int64_t slot = p.state_indices.at(n, t);
  return slot < 0 ? -1 : slot;
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
