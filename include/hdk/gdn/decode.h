// Gated DeltaNet decode: one recurrent-state step (or T steps) over a pool of states.
// The contract is docs/gdn-decode.md; the math (docs/spec.md, "GDN decode"):
//
//   g = -exp(A_log) * softplus(a + dt_bias)      beta = sigmoid(b)      (or g, beta given)
//   S = exp(g) * S;   u = beta * (v - S k);   S = S + u k^T;   o = S q
//
// with q, k l2-normalized (optional) and q scaled, per request n, value head hv, token t.
#pragma once

#include <cstdint>

#include "hdk/cuda_stream.h"
#include "hdk/tensor_view.h"

namespace hdk {
namespace gdn {

// How one head's V x K state matrix is stored inside a pool slot.
enum class StateLayout : uint8_t {
  kVK,  // [HV, V, K], K contiguous: the layout of SGLang, vLLM and FlashInfer pools
  kKV,  // [HV, K, V], V contiguous
};

struct DecodeParams {
  // Per-token inputs: [B, T, ...], or [1, total_tokens, ...] together with cu_seqlens.
  TensorView q;  // [B, T, H, K]   bf16/fp16/fp32, last dim contiguous, any other strides
  TensorView k;  // [B, T, H, K]   same dtype as q
  TensorView v;  // [B, T, HV, V]  same dtype as q

  // Gating: give exactly one of the two sets.
  TensorView A_log;    // [HV] fp32                 } fused gating
  TensorView a;        // [B, T, HV] bf16/fp16/fp32 }
  TensorView dt_bias;  // [HV] fp32 or bf16         }
  TensorView b;        // [B, T, HV] bf16/fp16/fp32 }
  TensorView g;        // [B, T, HV] fp32           } precomputed log-decay and beta
  TensorView beta;     // [B, T, HV] fp32           }

  // The state pool: [P, HV, V, K] (kVK) or [P, HV, K, V] (kKV), fp32 or bf16. Each slot's
  // [HV, V, K] block is contiguous; the slot pitch (stride of dim 0) may be larger.
  TensorView state;

  // Which slot request n reads and writes (int32/int64). Absent: slot n.
  //   [B]:    read state_indices[n]; write the final state there (or to output_state_indices[n]).
  //   [B, C]: speculative decoding (vLLM): read state_indices[n, num_accepted_tokens[n] - 1]
  //           (or [n, 0] without num_accepted_tokens); write the state after token t to
  //           state_indices[n, t]. C >= the request's token count.
  // A negative read index marks a padding row: zero output, no slot read or written.
  TensorView state_indices;
  TensorView output_state_indices;  // [B]: write slot for the final state; negative = no write
  TensorView num_accepted_tokens;   // [B] int32/int64, with 2-D state_indices only
  TensorView cu_seqlens;            // [B + 1] int32/int64: variable-length batch

  // Optional: the state after every token, [B, C, HV, V, K] (or K, V), C >= T, dtype and layout
  // of the pool; indexed by the request's position in the batch, not its slot.
  TensorView intermediate_states;

  TensorView out;  // [B, T, HV, V] bf16/fp16/fp32, required

  // Optional [1] or scalar int32/int64 counter. Each request with an index (or accepted-token
  // count, or cu_seqlens range) that cannot be honoured is run as a padding row and adds 1 here.
  // hdk adds to it and never clears it.
  TensorView invalid_index_count;

  // Optional [1] or scalar int32/int64 counter of refused heads. A (request, value head) whose
  // inputs at token t hold a NaN or an infinity (q and k of its query/key head, v, a and b or g
  // and beta) is refused from t on: its output rows of tokens t.. are NaN, no state from t on is
  // stored (its final slot keeps the state before the call), and 1 is added here. Its tokens
  // before t and the request's other heads run normally. hdk adds to it and never clears it.
  TensorView nonfinite_head_count;

  StateLayout layout = StateLayout::kVK;
  float scale = 0.0f;  // 0 means K^-0.5
  bool use_qk_l2norm = true;
  float l2norm_eps = 1e-6f;
  float softplus_beta = 1.0f;
  float softplus_threshold = 20.0f;
  bool update_state = true;  // false: the pool is only read (speculative verify)

  // With cu_seqlens: an upper bound on any request's token count (0 = none). A request with
  // more tokens is invalid (padding + count). Decode steps in the [1, B] form should pass 1:
  // the CUDA backend then takes its one-token path, which it cannot pick from device-side
  // cu_seqlens alone. With [B, T] tensors it must be 0 or >= T.
  int64_t max_tokens_per_request = 0;

  // Debugging aid, off on the hot path: read the index tensors on the host (a device-to-host
  // copy and a synchronization for CUDA tensors) and throw hdk::Error for any index the call
  // would otherwise count in invalid_index_count, and for two requests that write one slot or
  // write a slot another request reads. Never use it inside CUDA-graph capture.
  bool check_indices = false;
};

// Runs on the device the tensors live on (all on the CPU, or all on one CUDA device).
// CUDA work is enqueued on the legacy default stream.
void decode(const DecodeParams& params);

// Same, with CUDA work enqueued on `stream` (ignored for CPU tensors). No allocation, no host
// synchronization (unless check_indices) and no JIT: the call can be captured in a CUDA graph.
void decode(const DecodeParams& params, CudaStream stream);

}  // namespace gdn
}  // namespace hdk
