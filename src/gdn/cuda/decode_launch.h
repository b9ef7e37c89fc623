// Kernel launchers, one translation unit per (layout, state dtype) so nvcc compiles them in
// parallel. Only the head sizes the dispatcher accepts are instantiated.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gdn/decode_problem.h"

namespace hdk {
namespace gdn {
namespace detail {

// Rows one warp of the VK kernel covers for a state dtype, K and rows per thread (2 or 4: the
// rows a thread keeps in registers, i.e. its 16-byte state loads in flight).
int vk_rows_per_warp(DType state_dtype, int64_t head_k, int rows_per_thread);

// State columns one CTA of the KV kernel covers (8 lanes x one 16-byte fragment).
int kv_columns_per_cta(DType state_dtype);

template <typename StateT>
void launch_decode_vk(const DecodeProblem& problem, int warps_per_cta, int rows_per_thread,
                      int64_t tiles_per_head, cudaStream_t stream);

// Throws unless tiles_per_head tiles of warps_per_cta x rows_per_warp rows cover a head's V
// rows: the host's launch plan must agree with the compile-time shape of the kernel it picked,
// or rows would go unprocessed without any error.
void check_row_coverage(const DecodeProblem& problem, int warps_per_cta, int rows_per_warp,
                        int64_t tiles_per_head);

// One token per request (T = 1, or a capacity of 1 with cu_seqlens); rows per thread 4 or 8.
template <typename StateT>
void launch_decode_vk_single(const DecodeProblem& problem, int warps_per_cta, int rows_per_thread,
                             int64_t tiles_per_head, cudaStream_t stream);

template <typename StateT>
void launch_decode_kv(const DecodeProblem& problem, int64_t tiles_per_head, cudaStream_t stream);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
