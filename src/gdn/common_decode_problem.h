// The common form of a GDN decode call, in a compact parameter block for the short CUDA kernel.
//
// Why: at one to four requests a decode step is a chain of dependent instructions, and the
// kernel's parameters are on it: they are read through the SM's constant cache, which starts
// cold at every launch and serves its misses one 64-byte line after another (60-75 ns each on
// an H100). DecodeProblem describes every call the API accepts (variable length, per-token slots,
// unfused gating, any dtype of every tensor, 64-bit strides) and a one-token step reads 9 of its
// lines; the call most engines make reads 5 of this block's, and with the dtypes and modes fixed
// at compile time the kernel also drops their cases from its instruction stream.
//
// The form: fixed-length requests (CommonDecodeProblem) or a decode step in the [1, tokens] form
// with int32 cu_seqlens and at most one token a request, SGLang's decode call
// (CommonDecodeStepProblem, its own type so that the fixed-length instances carry no cu_seqlens
// case); fused gating, q/k/v/a/b/out all of one dtype (the kernel's input type), q and k loadable
// as whole 16-byte vectors, per-request int32 state_indices (and output_state_indices) or none,
// every token offset within 32 bits. common_form_fits() decides; the plan of each request
// (plan_request below) follows DecodeProblem's to the letter, and the CPU tests hold the two
// against each other.
#pragma once

#include <cstdint>
#include <limits>

#include "core/fast_divide.h"
#include "core/host_device.h"
#include "gdn/decode_problem.h"
#include "gdn/short_kernel_fit.h"
#include "hdk/dtype.h"

namespace hdk {
namespace gdn {
namespace detail {

// A per-token tensor of the common form: element strides in 32 bits (the host proved that every
// offset the kernel forms fits), the dtype the kernel's input type.
struct CompactTokenTensor {
  void* data = nullptr;
  int32_t stride_request = 0;
  int32_t stride_token = 0;
  int32_t stride_head = 0;
};

struct CommonDecodeProblem {
  // What the form fixes, under DecodeProblem's names so that code reading either problem type
  // (p.variable_length, p.fused_gating) needs no case for this one.
  static constexpr bool variable_length = false;
  static constexpr bool fused_gating = true;

  // Field order: what a one-token step reads on its way to the state comes first (see the
  // header comment); the verify cache and the counters of invalid rows and refused heads last.
  int32_t tokens_per_request = 0;
  // The q/k head of value head hv is hv / (HV / H), a FastDivide by that ratio (multiply-high,
  // add, shift) instead of an integer division's ~20 instructions on every warp's path.
  uint32_t qk_head_multiplier = 0;
  int32_t head_v = 0;
  int32_t head_pitch = 0;            // elements between consecutive heads of one slot (V * K)
  bool per_request_indices = false;  // false: request n uses slot n
  bool update_state = true;
  bool use_qk_l2norm = true;
  DType dt_bias_dtype = DType::kFloat32;
  DType invalid_index_count_dtype = DType::kInt32;
  uint8_t qk_head_shift = 0;                         // in what was padding before `scale`
  DType nonfinite_head_count_dtype = DType::kInt32;  // the same padding
  float scale = 0.0f;
  float l2norm_eps = 1e-6f;
  float softplus_beta = 1.0f;
  float softplus_threshold = 20.0f;

  CompactTokenTensor q, k, v, a, b;

  const float* A_log = nullptr;
  const void* dt_bias = nullptr;
  int32_t A_log_stride = 0;
  int32_t dt_bias_stride = 0;

  const int32_t* state_indices = nullptr;
  int32_t state_indices_stride = 0;
  int32_t output_state_indices_stride = 0;
  void* state = nullptr;
  int64_t slot_pitch = 0;
  int64_t pool_size = 0;

  CompactTokenTensor out;
  const int32_t* output_state_indices = nullptr;  // nullptr: the final state goes to read slot
  void* intermediate_states = nullptr;            // nullptr: not requested
  int64_t intermediate_stride_request = 0;
  int64_t intermediate_stride_token = 0;
  void* invalid_index_count = nullptr;
  void* nonfinite_head_count = nullptr;
};

// A decode step of the common form in the [1, tokens] form: request n owns the tokens
// cu_seqlens[n]..cu_seqlens[n + 1], at most one (more makes the request invalid). The fields
// come after the fixed-length block's, which they extend.
struct CommonDecodeStepProblem : CommonDecodeProblem {
  static constexpr bool variable_length = true;
  const int32_t* cu_seqlens = nullptr;
  int32_t cu_seqlens_stride = 0;
  int32_t total_tokens = 0;
};

// Whether a validated call (layout kVK) has the common form, for a kernel whose q and k loads
// are `vector_bytes` wide. The head size and the kernel shape are the launcher's business.
inline bool common_form_fits(const DecodeProblem& p, int64_t vector_bytes) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  if (!p.fused_gating) return false;
  // Variable length only as a decode step: at most one token a request.
  if (p.variable_length && (p.token_capacity != 1 || p.cu_seqlens.dtype != DType::kInt32 ||
                            p.cu_seqlens.row_stride > kMax)) {
    return false;
  }
  if (p.index_mode == IndexMode::kPerToken) return false;
  if (p.index_mode == IndexMode::kPerRequest && p.state_indices.dtype != DType::kInt32) {
    return false;
  }
  if (p.output_state_indices.given() && p.output_state_indices.dtype != DType::kInt32) {
    return false;
  }
  const DType input = p.q.dtype;
  for (const TokenTensor* x : {&p.k, &p.v, &p.a, &p.b, &p.out}) {
    if (x->dtype != input) return false;
  }
  if (!token_offsets_fit_32_bits(p)) return false;
  if (p.tokens_per_request > kMax || p.head_v > kMax || p.head_pitch > kMax ||
      p.A_log_stride > kMax || p.dt_bias_stride > kMax || p.state_indices.row_stride > kMax ||
      p.output_state_indices.row_stride > kMax) {
    return false;
  }
  // q and k are read as vector_bytes-wide pieces at multiples of vector_bytes from a row's start:
  // the rows must start on such a boundary. A stride over a dim of one element is never used.
  const int64_t element = static_cast<int64_t>(dtype_size(input));
  const int64_t rows = p.variable_length ? 1 : p.num_requests;
  const int64_t tokens = p.variable_length ? p.total_tokens : p.tokens_per_request;
  const int64_t heads = p.num_qk_heads;
  for (const TokenTensor* x : {&p.q, &p.k}) {
    if (reinterpret_cast<uintptr_t>(x->data) % static_cast<uintptr_t>(vector_bytes) != 0) {
      return false;
    }
    const int64_t strides[3][2] = {
        {rows, x->stride_request}, {tokens, x->stride_token}, {heads, x->stride_head}};
    for (const auto& dim : strides) {
      if (dim[0] > 1 && (dim[1] * element) % vector_bytes != 0) return false;
    }
  }
  return true;
}

inline CompactTokenTensor compact(const TokenTensor& x) {
  return {x.data, static_cast<int32_t>(x.stride_request), static_cast<int32_t>(x.stride_token),
          static_cast<int32_t>(x.stride_head)};
}

// The compact block of a call for which common_form_fits() holds (fixed length; a decode step
// with cu_seqlens takes to_common_decode_step(), which extends it).
inline CommonDecodeProblem to_common_form(const DecodeProblem& p) {
  CommonDecodeProblem c;
  c.tokens_per_request = static_cast<int32_t>(p.tokens_per_request);
  const hdk::detail::FastDivide qk_head_of(static_cast<uint32_t>(p.num_v_heads / p.num_qk_heads));
  c.qk_head_multiplier = qk_head_of.multiplier;
  c.qk_head_shift = static_cast<uint8_t>(qk_head_of.shift);
  c.head_v = static_cast<int32_t>(p.head_v);
  c.head_pitch = static_cast<int32_t>(p.head_pitch);
  c.per_request_indices = p.index_mode == IndexMode::kPerRequest;
  c.update_state = p.update_state;
  c.use_qk_l2norm = p.use_qk_l2norm;
  c.dt_bias_dtype = p.dt_bias_dtype;
  c.invalid_index_count_dtype = p.invalid_index_count_dtype;
  c.scale = p.scale;
  c.l2norm_eps = p.l2norm_eps;
  c.softplus_beta = p.softplus_beta;
  c.softplus_threshold = p.softplus_threshold;
  c.q = compact(p.q);
  c.k = compact(p.k);
  c.v = compact(p.v);
  c.a = compact(p.a);
  c.b = compact(p.b);
  c.A_log = p.A_log;
  c.dt_bias = p.dt_bias;
  c.A_log_stride = static_cast<int32_t>(p.A_log_stride);
  c.dt_bias_stride = static_cast<int32_t>(p.dt_bias_stride);
  c.state_indices = static_cast<const int32_t*>(p.state_indices.data);
  c.state_indices_stride = static_cast<int32_t>(p.state_indices.row_stride);
  c.output_state_indices_stride = static_cast<int32_t>(p.output_state_indices.row_stride);
  c.state = p.state;
  c.slot_pitch = p.slot_pitch;
  c.pool_size = p.pool_size;
  c.out = compact(p.out);
  c.output_state_indices = static_cast<const int32_t*>(p.output_state_indices.data);
  c.intermediate_states = p.intermediate_states;
  c.intermediate_stride_request = p.intermediate_stride_request;
  c.intermediate_stride_token = p.intermediate_stride_token;
  c.invalid_index_count = p.invalid_index_count;
  c.nonfinite_head_count = p.nonfinite_head_count;
  c.nonfinite_head_count_dtype = p.nonfinite_head_count_dtype;
  return c;
}

inline CommonDecodeStepProblem to_common_decode_step(const DecodeProblem& p) {
  CommonDecodeStepProblem step;
  static_cast<CommonDecodeProblem&>(step) = to_common_form(p);
  step.cu_seqlens = static_cast<const int32_t*>(p.cu_seqlens.data);
  step.cu_seqlens_stride = static_cast<int32_t>(p.cu_seqlens.row_stride);
  step.total_tokens = static_cast<int32_t>(p.total_tokens);
  return step;
}

// The slots of a request of the common form whose tokens `plan` holds: plan_request of
// DecodeProblem for per-request indices or none, the same slots, the same invalid rows.
HDK_HOST_DEVICE RequestPlan plan_common_slots(const CommonDecodeProblem& p, int64_t n,
                                              RequestPlan plan) {
  if (plan.num_tokens == 0) return plan;
  plan.read_slot = p.per_request_indices ? p.state_indices[n * p.state_indices_stride] : n;
  if (plan.read_slot < 0) {
    plan.read_slot = -1;
    return plan;
  }
  if (plan.read_slot >= p.pool_size) plan.invalid = true;
  if (p.update_state) {
    set_final_slot(plan,
                   p.output_state_indices != nullptr
                       ? p.output_state_indices[n * p.output_state_indices_stride]
                       : plan.read_slot,
                   p.pool_size);
  }
  drop_if_invalid(plan);
  return plan;
}

HDK_HOST_DEVICE RequestPlan plan_request(const CommonDecodeProblem& p, int64_t n) {
  RequestPlan plan;
  plan.num_tokens = p.tokens_per_request;
  return plan_common_slots(p, n, plan);
}

// A decode step's request: DecodeProblem's variable-length check with a capacity of one token.
HDK_HOST_DEVICE RequestPlan plan_request(const CommonDecodeStepProblem& p, int64_t n) {
  RequestPlan plan;
  const int64_t begin = p.cu_seqlens[n * p.cu_seqlens_stride];
  const int64_t end = p.cu_seqlens[(n + 1) * p.cu_seqlens_stride];
  if (begin < 0 || end < begin || end > p.total_tokens || end - begin > 1) {
    plan.invalid = true;  // token range unknown: nothing of this request is touched
    return plan;
  }
  plan.token_origin = begin;
  plan.num_tokens = end - begin;
  return plan_common_slots(p, n, plan);
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
