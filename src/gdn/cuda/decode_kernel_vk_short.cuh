// GDN decode for pools in layout kVK, requests of up to 32 tokens: every one-token call, and the
// multi-token calls the dispatcher does not send to the general kernel (docs/gdn-cuda-dispatch.md).
// The general kernel's work split and arithmetic per row
// (decode_kernel_vk_general.cuh: a warp owns a tile of rows of one (request, head), each lane
// R rows x K / L columns in fp32 registers across the tokens, one butterfly for all dots), with
// fewer values live in the token loop, so that more warps fit an SM without a spill (the general
// kernel takes 146-174 registers uncapped and is capped at 128):
// - q, k and v have their dtype as a template parameter, and q and k stay in the 32-bit words
//   they were loaded as; an element is converted where it is used (a shift or a mask for
//   bf16), once per column for all rows (columns outside, rows inside);
// - the decay and beta of token t are computed once, by lane t of the warp, before the first
//   token, and broadcast by a shuffle when the token runs: no lane holds the gate inputs of the
//   next token or computes exp and sigmoid for every token. So a call runs here only when no
//   request has more than 32 tokens (kShortMaxTokens; the dispatcher checks it): reloading the
//   gates inside the loop every 32 tokens raised the lowest spill-free register cap by 8;
// - token offsets (q, k, v, out, the gates) are 32-bit where the host proved every offset of the
//   call fits (token_offsets_fit_32_bits); pool and verify-cache offsets stay 64-bit;
// - the per-token pool slots of 2-D state_indices are compiled only into the instances the
//   launcher picks for such calls, their slots read once, token t's by lane t, like the gates;
// - only the next token's q, k and v are loaded ahead, v only by the lanes that finish a row, and
//   only once this token's q is consumed (the load addresses depend on this token's k norm, so
//   the instruction scheduler cannot move the loads up next to both vectors of the token);
// - request and head indices are hidden from loop-invariant hoisting, so per-token offsets are
//   recomputed (a few integer instructions) instead of held in registers across the tokens;
// - one-token calls run a build without the token loop (kOneToken; bf16 state above 192 heads on
//   the full problem, and in the common form bf16 state always and fp32 up to 4096 heads): every
//   lane loads the token's gates itself (one broadcast load) instead of receiving them by
//   shuffle, nothing is loaded ahead, and with fewer values live it fits a lower register cap
//   (bf16, K = 128: 64 instead of 80 on the full problem, 32 warps per SM instead of 24;
//   docs/gdn-cuda-dispatch.md);
// - calls of the common form (common_decode_problem.h: fixed length or a one-token decode step
//   with cu_seqlens, fused gating, one input dtype, aligned q and k, per-request int32 indices)
//   take their parameters as a CommonDecodeProblem (or CommonDecodeStepProblem): fewer
//   constant-cache lines on a small batch's critical path, and no dtype, alignment or mode cases
//   in the instruction stream; with fp32 state there each lane addresses its state from one
//   register with immediate offsets (kCompactAddressing: 64 registers for the one-token build).
// Register counts of every instance: docs/gdn-cuda-dispatch.md.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "core/fast_divide.h"
#include "gdn/common_decode_problem.h"
#include "gdn/cuda/decode_launch.h"
#include "gdn/cuda/decode_vk_short_registers.h"
#include "gdn/cuda/device_helpers.cuh"
#include "gdn/decode_problem.h"
#include "gdn/gating.h"
#include "gdn/short_kernel_fit.h"
#include "hdk/dtype.h"

namespace hdk {
namespace gdn {
namespace detail {

// q, k or v elements of type InputT as the 32-bit words they were loaded in; value(words, e)
// converts element e of a lane's run of elements.
template <typename InputT>
struct PackedInput;

template <>
struct PackedInput<__nv_bfloat16> {
  static constexpr DType kDType = DType::kBFloat16;
  static constexpr int kPerWord = 2;
  __device__ __forceinline__ static float value(const uint32_t* words, int e) {
    // bf16 -> fp32 is a 16-bit shift (low half) or a mask (high half).
    const uint32_t word = words[e / 2];
    return __uint_as_float(e % 2 == 0 ? word << 16 : word & 0xffff0000u);
  }
  __device__ __forceinline__ static float scalar(uint32_t raw) {
    return __uint_as_float(raw << 16);
  }
};

template <>
struct PackedInput<__half> {
  static constexpr DType kDType = DType::kFloat16;
  static constexpr int kPerWord = 2;
  __device__ __forceinline__ static float value(const uint32_t* words, int e) {
    const uint32_t word = words[e / 2];
    return __half2float(
        __ushort_as_half(static_cast<unsigned short>(e % 2 == 0 ? word : word >> 16)));
  }
  __device__ __forceinline__ static float scalar(uint32_t raw) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(raw)));
  }
};

template <>
struct PackedInput<float> {
  static constexpr DType kDType = DType::kFloat32;
  static constexpr int kPerWord = 1;
  __device__ __forceinline__ static float value(const uint32_t* words, int e) {
    return __uint_as_float(words[e]);
  }
  __device__ __forceinline__ static float scalar(uint32_t raw) { return __uint_as_float(raw); }
};

// The raw bits of one element of a q/k/v-typed tensor (converted by PackedInput::scalar).
template <typename InputT>
__device__ __forceinline__ uint32_t load_input_bits(const void* base, int64_t offset) {
  if constexpr (sizeof(InputT) == 4) {
    return __ldg(static_cast<const unsigned int*>(base) + offset);
  } else {
    return __ldg(static_cast<const unsigned short*>(base) + offset);
  }
}

// Makes `value` look changed to the optimizer, at no cost: what the token loop computes from it
// (token offsets, pointers) is then computed where it is used instead of being hoisted out of
// the loop into registers held across all tokens, which would cost more warps per SM than the
// few integer instructions per token it saves.
template <typename T>
__device__ __forceinline__ void hide_from_hoisting(T& value) {
  if constexpr (sizeof(T) == 8) {
    asm volatile("" : "+l"(value));
  } else {
    asm volatile("" : "+r"(value));
  }
}

// Register cap of each instance (decode_vk_short_registers.h).
template <typename StateT, typename InputT, int K, int kRowsPerThread, int kLanes,
          bool kNarrowOffsets, bool kTokenSlots, bool kOneToken>
constexpr int short_kernel_registers() {
  constexpr ShortInput kInput = std::is_same_v<InputT, float>    ? ShortInput::kFp32
                                : std::is_same_v<InputT, __half> ? ShortInput::kFp16
                                                                 : ShortInput::kBf16;
  return short_register_cap(static_cast<int>(sizeof(StateT)), kInput, K, kRowsPerThread, kLanes,
                            kNarrowOffsets, kTokenSlots, kOneToken);
}

// The q/k head that value head hv reads.
__device__ __forceinline__ int qk_head_of(const DecodeProblem& p, int hv) {
  return hv / static_cast<int>(p.num_v_heads / p.num_qk_heads);
}
__device__ __forceinline__ int qk_head_of(const CommonDecodeProblem& p, int hv) {
  return static_cast<int>(
      hdk::detail::fast_quotient(static_cast<uint32_t>(hv), p.qk_head_multiplier, p.qk_head_shift));
}

// Problem: DecodeProblem (any call), or CommonDecodeProblem / CommonDecodeStepProblem for a call
// of the common form (fixed length / SGLang's one-token decode step with cu_seqlens).
template <typename Problem, typename StateT, typename InputT, int K, int kRowsPerThread, int kLanes,
          bool kNarrowOffsets, bool kTokenSlots, bool kOneToken, bool kStateFirst,
          int kMaxRegisters>
__global__ void __launch_bounds__(kVKWarpsPerCta * 32) __maxnreg__(kMaxRegisters)
    gdn_decode_vk_short_kernel(int tiles_per_head, const Problem p) {
  // tiles_per_head comes first: it then shares the parameters' first constant-cache line with
  // the head of `p` (both problem types' field order) instead of taking a line of its own.
  constexpr bool kCommonForm = std::is_base_of_v<CommonDecodeProblem, Problem>;
  // fp32 state of the common form: whole tiles of rows (the host checked V against the rows of a
  // warp), so no row is bounds-checked, and each lane addresses its state from one register with
  // immediate offsets instead of a 64-bit address per row. That is what let the one-token build
  // fit 64 registers and the token loop 80 (from 72 and 96); with bf16 state the same change
  // measured 1-4% slower at T = 1 (docs/gdn-cuda-dispatch.md), so bf16 keeps its addressing.
  constexpr bool kCompactAddressing = kCommonForm && sizeof(StateT) == 4;
  static_assert(!(kCommonForm && kTokenSlots), "the common form has no per-token slots");
  using Shape = VKShape<StateT, K, kRowsPerThread, kLanes>;
  using Input = PackedInput<InputT>;
  // Token offsets: 32-bit only where the launcher proved they fit.
  using Offset = std::conditional_t<kNarrowOffsets, int32_t, int64_t>;
  constexpr int kVec = Shape::kVec;
  constexpr int kFragments = Shape::kFragmentsPerLane;
  constexpr int kValues = Shape::kValuesPerLane;
  constexpr int kRows = kRowsPerThread;
  constexpr int kDots = 2 * kRows;  // (S.k, S.q) per row, interleaved
  constexpr int kWords = kValues / Input::kPerWord;
  constexpr int kFragmentWords = kVec / Input::kPerWord;
  static_assert(kDots <= kLanes, "each lane must end the butterfly owning one dot");

  // The grid is (CTA of the head's row tiles, value head, request): no division on the way to
  // the pool index, which at small batches is on the critical path of the whole step. The row
  // tiles are its fastest dimension so that CTAs launched together read one head's contiguous
  // state: with the request fastest instead, an H100 measured 5-19% slower.
  const int lane = threadIdx.x % 32;
  const int tile = static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
  if (tile >= tiles_per_head) return;  // the head's last CTA
  // Request and head indices in the token-offset type (narrow: the host checked B x HV). Not
  // const: the token loop hides them from the optimizer (hide_from_hoisting).
  Offset n = static_cast<Offset>(blockIdx.z);
  Offset hv = static_cast<Offset>(blockIdx.y);
  Offset h = static_cast<Offset>(qk_head_of(p, static_cast<int>(blockIdx.y)));
  const int lane_in_row = lane % kLanes;
  const int group_base = lane - lane_in_row;
  // Offsets inside one head fit in 32 bits (V * K <= 65536).
  const int thread_first_row = static_cast<int>(tile) * Shape::kRowsPerWarp + lane / kLanes;
  const int head_v = static_cast<int>(p.head_v);
  auto row_of = [&](int r) { return thread_first_row + r * Shape::kRowsPerPass; };
  auto row_valid = [&](int r) { return kCompactAddressing || row_of(r) < head_v; };
  auto column_of = [&](int f) { return (f * kLanes + lane_in_row) * kVec; };
  // With compact addressing, element (row r, fragment f) of this lane in a head's state is
  // lane_origin(head) + compact_offset(r, f), a compile-time distance from the lane's first
  // element: the loads and stores take one address register and immediate offsets.
  auto lane_origin = [&](auto* head) { return head + (thread_first_row * K + column_of(0)); };
  auto compact_offset = [](int r, int f) {
    return r * Shape::kRowsPerPass * K + f * kLanes * kVec;
  };

  // After the butterfly this lane holds dot index `owned`: row owned / 2, S.k for even
  // indices, S.q for odd ones. The lowest lane holding a row's S.k finishes that row.
  const int owned = scattered_index<kDots, kLanes>(lane_in_row);
  const int owned_row = owned / 2;
  const bool finishes_row = (owned % 2) == 0 &&
                            lane_in_row == scattered_lane<kDots, kLanes>(owned) &&
                            row_valid(owned_row);
  const int dot_q_lane = group_base + scattered_lane<kDots, kLanes>(owned | 1);

  // Element offset of (token, head) in a per-token tensor of this request.
  auto token_at = [&](const auto& x, Offset token, Offset head) -> Offset {
    const Offset request_row = p.variable_length ? 0 : n;
    return request_row * static_cast<Offset>(x.stride_request) +
           token * static_cast<Offset>(x.stride_token) + head * static_cast<Offset>(x.stride_head);
  };

  // One token's q and k, this lane's columns, as loaded.
  struct TokenQK {
    uint32_t q[kWords], k[kWords];
  };
  auto load_qk = [&](Offset token, TokenQK& x) {
    const Offset q_base = token_at(p.q, token, h);
    const Offset k_base = token_at(p.k, token, h);
#pragma unroll
    for (int f = 0; f < kFragments; ++f) {
      // One fragment's columns are contiguous; a lane's fragments are kLanes x kVec apart.
      RawVector<kVec, sizeof(InputT)> piece_q, piece_k;
      if constexpr (kCommonForm) {
        piece_q.load_aligned(p.q.data, q_base + column_of(f));
        piece_k.load_aligned(p.k.data, k_base + column_of(f));
      } else {
        piece_q.load(p.q.data, q_base + column_of(f));
        piece_k.load(p.k.data, k_base + column_of(f));
      }
#pragma unroll
      for (int w = 0; w < kFragmentWords; ++w) {
        x.q[f * kFragmentWords + w] = piece_q.words[w];
        x.k[f * kFragmentWords + w] = piece_k.words[w];
      }
    }
  };
  // v of the row this lane finishes (only finishing lanes load it).
  auto load_v = [&](Offset token) -> uint32_t {
    return finishes_row
               ? load_input_bits<InputT>(p.v.data, token_at(p.v, token, hv) + row_of(owned_row))
               : 0u;
  };
  // Per-token scalars, token j of the request in lane j (at most kShortMaxTokens tokens): the
  // gate inputs (raw bits), turned into decay and beta once they arrived, and with per-token
  // slots the slot the state after the token goes to.
  // Each dtype read on its mode's path only: a select would read g and beta, whose constant-cache
  // line a fused step never needs. The common form's gates are of the input type.
  DType gate_a_dtype = DType::kFloat32, gate_b_dtype = DType::kFloat32;
  if constexpr (!kCommonForm) {
    if (p.fused_gating) {
      gate_a_dtype = p.a.dtype;
      gate_b_dtype = p.b.dtype;
    } else {
      gate_a_dtype = p.g.dtype;
      gate_b_dtype = p.beta.dtype;
    }
  }
  uint32_t gate_a_bits = 0, gate_b_bits = 0;
  Offset lane_slot = -1;
  auto load_token_scalars = [&](Offset origin, Offset count) {
    // One-token build: every lane loads token 0's scalars (one broadcast load), so no shuffle
    // hands them out later.
    const Offset t = kOneToken ? 0 : lane;
    if (t < count) {
      const Offset token = origin + t;
      if constexpr (kCommonForm) {
        gate_a_bits = load_input_bits<InputT>(p.a.data, token_at(p.a, token, hv));
        gate_b_bits = load_input_bits<InputT>(p.b.data, token_at(p.b, token, hv));
      } else {
        gate_a_bits = p.fused_gating
                          ? load_raw_element(p.a.data, p.a.dtype, token_at(p.a, token, hv))
                          : load_raw_element(p.g.data, p.g.dtype, token_at(p.g, token, hv));
        gate_b_bits =
            p.fused_gating
                ? load_raw_element(p.b.data, p.b.dtype, token_at(p.b, token, hv))
                : load_raw_element(p.beta.data, p.beta.dtype, token_at(p.beta, token, hv));
      }
      // A request longer than the index columns is invalid and runs no token: its columns
      // past C are not read (they would lie outside the index tensor).
      if constexpr (kTokenSlots) {
        if (t < p.index_columns) lane_slot = static_cast<Offset>(per_token_write_slot(p, n, t));
      }
    }
  };
  auto finish_gates = [&](float A_log, float dt_bias, float& decay, float& beta) {
    const float gate_a =
        kCommonForm ? Input::scalar(gate_a_bits) : raw_to_float(gate_a_bits, gate_a_dtype);
    const float gate_b =
        kCommonForm ? Input::scalar(gate_b_bits) : raw_to_float(gate_b_bits, gate_b_dtype);
    const float g = p.fused_gating ? fused_log_decay(A_log, gate_a, dt_bias, p.softplus_beta,
                                                     p.softplus_threshold)
                                   : gate_a;
    decay = expf(g);
    beta = p.fused_gating ? sigmoid(gate_b) : gate_b;
  };

  // One output element; the common form's output is of the input type.
  auto store_out = [&](Offset offset, float value) {
    if constexpr (kCommonForm) {
      store_element(p.out.data, Input::kDType, offset, value);
    } else {
      store_element(p.out.data, p.out.dtype, offset, value);
    }
  };

  // The first token's inputs and every token's gates, then the pool index, then the state: two
  // DRAM round trips before the first token can start. kStateFirst loads the inputs after the
  // state instead (the launcher's choice, decode_launch.h): the same statements, written out
  // twice, because through one lambda for both places ptxas scheduled most inputs-first
  // instances differently from the code that was measured.
  // Each token's whole v row, loaded ahead with its other inputs (device_helpers.cuh).
  using VRow = RowPieces<sizeof(InputT), static_cast<int>((K * sizeof(InputT) + 255) / 256)>;
  const bool v_row_held = VRow::held(p.v, head_v);
  // Where each build tests its tokens' inputs, as measured (bench/results/gdn-h200): with fp32
  // state, the one-token build before the state's loads (its register cap leaves no room for
  // the test next to the state) and the token loop where a token starts, on the words as
  // loaded; with bf16 state, whose warps move half the bytes for the same instructions, after a
  // token's dots, with q and k through their norms (run_token).
  constexpr bool kEarlyTest = kOneToken && sizeof(StateT) == 4;
  constexpr bool kNormTest = sizeof(StateT) == 2;
  auto qk_rows_nonfinite = [&](Offset token) {
    constexpr int kBytes = static_cast<int>(sizeof(InputT));
    return (nonfinite_rows<kBytes>(
                p.q.data, Input::kDType, [&](int) { return token_at(p.q, token, h); }, 1, K,
                rows_in_pieces(p.q, kBytes, K), lane) |
            nonfinite_rows<kBytes>(
                p.k.data, Input::kDType, [&](int) { return token_at(p.k, token, h); }, 1, K,
                rows_in_pieces(p.k, kBytes, K), lane)) != 0;
  };
  auto load_v_row = [&](Offset token, VRow& row) {
    row.load(p.v.data, token_at(p.v, token, hv), head_v, v_row_held, lane);
  };
  TokenQK next;
  uint32_t next_v = 0;
  VRow next_v_row;
  if constexpr (!kStateFirst) {
    // Before the plan is known: the token range from cu_seqlens only.
    const TokenRange range = request_tokens(p, n);
    const Offset first_token = static_cast<Offset>(range.origin);
    if (range.count > 0) {
      load_qk(first_token, next);
      next_v = load_v(first_token);
      load_v_row(first_token, next_v_row);
    }
    load_token_scalars(first_token, static_cast<Offset>(range.count));
  }
  float A_log = 0.0f, dt_bias = 0.0f;
  if (!kStateFirst && p.fused_gating) {
    A_log = p.A_log[hv * p.A_log_stride];
    dt_bias = load_element(p.dt_bias, p.dt_bias_dtype, hv * p.dt_bias_stride);
  }

  const RequestPlan plan = plan_request(p, n);
  if (plan.invalid && hv == 0 && tile == 0 && lane == 0) count_invalid(p);
  const Offset origin = static_cast<Offset>(plan.token_origin);
  // Slot numbers fit the offset type (narrow: the host checked the pool size).
  const Offset final_slot = static_cast<Offset>(plan.final_slot);
  const Offset num_tokens = static_cast<Offset>(plan.num_tokens);
  if (plan.read_slot < 0) {
    // Padding (or invalid) request: zero output, no slot touched.
    for (Offset t = 0; t < num_tokens; ++t) {
      if (finishes_row) store_out(token_at(p.out, origin + t, hv) + row_of(owned_row), 0.0f);
    }
    return;
  }

  // A head runs up to its first token with a NaN or an infinity among its inputs; from there its
  // outputs are NaN and no state is stored (docs/gdn-decode.md, "Non-finite inputs"). The gates
  // are tested here, as loaded (token t's in lane t; bit t of nonfinite_tokens); with
  // kEarlyTest all of the one token's inputs too, before the state's loads when the inputs come
  // first (they arrived with the pool index), so that only the verdict stays live next to the
  // state; otherwise run_token tests each token's q, k and v row.
  uint32_t nonfinite_tokens = 0;
  auto test_inputs = [&] {
    const DType gate_a_type = kCommonForm ? Input::kDType : gate_a_dtype;
    const DType gate_b_type = kCommonForm ? Input::kDType : gate_b_dtype;
    bool nonfinite =
        raw_is_nonfinite(gate_a_bits, gate_a_type) | raw_is_nonfinite(gate_b_bits, gate_b_type);
    if constexpr (kEarlyTest) {
      if (num_tokens > 0) {
        nonfinite |= words_are_nonfinite<kWords>(next.q, sizeof(InputT), Input::kDType) |
                     words_are_nonfinite<kWords>(next.k, sizeof(InputT), Input::kDType) |
                     next_v_row.nonfinite(p.v.data, Input::kDType, token_at(p.v, origin, hv),
                                          head_v, v_row_held, lane);
      }
      nonfinite_tokens = __any_sync(0xffffffffu, nonfinite) ? 1u : 0u;
    } else if constexpr (kOneToken) {
      nonfinite_tokens = nonfinite ? 1u : 0u;  // every lane holds token 0's gates
    } else {
      nonfinite_tokens = __ballot_sync(0xffffffffu, nonfinite);
    }
  };
  if constexpr (!kStateFirst) test_inputs();

  StateT* pool = static_cast<StateT*>(p.state);
  float state[kRows][kValues];
  {
    const StateT* head = pool + slot_offset(p, plan.read_slot, hv);
    const StateT* origin = lane_origin(head);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int f = 0; f < kFragments; ++f) {
        if (row_valid(r)) {
          if constexpr (kCompactAddressing) {
            Fragment<StateT>::load(origin + compact_offset(r, f), &state[r][f * kVec]);
          } else {
            Fragment<StateT>::load(head + row_of(r) * K + column_of(f), &state[r][f * kVec]);
          }
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e)
            state[r][f * kVec + e] = 0.0f;
        }
      }
    }
  }
  if constexpr (kStateFirst) {
    const TokenRange range = request_tokens(p, n);
    const Offset first_token = static_cast<Offset>(range.origin);
    if (range.count > 0) {
      load_qk(first_token, next);
      next_v = load_v(first_token);
      load_v_row(first_token, next_v_row);
    }
    load_token_scalars(first_token, static_cast<Offset>(range.count));
    if (p.fused_gating) {
      A_log = p.A_log[hv * p.A_log_stride];
      dt_bias = load_element(p.dt_bias, p.dt_bias_dtype, hv * p.dt_bias_stride);
    }
  }
  if constexpr (kStateFirst) test_inputs();
  float lane_decay, lane_beta;
  finish_gates(A_log, dt_bias, lane_decay, lane_beta);

  bool refused = false;  // from the token that set it on
  // Token t of the request; t + 1 < num_tokens says whether a next token's inputs are due.
  auto run_token = [&](Offset t) {
    if constexpr (!kOneToken) {
      hide_from_hoisting(n);
      hide_from_hoisting(hv);
      hide_from_hoisting(h);
    }
    const int token_lane = static_cast<int>(t);  // t < kShortMaxTokens
    // Token t's scalars: in lane t, or in every lane in the one-token build.
    auto token_scalar = [&](auto value) {
      return kOneToken ? value : __shfl_sync(0xffffffffu, value, token_lane);
    };
    const TokenQK current = next;
    const uint32_t current_v = next_v;
    const VRow current_v_row = next_v_row;
    // From the first refused token on, the head's outputs are NaN and nothing else is stored;
    // the arithmetic runs on (its results are dropped), which keeps the token's code one path.
    if constexpr (kEarlyTest) {
      refused = nonfinite_tokens != 0;
    } else if constexpr (!kNormTest) {
      const bool nonfinite =
          words_are_nonfinite<kWords>(current.q, sizeof(InputT), Input::kDType) |
          words_are_nonfinite<kWords>(current.k, sizeof(InputT), Input::kDType) |
          current_v_row.nonfinite(p.v.data, Input::kDType, token_at(p.v, origin + t, hv), head_v,
                                  v_row_held, lane);
      refused = refused || __any_sync(0xffffffffu, nonfinite) ||
                ((nonfinite_tokens >> token_lane) & 1u) != 0;
    }

    // Both dots of every row and the norms, one column at a time: a column's q and k are
    // converted once and used by all rows.
    float dots[kDots];
#pragma unroll
    for (int i = 0; i < kDots; ++i)
      dots[i] = 0.0f;
    float qq = 0.0f, kk = 0.0f, qk = 0.0f;
#pragma unroll
    for (int e = 0; e < kValues; ++e) {
      const float q_e = Input::value(current.q, e);
      const float k_e = Input::value(current.k, e);
      qq += q_e * q_e;
      kk += k_e * k_e;
      qk += q_e * k_e;
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        dots[2 * r] += state[r][e] * k_e;
        dots[2 * r + 1] += state[r][e] * q_e;
      }
    }
    // The next token's inputs are loaded once this token's q is no longer needed (its k is,
    // for the update): they arrive during the reductions, the update and the stores, and are
    // never held next to both of this token's vectors.
    kk = group_sum<kLanes>(kk);
    if (!kOneToken && t + 1 < num_tokens) {
      const Offset after = origin + t + 1 + (kk < 0.0f ? 1 : 0);
      load_qk(after, next);
      next_v = load_v(after);
      load_v_row(after, next_v_row);
    }
    qq = group_sum<kLanes>(qq);
    qk = group_sum<kLanes>(qk);
    reduce_scatter<kDots, kLanes>(dots, lane_in_row);
    if constexpr (kNormTest) {
      // q and k through their norms: a sum of squares is finite exactly when all its values
      // are, unless it overflows (|x| above about 1.8e19), so only a non-finite norm sends the
      // warp to the exact test, which reads the token's q and k rows again. No register of the
      // test is live through the dots.
      const uint32_t found = __reduce_or_sync(
          0xffffffffu,
          (current_v_row.nonfinite(p.v.data, Input::kDType, token_at(p.v, origin + t, hv), head_v,
                                   v_row_held, lane)
               ? 1u
               : 0u) |
              (isfinite(qq) && isfinite(kk) ? 0u : 2u));
      const bool qk_nonfinite = (found & 2u) != 0 && qk_rows_nonfinite(origin + t);
      refused = refused || (found & 1u) != 0 || qk_nonfinite ||
                ((nonfinite_tokens >> token_lane) & 1u) != 0;
    }

    const float q_factor = p.use_qk_l2norm ? p.scale * rsqrtf(qq + p.l2norm_eps) : p.scale;
    const float k_factor = p.use_qk_l2norm ? rsqrtf(kk + p.l2norm_eps) : 1.0f;
    const float decay = token_scalar(lane_decay);
    const float beta = token_scalar(lane_beta);

    const float owned_dot_q = __shfl_sync(0xffffffffu, dots[0], dot_q_lane);
    const float u = beta * (Input::scalar(current_v) - decay * dots[0] * k_factor);
    if (finishes_row) {
      store_out(token_at(p.out, origin + t, hv) + row_of(owned_row),
                refused ? __int_as_float(0x7fffffff)
                        : decay * owned_dot_q * q_factor + u * (qk * q_factor * k_factor));
    }
    float row_u[kRows];
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      row_u[r] =
          __shfl_sync(0xffffffffu, u, group_base + scattered_lane<kDots, kLanes>(2 * r)) * k_factor;
    }
#pragma unroll
    for (int e = 0; e < kValues; ++e) {
      const float k_e = Input::value(current.k, e);
#pragma unroll
      for (int r = 0; r < kRows; ++r)
        state[r][e] = decay * state[r][e] + row_u[r] * k_e;
    }

    // States after this token: the verify cache and/or per-token pool slots.
    StateT* targets[2] = {nullptr, nullptr};
    if (p.intermediate_states != nullptr) {
      targets[0] = static_cast<StateT*>(p.intermediate_states) + cache_offset(p, n, t, hv);
    }
    if constexpr (kTokenSlots) {
      const Offset slot = token_scalar(lane_slot);
      if (slot >= 0) targets[1] = pool + slot_offset(p, slot, hv);
    }
#pragma unroll
    for (int which = 0; which < (kTokenSlots ? 2 : 1); ++which) {
      if (targets[which] == nullptr || refused) continue;
      StateT* origin = lane_origin(targets[which]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        if (!row_valid(r)) continue;
#pragma unroll
        for (int f = 0; f < kFragments; ++f) {
          if constexpr (kCompactAddressing) {
            Fragment<StateT>::store(origin + compact_offset(r, f), &state[r][f * kVec]);
          } else {
            Fragment<StateT>::store(targets[which] + row_of(r) * K + column_of(f),
                                    &state[r][f * kVec]);
          }
        }
      }
    }
  };
  if constexpr (kOneToken) {
    // The launcher picks this build only when no request can have more than one token.
    if (num_tokens > 0) run_token(0);
  } else {
    for (Offset t = 0; t < num_tokens; ++t)
      run_token(t);
  }
  if (refused) {
    if (tile == 0 && lane == 0) count_refused_head(p);
    return;
  }

  if (final_slot >= 0) {
    StateT* head = pool + slot_offset(p, final_slot, hv);
    StateT* origin = lane_origin(head);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      if (!row_valid(r)) continue;
#pragma unroll
      for (int f = 0; f < kFragments; ++f) {
        if constexpr (kCompactAddressing) {
          Fragment<StateT>::store_vector(origin + compact_offset(r, f), &state[r][f * kVec]);
        } else {
          Fragment<StateT>::store_vector(head + row_of(r) * K + column_of(f), &state[r][f * kVec]);
        }
      }
    }
  }
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
