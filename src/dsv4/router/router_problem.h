// A validated hdk::dsv4::route call, reduced to sizes, modes, pointers and element strides.
// validate_route() builds it; the CPU and CUDA backends read nothing else. It is trivially
// copyable so a CUDA kernel can take it by value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/host_device.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {

enum class RoutingMode : uint8_t {
  kDense,  // top_k of s + bias
  kHash,   // tid2eid[token_ids[n]]
};

struct RouterProblem {
  // Sizes.
  int64_t num_tokens = 0;   // N
  int64_t num_experts = 0;  // E
  int64_t hidden_size = 0;  // D (fused gate only)
  int64_t top_k = 0;
  int64_t vocab_size = 0;  // rows of tid2eid (hash routing only)

  RoutingMode mode = RoutingMode::kDense;
  bool fused_gate = false;  // hidden + gate_weight instead of logits
  float route_scale = 1.0f;

  // Scores: logits [N, E] (fp32/bf16), or hidden [N, D] and gate_weight [E, D] (bf16 bits).
  const void* logits = nullptr;
  DType logits_dtype = DType::kFloat32;
  int64_t logits_row_stride = 0;
  const uint16_t* hidden = nullptr;
  int64_t hidden_row_stride = 0;
  const uint16_t* gate_weight = nullptr;
  int64_t gate_weight_row_stride = 0;

  const float* bias = nullptr;  // nullptr: no bias
  int64_t bias_stride = 0;

  // Hash routing.
  const void* token_ids = nullptr;
  DType token_ids_dtype = DType::kInt32;
  int64_t token_ids_stride = 0;
  const int32_t* tid2eid = nullptr;
  int64_t tid2eid_row_stride = 0;
  int64_t tid2eid_column_stride = 0;

  // Outputs.
  int32_t* topk_ids = nullptr;
  int64_t topk_ids_row_stride = 0;
  float* topk_weights = nullptr;
  int64_t topk_weights_row_stride = 0;
  // Fused gate: [slabs, N, E] fp32; slab 0 receives the logits, the others hold the CUDA gate
  // GEMM's partial sums. May be nullptr on the CPU.
  float* logits_workspace = nullptr;
  int64_t logits_workspace_row_stride = 0;
  int64_t logits_workspace_slab_stride = 0;
  int64_t logits_workspace_slabs = 0;
  void* invalid_count = nullptr;
  DType invalid_count_dtype = DType::kInt32;

  HDK_HOST_DEVICE int64_t token_id(int64_t n) const {
    const int64_t offset = n * token_ids_stride;
    return token_ids_dtype == DType::kInt64
               ? static_cast<const int64_t*>(token_ids)[offset]
               : static_cast<int64_t>(static_cast<const int32_t*>(token_ids)[offset]);
  }

  HDK_HOST_DEVICE int32_t table_entry(int64_t token, int64_t slot) const {
    return tid2eid[token * tid2eid_row_stride + slot * tid2eid_column_stride];
  }
};

static_assert(std::is_trivially_copyable<RouterProblem>::value,
              "kernels take the problem by value");

// The logits workspace's shape rule (route_workspace_slabs), shared with the CUDA split GEMM that
// fills it: one grid row of CTAs per kWorkspaceRowBlock rows, and kWorkspaceMaxSlabs slices of D
// (one slab each) spread over those grid rows.
constexpr int kWorkspaceMaxSlabs = 16;
constexpr int kWorkspaceRowBlock = 64;

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
