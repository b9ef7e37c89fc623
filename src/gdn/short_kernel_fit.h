// Host-side checks that decide which build of the CUDA short kernel a validated call may use
// (decode_kernel_vk_short.cuh): whether its per-token offsets fit in 32 bits, and whether its
// requests are short enough for the kernel's one-token-per-lane scalars. Plain C++ so the
// CPU tests cover them.
#pragma once

#include <cstdint>
#include <limits>

#include "gdn/decode_problem.h"

namespace hdk {
namespace gdn {
namespace detail {

// Most tokens one request may have in a call the short kernel runs: token t's gates (and per-token
// slot) are held by lane t of the warp.
constexpr int64_t kShortMaxTokens = 32;

// The largest |element offset| a kernel forms into a per-token tensor of `rows` x `tokens` x
// `heads` x `row_length` (the last dim contiguous): every stride taken by magnitude, so negative
// strides are covered too.
inline int64_t token_tensor_reach(const TokenTensor& x, int64_t rows, int64_t tokens, int64_t heads,
                                  int64_t row_length) {
  auto span = [](int64_t extent, int64_t stride) {
    return extent > 1 ? (extent - 1) * (stride < 0 ? -stride : stride) : 0;
  };
  return span(rows, x.stride_request) + span(tokens, x.stride_token) + span(heads, x.stride_head) +
         (row_length > 0 ? row_length - 1 : 0);
}

// Whether every offset the short kernel computes in 32 bits fits: offsets into q, k, v, out and
// the gate tensors, the request and head indices (B x HV), and pool slot numbers (their byte
// offsets stay 64-bit, as do the verify cache's).
inline bool token_offsets_fit_32_bits(const DecodeProblem& p) {
  constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
  const int64_t rows = p.variable_length ? 1 : p.num_requests;
  const int64_t tokens = p.variable_length ? p.total_tokens : p.tokens_per_request;
  if (p.num_requests * p.num_v_heads > kMax || p.pool_size > kMax) return false;
  // Token indices themselves (origin + t) and one past the last.
  if (tokens + 1 > kMax) return false;
  const struct {
    const TokenTensor* tensor;
    int64_t heads, row_length;
  } tensors[] = {
      {&p.q, p.num_qk_heads, p.head_k}, {&p.k, p.num_qk_heads, p.head_k},
      {&p.v, p.num_v_heads, p.head_v},  {&p.out, p.num_v_heads, p.head_v},
      {&p.a, p.num_v_heads, 1},         {&p.b, p.num_v_heads, 1},
      {&p.g, p.num_v_heads, 1},         {&p.beta, p.num_v_heads, 1},
  };
  for (const auto& entry : tensors) {
    if (entry.tensor->data == nullptr) continue;
    if (token_tensor_reach(*entry.tensor, rows, tokens, entry.heads, entry.row_length) > kMax) {
      return false;
    }
  }
  return true;
}

// The most tokens any request of the call can run: T, or with cu_seqlens the capacity (a longer
// request is invalid and runs no token).
inline int64_t most_tokens_per_request(const DecodeProblem& p) {
  return p.variable_length ? p.token_capacity : p.tokens_per_request;
}

// Whether the per-token pool slots of 2-D state_indices are written (the short kernel compiles
// that path only into the instances it launches for such calls).
inline bool writes_token_slots(const DecodeProblem& p) {
  return p.update_state && p.index_mode == IndexMode::kPerToken;
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
