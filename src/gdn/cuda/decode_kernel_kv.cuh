// GDN decode for pools in layout kKV ([P, HV, K, V], V contiguous).
//
// Here the dots run down the strided dimension (K), so a CTA owns a tile of state columns
// (value indices) of one (request, head) across all K rows: 8 lanes cover a row of the tile
// with 16-byte fragments, the CTA's K / 8 row groups split the K rows (8 rows per thread, kept
// in registers across the tokens), and the partial dots meet in shared memory.
#pragma once

#include <cstdint>

#include "gdn/cuda/device_helpers.cuh"

namespace hdk {
namespace gdn {
namespace detail {

template <typename StateT, int K>
struct KVShape {
  static constexpr int kVec = Fragment<StateT>::kSize;
  static constexpr int kLanesPerRow = 8;
  static constexpr int kColumns = kLanesPerRow * kVec;  // state columns per CTA
  static constexpr int kThreads = K;                    // K / 8 row groups of 8 lanes
  static constexpr int kRowGroups = kThreads / kLanesPerRow;
  static constexpr int kRowsPerThread = K / kRowGroups;  // = 8
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kTokensPerChunk = 8;
  // CTAs an SM must hold, which caps the registers (65536 / (kThreads x this)): left to itself
  // ptxas gave the bf16 kernel 218 registers once the non-finite test was in (168 before; 2
  // CTAs an SM instead of 3, 25-41% slower on qwen3-next from B = 16, H200); at 4 CTAs (128
  // registers) it spills 564 bytes. fp32 fits 128 registers with 16 bytes spilled. Other K
  // are left to ptxas (not measured).
  static constexpr int kMinCtasPerSm = K != 128 ? 1 : sizeof(StateT) == 2 ? 3 : 4;
};

template <typename StateT, int K>
__global__ void __launch_bounds__(K, KVShape<StateT, K>::kMinCtasPerSm)
    gdn_decode_kv_kernel(const DecodeProblem p, int tiles_per_head) {
  using Shape = KVShape<StateT, K>;
  constexpr int kChunk = Shape::kTokensPerChunk;
  constexpr int kVec = Shape::kVec;
  __shared__ TokenVectors<K> tokens[kChunk];
  __shared__ float values[kChunk][Shape::kColumns];
  // Per-warp partial dots, then the per-column u and output coefficient.
  __shared__ float partial_k[Shape::kWarps][Shape::kColumns];
  __shared__ float partial_q[Shape::kWarps][Shape::kColumns];
  __shared__ float column_u[Shape::kColumns];

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int lane_in_row = lane % Shape::kLanesPerRow;
  const int row_group = threadIdx.x / Shape::kLanesPerRow;

  const int64_t tile = blockIdx.x % tiles_per_head;
  const int64_t head_task = blockIdx.x / tiles_per_head;
  const int64_t hv = head_task % p.num_v_heads;
  const int64_t n = head_task / p.num_v_heads;
  const int64_t request_row = p.variable_length ? 0 : n;
  const int64_t first_column = tile * Shape::kColumns;
  const int64_t column = first_column + lane_in_row * kVec;  // this thread's first column
  const bool column_valid = column < p.head_v;               // V is a multiple of kVec

  // Token loads first (this warp's token inputs, a share of v), then the pool index, then the
  // state: see decode_kernel_vk_general.cuh for why the order matters.
  constexpr int kValuesLoadedPerThread = (kChunk * Shape::kColumns + K - 1) / K;
  TokenInputs<K> inputs;
  float loaded_v[kValuesLoadedPerThread];
  const int64_t V = p.head_v;
  auto issue_chunk_loads = [&](const TokenRange& range, int64_t chunk_start, int chunk) {
    if (warp < chunk) {
      load_token_inputs<K>(p, request_row, range.origin + chunk_start + warp, hv, lane, inputs,
                           chunk_start == 0);
    }
#pragma unroll
    for (int i = 0; i < kValuesLoadedPerThread; ++i) {
      const int index = threadIdx.x + i * K;
      const int c = index / Shape::kColumns;
      const int64_t col = first_column + index % Shape::kColumns;
      loaded_v[i] = 0.0f;
      if (c < chunk && col < V) {
        loaded_v[i] =
            load_element(p.v.data, p.v.dtype,
                         token_offset(p.v, request_row, range.origin + chunk_start + c, hv) + col);
      }
    }
  };
  // Only the first kWarps tokens hold their v rows (in.v_row), and those are tested before the
  // state's loads; every later token's row is tested with loads the test consumes at once. Rows
  // held next to the state's registers made ptxas spill (K = 128: bf16 76 bytes at the 3-CTA cap,
  // now none; fp32 32 bytes at 4, now 16), which cost 2-8% at every T.
  bool first_v_nonfinite = false;  // this warp's token of the first chunk, tested early (below)
  auto finish_chunk = [&](const TokenRange& range, int64_t chunk_start, int chunk) {
    auto v_offset = [&](int c) {
      return token_offset(p.v, request_row, range.origin + chunk_start + c, hv);
    };
    if (warp < chunk) {
      const bool v_nonfinite =
          chunk_start == 0 ? first_v_nonfinite : v_row_nonfinite(p, v_offset(warp), lane);
      finish_token<K>(p, inputs, v_nonfinite, lane, tokens[warp]);
    }
    for (int c = warp + Shape::kWarps; c < chunk; c += Shape::kWarps) {
      load_token_inputs<K>(p, request_row, range.origin + chunk_start + c, hv, lane, inputs, false);
      finish_token<K>(p, inputs, v_row_nonfinite(p, v_offset(c), lane), lane, tokens[c]);
    }
#pragma unroll
    for (int i = 0; i < kValuesLoadedPerThread; ++i) {
      const int index = threadIdx.x + i * K;
      if (index < chunk * Shape::kColumns) {
        values[index / Shape::kColumns][index % Shape::kColumns] = loaded_v[i];
      }
    }
  };

  const TokenRange range = request_tokens(p, n);
  issue_chunk_loads(range, 0, static_cast<int>(range.count < kChunk ? range.count : kChunk));

  const RequestPlan plan = plan_request(p, n);
  if (plan.invalid && hv == 0 && tile == 0 && threadIdx.x == 0) count_invalid(p);

  if (plan.read_slot < 0) {
    for (int64_t t = 0; t < plan.num_tokens; ++t) {
      const int64_t out_base = token_offset(p.out, request_row, plan.token_origin + t, hv);
      for (int c = threadIdx.x; c < Shape::kColumns; c += blockDim.x) {
        if (first_column + c < V) {
          store_element(p.out.data, p.out.dtype, out_base + first_column + c, 0.0f);
        }
      }
    }
    return;
  }

  // The v row of this warp's first token, tested before the state's loads: its loads went out
  // with the token's other inputs, and its registers are free again before the state's arrive.
  if (warp < plan.num_tokens) {
    first_v_nonfinite = token_v_nonfinite<K>(
        p, inputs, token_offset(p.v, request_row, range.origin + warp, hv), lane);
  }

  // Thread rows: row_group, row_group + kRowGroups, ... (a warp load covers 4 rows x 128 B).
  StateT* pool = static_cast<StateT*>(p.state);
  float state[Shape::kRowsPerThread][kVec];
  {
    const StateT* head = pool + slot_offset(p, plan.read_slot, hv);
#pragma unroll
    for (int r = 0; r < Shape::kRowsPerThread; ++r) {
      const int64_t row = row_group + r * Shape::kRowGroups;
      if (column_valid) {
        Fragment<StateT>::load(head + row * V + column, state[r]);
      } else {
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          state[r][e] = 0.0f;
      }
    }
  }

  // A head runs up to its first token with a NaN or an infinity among its inputs (each token's
  // warp tests q, k, the gates and the whole v row as it finishes the token); from that token on
  // its outputs are NaN and nothing else is stored (docs/gdn-decode.md, "Non-finite inputs").
  // The arithmetic runs on, its results dropped.
  bool refused = false;
  for (int64_t chunk_start = 0; chunk_start < plan.num_tokens; chunk_start += kChunk) {
    const int64_t remaining = plan.num_tokens - chunk_start;
    const int chunk = static_cast<int>(remaining < kChunk ? remaining : kChunk);
    if (chunk_start > 0) {
      __syncthreads();
      issue_chunk_loads(range, chunk_start, chunk);
    }
    finish_chunk(range, chunk_start, chunk);
    __syncthreads();

    for (int c = 0; c < chunk; ++c) {
      const int64_t t = chunk_start + c;
      const TokenVectors<K>& token = tokens[c];
      refused = refused || token.nonfinite != 0;
      const float decay = token.decay;
      float dot_k[kVec], dot_q[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        dot_k[e] = dot_q[e] = 0.0f;
#pragma unroll
      for (int r = 0; r < Shape::kRowsPerThread; ++r) {
        const int row = row_group + r * Shape::kRowGroups;
        const float k = token.k[row];
        const float q = token.q[row];
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          dot_k[e] += state[r][e] * k;
          dot_q[e] += state[r][e] * q;
        }
      }
      // Lanes 8 and 16 apart share columns: fold the warp's four row groups, then the warps.
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
#pragma unroll
        for (int offset = 8; offset < 32; offset *= 2) {
          dot_k[e] += __shfl_xor_sync(0xffffffffu, dot_k[e], offset);
          dot_q[e] += __shfl_xor_sync(0xffffffffu, dot_q[e], offset);
        }
      }
      if (lane < Shape::kLanesPerRow) {
#pragma unroll
        for (int e = 0; e < kVec; ++e) {
          partial_k[warp][lane * kVec + e] = dot_k[e];
          partial_q[warp][lane * kVec + e] = dot_q[e];
        }
      }
      __syncthreads();
      const int64_t out_base = token_offset(p.out, request_row, plan.token_origin + t, hv);
      for (int col = threadIdx.x; col < Shape::kColumns; col += blockDim.x) {
        float total_k = 0.0f, total_q = 0.0f;
#pragma unroll
        for (int w = 0; w < Shape::kWarps; ++w) {
          total_k += partial_k[w][col];
          total_q += partial_q[w][col];
        }
        const float u = token.beta * (values[c][col] - decay * total_k);
        column_u[col] = u;
        if (first_column + col < V) {
          store_element(p.out.data, p.out.dtype, out_base + first_column + col,
                        refused ? __int_as_float(0x7fffffff) : decay * total_q + u * token.k_dot_q);
        }
      }
      __syncthreads();
      float u[kVec];
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        u[e] = column_u[lane_in_row * kVec + e];
#pragma unroll
      for (int r = 0; r < Shape::kRowsPerThread; ++r) {
        const float k = token.k[row_group + r * Shape::kRowGroups];
#pragma unroll
        for (int e = 0; e < kVec; ++e)
          state[r][e] = decay * state[r][e] + u[e] * k;
      }
      // States after this token: the verify cache and/or per-token pool slots.
      const TokenStateTargets<StateT> after = token_state_targets<StateT>(p, n, t, hv);
      StateT* targets[2] = {after.cache, after.token_slot};
#pragma unroll
      for (int which = 0; which < 2; ++which) {
        if (targets[which] == nullptr || !column_valid || refused) continue;
#pragma unroll
        for (int r = 0; r < Shape::kRowsPerThread; ++r) {
          const int64_t row = row_group + r * Shape::kRowGroups;
          Fragment<StateT>::store(targets[which] + row * V + column, state[r]);
        }
      }
    }
  }

  if (refused) {
    if (tile == 0 && threadIdx.x == 0) count_refused_head(p);
    return;
  }
  if (plan.final_slot >= 0 && column_valid) {
    StateT* head = pool + slot_offset(p, plan.final_slot, hv);
#pragma unroll
    for (int r = 0; r < Shape::kRowsPerThread; ++r) {
      const int64_t row = row_group + r * Shape::kRowGroups;
      Fragment<StateT>::store(head + row * V + column, state[r]);
    }
  }
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
