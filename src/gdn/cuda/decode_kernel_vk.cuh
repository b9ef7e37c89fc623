// GDN decode for pools in layout kVK ([P, HV, V, K], K contiguous), any number of tokens.
//
// Every row i of a head's V x K state evolves on its own: with the token's normalized q, k,
//   o_i = decay (S_i . q) + u_i (k . q),   u_i = beta (v_i - decay (S_i . k)),
//   S_i <- decay S_i + u_i k,
// so one pass over a row gives both dots, and any set of rows can be processed apart from the
// others. A CTA owns a tile of rows of one (request, head); a row is spread over kLanesPerRow
// lanes in 16-byte fragments, and each thread keeps kRowsPerThread rows in fp32 registers
// across all tokens of the call (the spec: the state is rounded only where it is stored).
//
// Tokens come in chunks of one token per warp. Each warp issues its token's loads (q, k, the
// gate inputs) and its share of v at kernel start, together with the pool index and the
// state, so a chunk costs one DRAM round trip next to the state's; the normalized vectors go
// to shared memory and the token loop then touches no global input. (Prefetching one token at
// a time from each warp left a round trip per token on the critical path: 41-49% of the copy
// bandwidth at T = 2..8, measured on an H100.) The 2 x kRowsPerThread dots of a token are
// summed by one butterfly (see decode_kernel_vk_single.cuh).
#pragma once

#include <cstdint>

#include "gdn/cuda/device_helpers.cuh"

namespace hdk {
namespace gdn {
namespace detail {

template <typename StateT, int K, int kRowsPerThread>
struct VKShape {
  static constexpr int kVec = Fragment<StateT>::kSize;  // one 16-byte access per fragment
  static constexpr int kLanesPerRow = (K / kVec) < 32 ? (K / kVec) : 32;
  static constexpr int kFragmentsPerLane = K / (kVec * kLanesPerRow);
  static constexpr int kValuesPerLane = kFragmentsPerLane * kVec;  // state floats per row
  static constexpr int kRowsPerPass = 32 / kLanesPerRow;           // rows one warp load covers
  static constexpr int kRowsPerWarp = kRowsPerPass * kRowsPerThread;
};

constexpr int kMultiTokenMaxWarps = 8;

template <typename StateT, int K, int kRowsPerThread>
__global__ void __launch_bounds__(kMultiTokenMaxWarps * 32, 2)
    gdn_decode_vk_kernel(const DecodeProblem p, int tiles_per_head) {
  using Shape = VKShape<StateT, K, kRowsPerThread>;
  constexpr int kVec = Shape::kVec;
  constexpr int kLanes = Shape::kLanesPerRow;
  constexpr int kFragments = Shape::kFragmentsPerLane;
  constexpr int kValues = Shape::kValuesPerLane;
  constexpr int kRows = kRowsPerThread;
  constexpr int kDots = 2 * kRows;
  static_assert(kDots <= kLanes, "each lane must end the butterfly owning one dot");
  constexpr int kMaxRowsPerCta = kMultiTokenMaxWarps * Shape::kRowsPerWarp;
  // v values (tokens x rows of a chunk) each thread loads: chunk = warps, rows = warps x
  // kRowsPerWarp, threads = 32 x warps, so warps x kRowsPerWarp / 32 at most.
  constexpr int kValuesPerThread = (kMultiTokenMaxWarps * Shape::kRowsPerWarp + 31) / 32;
  __shared__ TokenVectors<K> tokens[kMultiTokenMaxWarps];
  __shared__ float values[kMultiTokenMaxWarps][kMaxRowsPerCta];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warps = static_cast<int>(blockDim.x / 32);  // = tokens per chunk
  const int lane_in_row = lane % kLanes;
  const int row_in_pass = lane / kLanes;
  const int group_base = lane - lane_in_row;

  const int64_t tile = blockIdx.x % tiles_per_head;
  const int64_t head_task = blockIdx.x / tiles_per_head;
  const int64_t hv = head_task % p.num_v_heads;
  const int64_t n = head_task / p.num_v_heads;
  const int64_t request_row = p.variable_length ? 0 : n;
  const int rows_per_cta = warps * Shape::kRowsPerWarp;
  const int first_row = static_cast<int>(tile) * rows_per_cta;
  // Offsets inside one head fit in 32 bits (V * K <= 65536); slot and cache bases are 64-bit.
  const int thread_first_row = first_row + warp * Shape::kRowsPerWarp + row_in_pass;
  const int head_v = static_cast<int>(p.head_v);
  auto row_of = [&](int r) { return thread_first_row + r * Shape::kRowsPerPass; };
  auto row_valid = [&](int r) { return row_of(r) < head_v; };
  auto column_of = [&](int f) { return (f * kLanes + lane_in_row) * kVec; };

  const int owned = scattered_index<kDots, kLanes>(lane_in_row);
  const int owned_row = owned / 2;
  const bool owns_dot_k = (owned % 2) == 0 && lane_in_row == scattered_lane<kDots, kLanes>(owned);
  const int dot_q_lane = group_base + scattered_lane<kDots, kLanes>(owned + 1);

  // A chunk's loads: this warp's token inputs and a share of the chunk's v, into registers.
  TokenInputs<K> inputs;
  float loaded_v[kValuesPerThread];
  auto issue_chunk_loads = [&](int64_t origin, int64_t chunk_start, int chunk) {
    if (warp < chunk) {
      load_token_inputs<K>(p, request_row, origin + chunk_start + warp, hv, lane, inputs);
    }
#pragma unroll
    for (int i = 0; i < kValuesPerThread; ++i) {
      const int index = threadIdx.x + i * blockDim.x;
      const int c = index / rows_per_cta;
      const int row = first_row + index % rows_per_cta;
      loaded_v[i] = 0.0f;
      if (c < chunk && row < head_v) {
        loaded_v[i] =
            load_element(p.v.data, p.v.dtype,
                         token_offset(p.v, request_row, origin + chunk_start + c, hv) + row);
      }
    }
  };
  auto finish_chunk = [&](int chunk) {
    if (warp < chunk) finish_token<K>(p, inputs, lane, tokens[warp]);
#pragma unroll
    for (int i = 0; i < kValuesPerThread; ++i) {
      const int index = threadIdx.x + i * blockDim.x;
      if (index < chunk * rows_per_cta) {
        values[index / rows_per_cta][index % rows_per_cta] = loaded_v[i];
      }
    }
  };

  const TokenRange range = request_tokens(p, n);
  issue_chunk_loads(range.origin, 0, static_cast<int>(range.count < warps ? range.count : warps));

  const RequestPlan plan = plan_request(p, n);
  if (plan.invalid && hv == 0 && tile == 0 && threadIdx.x == 0) count_invalid(p);
  if (plan.read_slot < 0) {
    // Padding (or invalid) request: zero output, no slot touched.
    for (int64_t t = 0; t < plan.num_tokens; ++t) {
      const int64_t out_base = token_offset(p.out, request_row, plan.token_origin + t, hv);
      if (owns_dot_k && row_valid(owned_row)) {
        store_element(p.out.data, p.out.dtype, out_base + row_of(owned_row), 0.0f);
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

  for (int64_t chunk_start = 0; chunk_start < plan.num_tokens; chunk_start += warps) {
    const int64_t remaining = plan.num_tokens - chunk_start;
    const int chunk = static_cast<int>(remaining < warps ? remaining : warps);
    if (chunk_start > 0) {
      __syncthreads();  // the previous chunk's vectors are no longer read
      issue_chunk_loads(plan.token_origin, chunk_start, chunk);
    }
    finish_chunk(chunk);
    __syncthreads();

    for (int c = 0; c < chunk; ++c) {
      const int64_t t = chunk_start + c;
      const TokenVectors<K>& token = tokens[c];
      float k[kValues], q[kValues];
#pragma unroll
      for (int f = 0; f < kFragments; ++f) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          k[f * kVec + e] = token.k[column_of(f) + e];
          q[f * kVec + e] = token.q[column_of(f) + e];
        }
      }
      const float decay = token.decay;
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
      reduce_scatter<kDots, kLanes>(dots, lane_in_row);
      const float owned_dot_q = __shfl_sync(0xffffffffu, dots[0], dot_q_lane);
      const float owned_v = row_valid(owned_row) ? values[c][row_of(owned_row) - first_row] : 0.0f;
      const float u = token.beta * (owned_v - decay * dots[0]);
      if (owns_dot_k && row_valid(owned_row)) {
        store_element(
            p.out.data, p.out.dtype,
            token_offset(p.out, request_row, plan.token_origin + t, hv) + row_of(owned_row),
            decay * owned_dot_q + u * token.k_dot_q);
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float row_u =
            __shfl_sync(0xffffffffu, u, group_base + scattered_lane<kDots, kLanes>(2 * r));
#pragma unroll
        for (int e = 0; e < kValues; ++e)
          state[r][e] = decay * state[r][e] + row_u * k[e];
      }
      // States after this token: the verify cache and/or per-token pool slots.
      const TokenStateTargets<StateT> after = token_state_targets<StateT>(p, n, t, hv);
      StateT* targets[2] = {after.cache, after.token_slot};
#pragma unroll
      for (int which = 0; which < 2; ++which) {
        if (targets[which] == nullptr) continue;
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
