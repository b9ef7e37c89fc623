// Kernel launchers, one translation unit per (layout, state dtype) so nvcc compiles them in
// parallel. Only the head sizes the dispatcher accepts are instantiated.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gdn/cuda/decode_vk_short_registers.h"
#include "gdn/decode_problem.h"

namespace hdk {
namespace gdn {
namespace detail {

// State columns one CTA of the KV kernel covers (8 lanes x one 16-byte fragment).
int kv_columns_per_cta(DType state_dtype);

// Lanes that share one state row when each lane reads whole 16-byte fragments of it.
constexpr int full_lanes_per_row(int state_bytes, int64_t head_k) {
  return head_k / (16 / state_bytes) < 32 ? static_cast<int>(head_k / (16 / state_bytes)) : 32;
}

// Rows one warp of a VK kernel covers: (32 / lanes per row) rows per pass, rows_per_thread
// passes.
constexpr int vk_rows_per_warp(int lanes_per_row, int rows_per_thread) {
  return (32 / lanes_per_row) * rows_per_thread;
}

// The short and general kernels' rows per thread where the dispatcher has no measured choice: as
// many as keep every dot owned by one lane after the butterfly (2 x rows <= lanes) and the
// fp32 state within 32 registers per thread.
constexpr int vk_default_rows(int state_bytes, int64_t head_k) {
  const int lanes = full_lanes_per_row(state_bytes, head_k);
  const int by_lanes = lanes / 2;
  const int by_registers = static_cast<int>(32 / (head_k / lanes));
  return by_lanes < by_registers ? by_lanes : by_registers;
}

// Warps per CTA of the short and general kernels (the short one may run fewer): their warps
// never wait for each other, so this only sets the scheduling granule.
constexpr int kVKWarpsPerCta = 4;

// One-token calls with more than this many (request, value head) pairs run the short kernel as
// 1-warp CTAs (docs/gdn-cuda-dispatch.md has the measurements).
constexpr int64_t kShortOneTokenMaxHeads = 1024;

// One-token calls with bf16 state and at most this many (request, value head) pairs run the short
// kernel's build with the token loop, more run its one-token build, on the full parameter block;
// calls of the common form run the one-token build at every size (docs/gdn-cuda-dispatch.md has
// the measurements).
constexpr int64_t kShortTokenLoopBuildMaxHeads = 192;

// Whether the common form's one-token build with fp32 state loads the state before the token's
// inputs, for a grid of `warps` warps on `sm_count` SMs (64 registers a thread: 32 warps an SM):
// yes, unless the grid fills more than half of the warp slots without exceeding them. Then every
// warp's loads are issued together, and the inputs' loads would wait behind all of the state's
// (docs/gdn-cuda-dispatch.md has the measurements).
constexpr bool short_fp32_state_first_pays(int64_t warps, int sm_count) {
  constexpr int64_t kRegistersPerSm = 65536;
  const int64_t warps_per_sm = kRegistersPerSm / (short_common_form_register_cap(4, true) * 32);
  const int64_t resident = sm_count * warps_per_sm;
  return warps > resident || 2 * warps <= resident;
}

// The short kernel's instances that load the state before the token's inputs: the common form's
// one-token build with fp32 state (bf16 state spilled in that order at the one-token build's
// register caps).
constexpr bool short_state_first_built(int state_bytes, bool one_token) {
  return state_bytes == 4 && one_token;
}

// Verify calls with fp32 state and more than two tokens per request run the short kernel up to
// this many (request, value head) pairs, the general one above (docs/gdn-cuda-dispatch.md has
// the measurements).
constexpr int64_t kShortFp32VerifyMaxHeads = 1024;

// CUDA grid limits: x, then y and z. The short kernel's grid is (CTA of row tiles, value head,
// request), so it takes at most 65535 requests (larger batches run the general kernel); the
// other kernels' grids are one-dimensional.
constexpr int64_t kMaxGridX = 0x7fffffff;
constexpr int64_t kMaxGridYZ = 65535;

// The short kernel's instances built for calls of the common form (common_decode_problem.h): bf16
// q/k/v, K = 128, the dispatcher's default shape for the state dtype (lanes per row, rows per
// thread). Other shapes and input types run on the full DecodeProblem.
constexpr bool common_form_built(int state_bytes, int64_t head_k, int lanes_per_row,
                                 int rows_per_thread, bool bf16_input) {
  return bf16_input && head_k == 128 && lanes_per_row == full_lanes_per_row(state_bytes, head_k) &&
         rows_per_thread == vk_default_rows(state_bytes, head_k);
}

// Bytes of q (and k) one lane of the short kernel loads as one piece: a state fragment's columns
// (16 bytes of state) in the input type.
constexpr int64_t short_input_piece_bytes(int state_bytes, int input_bytes) {
  return (16 / state_bytes) * input_bytes;
}

// The general kernel: every warp owns rows_per_thread x (32 / lanes_per_row) rows of one head;
// tiles_per_head counts warps.
template <typename StateT>
void launch_decode_vk_general(const DecodeProblem& problem, int lanes_per_row, int rows_per_thread,
                              int64_t tiles_per_head, cudaStream_t stream);

// How the short kernel is launched: its shape (one of kVKShapes, as for the general kernel), its
// grid, and which of its builds runs.
struct ShortLaunch {
  int warps_per_cta = 0;
  int lanes_per_row = 0;
  int rows_per_thread = 0;
  int64_t tiles_per_head = 0;
  // The call's token offsets fit in 32 bits (token_offsets_fit_32_bits).
  bool narrow_offsets = false;
  // No request has more than one token: the build without a token loop (bf16 state, or the
  // common form).
  bool one_token = false;
  // The call has the common form and an instance for it is built (common_form_built): the
  // parameters go as a CommonDecodeProblem.
  bool common_form = false;
  // Load the state before the token's inputs (q, k, v, gates); only where
  // short_state_first_built holds, in the common form.
  bool state_first = false;
};

// The short kernel (decode_kernel_vk_short.cuh), at the general kernel's shapes; only for calls
// whose requests have at most kShortMaxTokens tokens.
template <typename StateT>
void launch_decode_vk_short(const DecodeProblem& problem, const ShortLaunch& launch,
                            cudaStream_t stream);

// Throws unless tiles_per_head tiles of warps_per_cta x rows_per_warp rows cover a head's V
// rows: the host's launch plan must agree with the compile-time shape of the kernel it picked,
// or rows would go unprocessed without any error.
void check_row_coverage(const DecodeProblem& problem, int warps_per_cta, int rows_per_warp,
                        int64_t tiles_per_head);

// The one-token sweep kernel: one token per request (T = 1, or a capacity of 1 with
// cu_seqlens); rows per thread 4 or 8.
template <typename StateT>
void launch_decode_vk_one_token_sweep(const DecodeProblem& problem, int warps_per_cta,
                                      int rows_per_thread, int64_t tiles_per_head,
                                      cudaStream_t stream);

template <typename StateT>
void launch_decode_kv(const DecodeProblem& problem, int64_t tiles_per_head, cudaStream_t stream);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
