// GDN decode, layout kVK, exactly one token per request, for tuning sweeps only: the short
// kernel's builds (decode_kernel_vk_short.cuh) measured faster on every one-token call, so the
// dispatcher never picks this one, and it is built only with -DHDK_GDN_SWEEP_KERNELS=ON.
//
// Same row arithmetic as decode_kernel_vk_general.cuh, tuned for the one-token case, where the
// step is a read-modify-write of the state behind one index lookup. On an H100 such a
// lookup-then-RMW of 4 KiB per warp reaches 94% of the copy bandwidth (hdk-bench floor); what
// separates a decode kernel from it is the arithmetic each warp does between its loads and its
// stores, during which its registers are held and nothing of it is in flight. So:
// - the state stays in the raw 16-byte fragments it was loaded as (no fp32 copy to hold);
// - all 2 x kRowsPerThread dot products of a thread are summed over the row's lanes by one
//   butterfly (2R - 1 shuffles instead of 2R x log2(lanes)); the lane that ends up owning a
//   row computes that row's u and output (one store for all rows) and broadcasts u back.
// Measured steps of the design are in docs/gdn-cuda-dispatch.md.
#pragma once

#include <cstdint>

#include "gdn/cuda/device_helpers.cuh"

namespace hdk {
namespace gdn {
namespace detail {

// The 16-byte fragment a lane loaded, as fp32 values (4 fp32 or 8 bf16).
template <typename StateT>
__device__ __forceinline__ void unpack_fragment(const uint4& raw, float* values) {
  constexpr int kWords = 4;
  const uint32_t words[kWords] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < kWords; ++i) {
    if constexpr (sizeof(StateT) == 4) {
      values[i] = __uint_as_float(words[i]);
    } else {
      values[2 * i] = __uint_as_float(words[i] << 16);
      values[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
    }
  }
}

// Rows per thread the kernel supports for a state type and K: after the butterfly a lane owns
// one dot (2R <= lanes per row) or both dots of one row (2R = 2 x lanes), so R <= lanes
// (8 for bf16 K = 64), and at most 16.
template <typename StateT, int K>
constexpr int max_one_token_sweep_rows() {
  constexpr int kLanes = VKShape<StateT, K, 1>::kLanesPerRow;
  return kLanes < 16 ? kLanes : 16;
}

// Register cap: 64 where a thread's rows fit them without spilling (checked with -Xptxas -v for
// every instantiation), which lets 32 warps share an SM instead of 16-24: more warps, more
// state bytes in flight (docs/gdn-cuda-dispatch.md). 255 means no cap.
template <typename StateT, int K, int kRowsPerThread>
constexpr int one_token_sweep_registers() {
  constexpr bool fits_64 =
      sizeof(StateT) == 4 ? K <= 128 && kRowsPerThread <= 8 : kRowsPerThread <= 4;
  return fits_64 ? 64 : 255;
}

template <typename StateT, int K, int kRowsPerThread, int kMaxRegisters>
__global__ void __launch_bounds__(256) __maxnreg__(kMaxRegisters)
    gdn_decode_vk_one_token_sweep_kernel(const DecodeProblem p, int tiles_per_head) {
  using Shape = VKShape<StateT, K, kRowsPerThread>;
  constexpr int kVec = Shape::kVec;
  constexpr int kLanes = Shape::kLanesPerRow;
  constexpr int kFragments = Shape::kFragmentsPerLane;
  constexpr int kValues = Shape::kValuesPerLane;
  constexpr int kRows = kRowsPerThread;
  constexpr int kDots = 2 * kRows;  // (S.k, S.q) per row, interleaved
  // Each lane ends the butterfly owning one dot (2R <= lanes) or a row's two dots (2R = 2 x
  // lanes, the largest tiles).
  static_assert(kDots <= 2 * kLanes, "at most two dots per lane after the butterfly");
  constexpr bool kRowPerLane = kDots > kLanes;

  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int lane_in_row = lane % kLanes;
  const int row_in_pass = lane / kLanes;
  const int group_base = lane - lane_in_row;

  const int64_t tile = blockIdx.x % tiles_per_head;
  const int64_t head_task = blockIdx.x / tiles_per_head;
  const int64_t hv = head_task % p.num_v_heads;
  const int64_t n = head_task / p.num_v_heads;
  const int64_t request_row = p.variable_length ? 0 : n;
  const int64_t h = p.qk_head_of(hv);
  const int rows_per_cta = static_cast<int>(blockDim.x / 32) * Shape::kRowsPerWarp;
  const int thread_first_row =
      static_cast<int>(tile) * rows_per_cta + warp * Shape::kRowsPerWarp + row_in_pass;
  const int head_v = static_cast<int>(p.head_v);
  auto row_of = [&](int r) { return thread_first_row + r * Shape::kRowsPerPass; };
  auto column_of = [&](int f) { return (f * kLanes + lane_in_row) * kVec; };

  // After the butterfly this lane owns dot index `owned` of its row group: row owned / 2,
  // S.k for even indices, S.q for odd ones.
  const int owned = scattered_index<kDots, kLanes>(lane_in_row);
  const int owned_row = owned / 2;
  const bool owns_dot_k =
      kRowPerLane || ((owned % 2) == 0 && lane_in_row == scattered_lane<kDots, kLanes>(owned));
  const int dot_q_lane = group_base + scattered_lane<kDots, kLanes>(owned + 1);

  // Token inputs first, then the index, then the state: two DRAM round trips in all.
  const TokenRange range = request_tokens(p, n);
  float q[kValues], k[kValues];
  float gate_a, gate_b, A_log = 0.0f, dt_bias = 0.0f, owned_v = 0.0f;
  {
    const int64_t token = range.origin;
    const int64_t q_base = token_offset(p.q, request_row, token, h);
    const int64_t k_base = token_offset(p.k, request_row, token, h);
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
      load_elements<kVec>(p.q.data, p.q.dtype, q_base + column_of(f), &q[f * kVec]);
      load_elements<kVec>(p.k.data, p.k.dtype, k_base + column_of(f), &k[f * kVec]);
    }
    const TokenTensor& a = p.fused_gating ? p.a : p.g;
    const TokenTensor& b = p.fused_gating ? p.b : p.beta;
    gate_a = load_element(a.data, a.dtype, token_offset(a, request_row, token, hv));
    gate_b = load_element(b.data, b.dtype, token_offset(b, request_row, token, hv));
    if (p.fused_gating) {
      A_log = p.A_log[hv * p.A_log_stride];
      dt_bias = load_element(p.dt_bias, p.dt_bias_dtype, hv * p.dt_bias_stride);
    }
    // Only the lane that will compute a row's u needs that row's v.
    if (owns_dot_k && row_of(owned_row) < head_v) {
      owned_v = load_element(p.v.data, p.v.dtype,
                             token_offset(p.v, request_row, token, hv) + row_of(owned_row));
    }
  }

  const RequestPlan plan = plan_request(p, n);
  if (plan.invalid && hv == 0 && tile == 0 && threadIdx.x == 0) count_invalid(p);
  const int64_t out_base = token_offset(p.out, request_row, plan.token_origin, hv);
  if (plan.read_slot < 0 || plan.num_tokens != 1) {
    // Padding or invalid request (the dispatcher sends only one-token requests here; a longer
    // one was made invalid by its capacity of 1): zero output, no slot touched.
    if (plan.num_tokens == 1 && owns_dot_k && row_of(owned_row) < head_v) {
      store_element(p.out.data, p.out.dtype, out_base + row_of(owned_row), 0.0f);
    }
    return;
  }

  StateT* pool = static_cast<StateT*>(p.state);
  uint4 raw[kRows][kFragments];
  {
    const StateT* head = pool + slot_offset(p, plan.read_slot, hv);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int f = 0; f < kFragments; ++f) {
        raw[r][f] = row_of(r) < head_v
                        ? __ldg(reinterpret_cast<const uint4*>(head + row_of(r) * K + column_of(f)))
                        : make_uint4(0, 0, 0, 0);
      }
    }
  }

  // Token scalars while the state is in flight; q and k stay unnormalized, their factors are
  // folded into the dots and the update.
  // A head with a NaN or an infinity among its inputs is refused before anything is stored
  // (docs/gdn-decode.md, "Non-finite inputs"); its loads overlap the state's.
  if (first_nonfinite_token(p, request_row, plan.token_origin, 1, hv, lane) == 0) {
    if (owns_dot_k && row_of(owned_row) < head_v) {
      store_element(p.out.data, p.out.dtype, out_base + row_of(owned_row),
                    __int_as_float(0x7fffffff));
    }
    if (tile == 0 && warp == 0 && lane == 0) count_refused_head(p);
    return;
  }

  float norms[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // q.q, k.k, q.k, (pad)
#pragma unroll
  for (int e = 0; e < kValues; ++e) {
    norms[0] += q[e] * q[e];
    norms[1] += k[e] * k[e];
    norms[2] += q[e] * k[e];
  }
#pragma unroll
  for (int i = 0; i < 3; ++i)
    norms[i] = group_sum<kLanes>(norms[i]);
  const float q_factor = p.use_qk_l2norm ? p.scale * rsqrtf(norms[0] + p.l2norm_eps) : p.scale;
  const float k_factor = p.use_qk_l2norm ? rsqrtf(norms[1] + p.l2norm_eps) : 1.0f;
  const float k_dot_q = norms[2] * q_factor * k_factor;
  const float g = p.fused_gating ? fused_log_decay(A_log, gate_a, dt_bias, p.softplus_beta,
                                                   p.softplus_threshold)
                                 : gate_a;
  const float decay = expf(g);
  const float beta = p.fused_gating ? sigmoid(gate_b) : gate_b;

  float dots[kDots];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    float dot_k = 0.0f, dot_q = 0.0f;
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
      float values[kVec];
      unpack_fragment<StateT>(raw[r][f], values);
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        dot_k += values[e] * k[f * kVec + e];
        dot_q += values[e] * q[f * kVec + e];
      }
    }
    dots[2 * r] = dot_k;
    dots[2 * r + 1] = dot_q;
  }
  reduce_scatter<kDots, kLanes>(dots, lane_in_row);
  // The owner of a row's S.k has its S.q too or fetches it from its partner; it finishes the
  // row.
  const float partner_dot_q = __shfl_sync(0xffffffffu, dots[0], dot_q_lane);
  const float owned_dot_q = (kRowPerLane ? dots[1] : partner_dot_q) * q_factor;
  const float u = beta * (owned_v - decay * dots[0] * k_factor);
  if (owns_dot_k && row_of(owned_row) < head_v) {
    store_element(p.out.data, p.out.dtype, out_base + row_of(owned_row),
                  decay * owned_dot_q + u * k_dot_q);
  }

  // Where the new state goes: the final slot, the verify cache, a per-token slot.
  const TokenStateTargets<StateT> after = token_state_targets<StateT>(p, n, 0, hv);
  StateT* targets[3] = {plan.final_slot >= 0 ? pool + slot_offset(p, plan.final_slot, hv) : nullptr,
                        after.cache, after.token_slot};
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float row_u =
        __shfl_sync(0xffffffffu, u, group_base + scattered_lane<kDots, kLanes>(2 * r)) * k_factor;
    if (row_of(r) >= head_v) continue;
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
      float values[kVec];
      unpack_fragment<StateT>(raw[r][f], values);
#pragma unroll
      for (int e = 0; e < kVec; ++e)
        values[e] = decay * values[e] + row_u * k[f * kVec + e];
#pragma unroll
      for (int which = 0; which < 3; ++which) {
        if (targets[which] != nullptr) {
          Fragment<StateT>::store(targets[which] + row_of(r) * K + column_of(f), values);
        }
      }
    }
  }
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
