// A validated call of hdk::dsv4::quantize_indexer_query (hdk/dsv4/attention.h), reduced to sizes,
// pointers and strides; query_quantize.cpp builds it (the one place that checks the call), the
// CPU and CUDA backends read nothing else. Trivially copyable, so the CUDA kernel takes it by
// value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/host_device.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {

constexpr int64_t kQueryPackedBytes = 64;  // [N, H, 64]: the 128 E2M1 codes of a vector
constexpr int64_t kQueryScaleBytes = 4;    // [N, H, 4]: its 4 UE8M0 scales (groups of 32)

struct QueryQuantizeProblem {
  int64_t num_rows = 0;     // N
  int64_t num_heads = 0;    // H
  const void* q = nullptr;  // [N, H, 128]
  DType q_dtype = DType::kFloat32;
  int64_t q_row_stride = 0;  // elements
  int64_t q_head_stride = 0;
  uint8_t* packed = nullptr;      // [N, H, 64]
  int64_t packed_row_stride = 0;  // bytes
  int64_t packed_head_stride = 0;
  uint8_t* scales = nullptr;  // [N, H, 4]
  int64_t scales_row_stride = 0;
  int64_t scales_head_stride = 0;
  bool rotate = true;
  Counter invalid_count;

  HDK_HOST_DEVICE int64_t num_vectors() const { return num_rows * num_heads; }
};

static_assert(std::is_trivially_copyable<QueryQuantizeProblem>::value, "taken by value");

// Checks every argument (ranks, shapes, dtypes, strides, devices, aliasing) and throws
// hdk::Error naming the bad one, the expectation and what was given; reads no tensor data.
QueryQuantizeProblem validate_quantize_indexer_query(const QuantizeIndexerQueryParams& params);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
