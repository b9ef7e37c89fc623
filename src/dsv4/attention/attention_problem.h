// Validated index_topk and sparse_decode calls (hdk/dsv4/attention.h), reduced to sizes, pointers
// and element strides. attention_validation.cpp builds them; the backends read nothing else. Both
// are trivially copyable so a CUDA kernel can take them by value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/host_device.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Queries [N, H, width] (bf16/fp32), last dim contiguous.
struct QueryView {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t row_stride = 0;
  int64_t head_stride = 0;
};

// The three forms of the indexer's q (hdk/dsv4/attention.h).
enum class IndexQueryForm : uint8_t {
  kExact,  // bf16 / fp32 [N, H, 128]; keys kMXFP4 or kNVFP4
  kE4M3,   // uint8 E4M3 codes [N, H, 128]; keys kFP8
  kMXFP4,  // uint8 packed E2M1 [N, H, 64] + UE8M0 q_scales [N, H, 4]; keys kMXFP4
};

struct IndexerProblem {
  int64_t num_rows = 0;   // N
  int64_t num_heads = 0;  // H
  IndexQueryForm q_form = IndexQueryForm::kExact;
  QueryView q;                        // [N, H, 128] (kMXFP4: [N, H, 64] bytes); strides in elements
  const uint8_t* q_scales = nullptr;  // kMXFP4: [N, H, 4]
  int64_t q_scales_row_stride = 0;
  int64_t q_scales_head_stride = 0;
  const float* weights = nullptr;  // [N, H]
  int64_t weights_row_stride = 0;
  int64_t weights_head_stride = 0;
  PagedPool keys;
  KeyFormat format = KeyFormat::kMXFP4;
  IndexView block_table;  // [N, max_blocks]
  int64_t max_blocks = 0;
  IndexView num_entries;  // [N]
  int64_t top_k = 0;
  int32_t* topk_indices = nullptr;  // [N, top_k]
  int64_t topk_indices_row_stride = 0;
  float* topk_scores = nullptr;  // [N, top_k] or nullptr
  int64_t topk_scores_row_stride = 0;
  int32_t* topk_slots = nullptr;  // [N, top_k] or nullptr
  int64_t topk_slots_row_stride = 0;
  Counter invalid_count;
  uint8_t* workspace = nullptr;  // the caller's workspace (attention_workspace.h) or nullptr
  int64_t workspace_bytes = 0;

  // Flat slot of the row's entry s (s below its num_entries, which the caller checked).
  HDK_HOST_DEVICE int64_t slot(int64_t n, int64_t s) const {
    return block_table.at(n, s / keys.block_size) * keys.block_size + s % keys.block_size;
  }
};

struct SparseDecodeProblem {
  int64_t num_rows = 0;     // N
  int64_t num_heads = 0;    // Hq
  int64_t num_indices = 0;  // L
  QueryView q;              // [N, Hq, 512]
  PagedPool cache;
  IndexView indices;  // [N, L] slots of `cache`
  // The optional second list: extra_indices [N, num_extra_indices] slots of extra_cache
  // (num_extra_indices = 0 without one).
  PagedPool extra_cache;
  int64_t num_extra_indices = 0;
  IndexView extra_indices;
  const float* sink = nullptr;  // [Hq] or nullptr
  int64_t sink_stride = 0;
  float scale = 0.0f;   // resolved: never 0
  void* out = nullptr;  // [N, Hq, 512]
  DType out_dtype = DType::kFloat32;
  int64_t out_row_stride = 0;
  int64_t out_head_stride = 0;
  float* lse = nullptr;  // [N, Hq] or nullptr
  bool lse_includes_sink = true;
  int64_t lse_row_stride = 0;
  int64_t lse_head_stride = 0;
  Counter invalid_count;
  uint8_t* workspace = nullptr;  // the caller's workspace (attention_workspace.h) or nullptr
  int64_t workspace_bytes = 0;

  // The whole list of row n: entries 0 .. num_indices - 1 from `indices` over `cache`, then
  // the extra list over extra_cache. list_slot < 0 means the entry is skipped.
  HDK_HOST_DEVICE int64_t list_length() const { return num_indices + num_extra_indices; }
  HDK_HOST_DEVICE const PagedPool& list_pool(int64_t j) const {
    return j < num_indices ? cache : extra_cache;
  }
  HDK_HOST_DEVICE int64_t list_slot(int64_t n, int64_t j) const {
    return j < num_indices ? indices.at(n, j) : extra_indices.at(n, j - num_indices);
  }
};

static_assert(std::is_trivially_copyable<IndexerProblem>::value, "taken by value");
static_assert(std::is_trivially_copyable<SparseDecodeProblem>::value, "taken by value");

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
