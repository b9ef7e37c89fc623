// GDN decode for pools in layout kVK ([P, HV, V, K], K contiguous), any call: what the short
// kernel does not take (more than 32 tokens per request, more than 65535 requests) and fp32
// verify of more than two tokens above 1024 heads, where its extra live values pay for the cache
// writes.
//
// Every row i of a head's V x K state evolves on its own: with the token's normalized q, k,
//   o_i = decay (S_i . q) + u_i (k . q),   u_i = beta (v_i - decay (S_i . k)),
//   S_i <- decay S_i + u_i k,
// so one pass over a row gives both dots, and any set of rows can be processed apart from the
// others. Here every warp is its own work item: a tile of rows of one (request, head), spread
// over kLanesPerRow lanes per row in 16-byte fragments, kept in fp32 registers across all
// tokens of the call (the spec: the state is rounded only where it is stored).
//
// No shared memory and no barrier: a warp loads its own token inputs and streams the tokens
// behind its state, the next token's inputs always in flight (as raw bits, converted where
// used) while the current one is computed and its states are stored. q and k stay
// unnormalized; their norms are folded into the dots and the update. The design that preceded
// this one (token vectors prepared per CTA in shared memory behind a barrier) is in
// docs/gdn-cuda-dispatch.md with its measurements.
#pragma once

#include <cstdint>

#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/device_helpers.cuh"

namespace hdk {
namespace gdn {
namespace detail {

// One token's inputs as a lane needs them, in raw bits: its columns of q and k, the two gate
// inputs and v of the row it finishes.
template <int kValues, int kInputBytes>
struct RawTokenInputs {
  RawVector<kValues, kInputBytes> q, k;
  uint32_t gate_a, gate_b, v;
  // The token's whole v row, which every warp tests for NaN and infinities (up to 256 bytes,
  // K = 128 with 16-bit inputs; longer rows are tested with their own loads).
  RowPieces<kInputBytes, 1> v_row;
};

template <typename StateT, int K, int kRowsPerThread, int kLanes, int kInputBytes,
          int kMaxRegisters>
__global__ void __launch_bounds__(kVKWarpsPerCta * 32) __maxnreg__(kMaxRegisters)
    gdn_decode_vk_general_kernel(const DecodeProblem p, int64_t tiles_per_head) {
  using Shape = VKShape<StateT, K, kRowsPerThread, kLanes>;
  constexpr int kVec = Shape::kVec;
  constexpr int kFragments = Shape::kFragmentsPerLane;
  constexpr int kValues = Shape::kValuesPerLane;
  constexpr int kRows = kRowsPerThread;
  constexpr int kDots = 2 * kRows;  // (S.k, S.q) per row, interleaved
  static_assert(kDots <= kLanes, "each lane must end the butterfly owning one dot");

  const int lane = threadIdx.x % 32;
  const int64_t item = int64_t{blockIdx.x} * (blockDim.x / 32) + threadIdx.x / 32;
  const int64_t tile = item % tiles_per_head;
  const int64_t head_task = item / tiles_per_head;
  if (head_task >= p.num_requests * p.num_v_heads) return;  // the grid's last CTA
  const int64_t hv = head_task % p.num_v_heads;
  const int64_t n = head_task / p.num_v_heads;
  const int64_t request_row = p.variable_length ? 0 : n;
  const int64_t h = p.qk_head_of(hv);
  const int lane_in_row = lane % kLanes;
  const int group_base = lane - lane_in_row;
  // Offsets inside one head fit in 32 bits (V * K <= 65536); slot and cache bases are 64-bit.
  const int thread_first_row = static_cast<int>(tile) * Shape::kRowsPerWarp + lane / kLanes;
  const int head_v = static_cast<int>(p.head_v);
  auto row_of = [&](int r) { return thread_first_row + r * Shape::kRowsPerPass; };
  auto row_valid = [&](int r) { return row_of(r) < head_v; };
  auto column_of = [&](int f) { return (f * kLanes + lane_in_row) * kVec; };

  // After the butterfly this lane holds dot index `owned`: row owned / 2, S.k for even
  // indices, S.q for odd ones. The lowest lane holding a row's S.k finishes that row.
  const int owned = scattered_index<kDots, kLanes>(lane_in_row);
  const int owned_row = owned / 2;
  const bool finishes_row = (owned % 2) == 0 &&
                            lane_in_row == scattered_lane<kDots, kLanes>(owned) &&
                            row_valid(owned_row);
  const int dot_q_lane = group_base + scattered_lane<kDots, kLanes>(owned | 1);

  const TokenTensor& gate_a_tensor = p.fused_gating ? p.a : p.g;
  const TokenTensor& gate_b_tensor = p.fused_gating ? p.b : p.beta;
  const bool v_row_held = RowPieces<kInputBytes, 1>::held(p.v, head_v);
  auto load_token = [&](int64_t token, RawTokenInputs<kValues, kInputBytes>& raw) {
    const int64_t q_base = token_offset(p.q, request_row, token, h);
    const int64_t k_base = token_offset(p.k, request_row, token, h);
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
      // One fragment's columns are contiguous; a lane's fragments are kLanes x kVec apart.
      RawVector<kVec, kInputBytes> piece_q, piece_k;
      piece_q.load(p.q.data, q_base + column_of(f));
      piece_k.load(p.k.data, k_base + column_of(f));
#pragma unroll
      for (int w = 0; w < RawVector<kVec, kInputBytes>::kWords; ++w) {
        raw.q.words[f * RawVector<kVec, kInputBytes>::kWords + w] = piece_q.words[w];
        raw.k.words[f * RawVector<kVec, kInputBytes>::kWords + w] = piece_k.words[w];
      }
    }
    raw.gate_a = load_raw_element(gate_a_tensor.data, gate_a_tensor.dtype,
                                  token_offset(gate_a_tensor, request_row, token, hv));
    raw.gate_b = load_raw_element(gate_b_tensor.data, gate_b_tensor.dtype,
                                  token_offset(gate_b_tensor, request_row, token, hv));
    const int64_t v_base = token_offset(p.v, request_row, token, hv);
    raw.v = row_valid(owned_row) ? load_raw_element(p.v.data, p.v.dtype, v_base + row_of(owned_row))
                                 : 0u;
    raw.v_row.load(p.v.data, v_base, head_v, v_row_held, lane);
  };

  // The first token's inputs, then the pool index, then the state: two DRAM round trips
  // before the first token can start.
  const TokenRange range = request_tokens(p, n);
  RawTokenInputs<kValues, kInputBytes> next;
  if (range.count > 0) load_token(range.origin, next);
  float A_log = 0.0f, dt_bias = 0.0f;
  if (p.fused_gating) {
    A_log = p.A_log[hv * p.A_log_stride];
    dt_bias = load_element(p.dt_bias, p.dt_bias_dtype, hv * p.dt_bias_stride);
  }

  const RequestPlan plan = plan_request(p, n);
  if (plan.invalid && hv == 0 && tile == 0 && lane == 0) count_invalid(p);
  if (plan.read_slot < 0) {
    // Padding (or invalid) request: zero output, no slot touched.
    for (int64_t t = 0; t < plan.num_tokens; ++t) {
      if (finishes_row) {
        store_element(
            p.out.data, p.out.dtype,
            token_offset(p.out, request_row, plan.token_origin + t, hv) + row_of(owned_row), 0.0f);
      }
    }
    return;
  }

  StateT* pool = static_cast<StateT*>(p.state);
  float state[kRows][kValues];
  {
    const StateT* head = pool + slot_offset(p, plan.read_slot, hv);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int f = 0; f < kFragments; ++f) {
        if (row_valid(r)) {
          Fragment<StateT>::load(head + row_of(r) * K + column_of(f), &state[r][f * kVec]);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            state[r][f * kVec + e] = 0.0f;
        }
      }
    }
  }

  constexpr int kInputWords = RawVector<kValues, kInputBytes>::kWords;
  bool refused = false;  // from the token that set it on
  for (int64_t t = 0; t < plan.num_tokens; ++t) {
    const RawTokenInputs<kValues, kInputBytes> current = next;
    // A head runs up to its first token with a NaN or an infinity among its inputs (q, k, the
    // gates, the whole v row, all tested as loaded); from that token on its outputs are NaN and
    // nothing else is stored (docs/gdn-decode.md, "Non-finite inputs"). The arithmetic runs on,
    // its results dropped, which keeps the token's code one path.
    const bool nonfinite =
        words_are_nonfinite<kInputWords>(current.q.words, kInputBytes, p.q.dtype) |
        words_are_nonfinite<kInputWords>(current.k.words, kInputBytes, p.k.dtype) |
        raw_is_nonfinite(current.gate_a, gate_a_tensor.dtype) |
        raw_is_nonfinite(current.gate_b, gate_b_tensor.dtype) |
        current.v_row.nonfinite(p.v.data, p.v.dtype,
                                token_offset(p.v, request_row, plan.token_origin + t, hv), head_v,
                                v_row_held, lane);
    refused = refused || __any_sync(0xffffffffu, nonfinite);
    if (t + 1 < plan.num_tokens) load_token(plan.token_origin + t + 1, next);

    float q[kValues], k[kValues];
    current.q.to_float(p.q.dtype, q);
    current.k.to_float(p.k.dtype, k);
    float qq = 0.0f, kk = 0.0f, qk = 0.0f;
#pragma unroll
    for (int e = 0; e < kValues; ++e) {
      qq += q[e] * q[e];
      kk += k[e] * k[e];
      qk += q[e] * k[e];
    }
    float dots[kDots];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float dot_k = 0.0f, dot_q = 0.0f;
#pragma unroll
      for (int e = 0; e < kValues; ++e) {
        dot_k += state[r][e] * k[e];
        dot_q += state[r][e] * q[e];
      }
      dots[2 * r] = dot_k;
      dots[2 * r + 1] = dot_q;
    }
    qq = group_sum<kLanes>(qq);
    kk = group_sum<kLanes>(kk);
    qk = group_sum<kLanes>(qk);
    reduce_scatter<kDots, kLanes>(dots, lane_in_row);

    const float q_factor = p.use_qk_l2norm ? p.scale * rsqrtf(qq + p.l2norm_eps) : p.scale;
    const float k_factor = p.use_qk_l2norm ? rsqrtf(kk + p.l2norm_eps) : 1.0f;
    const float gate_a = raw_to_float(current.gate_a, gate_a_tensor.dtype);
    const float gate_b = raw_to_float(current.gate_b, gate_b_tensor.dtype);
    const float g = p.fused_gating ? fused_log_decay(A_log, gate_a, dt_bias, p.softplus_beta,
                                                     p.softplus_threshold)
                                   : gate_a;
    const float decay = expf(g);
    const float beta = p.fused_gating ? sigmoid(gate_b) : gate_b;

    const float owned_dot_q = __shfl_sync(0xffffffffu, dots[0], dot_q_lane);
    const float u = beta * (raw_to_float(current.v, p.v.dtype) - decay * dots[0] * k_factor);
    if (finishes_row) {
      store_element(p.out.data, p.out.dtype,
                    token_offset(p.out, request_row, plan.token_origin + t, hv) + row_of(owned_row),
                    refused ? __int_as_float(0x7fffffff)
                            : decay * owned_dot_q * q_factor + u * (qk * q_factor * k_factor));
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float row_u =
          __shfl_sync(0xffffffffu, u, group_base + scattered_lane<kDots, kLanes>(2 * r)) * k_factor;
#pragma unroll
      for (int e = 0; e < kValues; ++e)
        state[r][e] = decay * state[r][e] + row_u * k[e];
    }
    // States after this token: the verify cache and/or per-token pool slots.
    const TokenStateTargets<StateT> after = token_state_targets<StateT>(p, n, t, hv);
    StateT* targets[2] = {after.cache, after.token_slot};
#pragma unroll
    for (int which = 0; which < 2; ++which) {
      if (targets[which] == nullptr || refused) continue;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (!row_valid(r)) continue;
#pragma unroll
        for (int f = 0; f < kFragments; ++f) {
          Fragment<StateT>::store(targets[which] + row_of(r) * K + column_of(f),
                                  &state[r][f * kVec]);
        }
      }
    }
  }

  if (refused) {
    if (tile == 0 && lane == 0) count_refused_head(p);
    return;
  }
  if (plan.final_slot >= 0) {
    StateT* head = pool + slot_offset(p, plan.final_slot, hv);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (!row_valid(r)) continue;
#pragma unroll
      for (int f = 0; f < kFragments; ++f) {
        Fragment<StateT>::store(head + row_of(r) * K + column_of(f), &state[r][f * kVec]);
      }
    }
  }
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
