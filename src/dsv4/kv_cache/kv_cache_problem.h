// Validated calls of the KV cache operations (kv_cache.h), reduced to sizes, pointers and element
// strides. kv_cache_validation.cpp builds them; the CPU and CUDA backends read nothing else. All
// are trivially copyable so CUDA kernels take them by value.
#pragma once

#include <cstdint>
#include <type_traits>

#include "core/host_device.h"
#include "core/index_view.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Where entries live: page `block` starts at data + block * page_stride (bytes).
struct PagedPool {
  uint8_t* data = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t page_stride = 0;  // bytes between pages (>= block_size * entry bytes)

  HDK_HOST_DEVICE int64_t num_slots() const { return num_blocks * block_size; }
  HDK_HOST_DEVICE uint8_t* page(int64_t slot) const { return locate(slot).page; }

  // Where a slot (0 <= slot < num_slots()) is: its page and its offset in the page. Slots and
  // block sizes below 2^32 (any cache a GPU holds) divide in 32 bits, which costs a GPU several
  // times fewer instructions than 64-bit division.
  struct Place {
    uint8_t* page;
    int64_t offset;
  };
  HDK_HOST_DEVICE Place locate(int64_t slot) const {
    int64_t block, offset;
    if ((static_cast<uint64_t>(slot) | static_cast<uint64_t>(block_size)) <= 0xffffffffull) {
      const uint32_t narrow = static_cast<uint32_t>(slot);
      const uint32_t size = static_cast<uint32_t>(block_size);
      block = narrow / size;
      offset = narrow % size;
    } else {
      block = slot / block_size;
      offset = slot % block_size;
    }
    return Place{data + block * page_stride, offset};
  }
};

using hdk::detail::IndexView;

// The optional invalid-row counter.
struct Counter {
  void* data = nullptr;
  DType dtype = DType::kInt32;
};

// The host backends' update of a counter (CUDA kernels add atomically instead).
inline void add_to_counter(const Counter& counter, int64_t count) {
  if (counter.data == nullptr || count == 0) return;
  if (counter.dtype == DType::kInt64) {
    *static_cast<int64_t*>(counter.data) += count;
  } else {
    *static_cast<int32_t*>(counter.data) += static_cast<int32_t>(count);
  }
}

struct StoreEntriesProblem {
  int64_t num_rows = 0;
  const void* values = nullptr;  // [N, 512]
  DType values_dtype = DType::kFloat32;
  int64_t values_row_stride = 0;
  IndexView slots;
  PagedPool cache;
  Counter invalid_count;
};

struct GatherEntriesProblem {
  int64_t num_rows = 0;     // N
  int64_t num_columns = 0;  // L
  PagedPool cache;
  IndexView slots;
  void* out = nullptr;  // [N, L, 512]
  DType out_dtype = DType::kFloat32;
  int64_t out_row_stride = 0;     // between n
  int64_t out_column_stride = 0;  // between l
  Counter invalid_count;
};

struct StoreKeysProblem {
  int64_t num_rows = 0;
  const void* keys = nullptr;  // [N, 128]
  DType keys_dtype = DType::kFloat32;
  int64_t keys_row_stride = 0;
  IndexView slots;
  PagedPool cache;
  KeyFormat format = KeyFormat::kMXFP4;
  bool rotate = true;
  Counter invalid_count;
};

struct GatherKeysProblem {
  int64_t num_rows = 0;
  int64_t num_columns = 0;
  PagedPool cache;
  KeyFormat format = KeyFormat::kMXFP4;
  IndexView slots;
  void* out = nullptr;  // [N, L, 128]
  DType out_dtype = DType::kFloat32;
  int64_t out_row_stride = 0;
  int64_t out_column_stride = 0;
  Counter invalid_count;
};

struct CompressorProblem {
  int64_t num_rows = 0;    // N
  int64_t num_tokens = 0;  // T per row
  int64_t dim = 0;         // d: 512 (entries) or 128 (indexer keys)
  int64_t ratio = 0;       // m
  bool overlap = false;    // CSA: ratio 4, coff 2
  const void* kv = nullptr;
  const void* score = nullptr;
  DType input_dtype = DType::kFloat32;
  int64_t input_row_stride = 0;    // between n
  int64_t input_token_stride = 0;  // between t
  const float* ape = nullptr;      // [ratio, coff*d]
  int64_t ape_row_stride = 0;
  IndexView positions;
  IndexView state_slots;
  float* state = nullptr;  // [num_states, A, 3, d]
  int64_t num_states = 0;
  int64_t state_slot_stride = 0;  // floats between state slots
  const float* norm_weight = nullptr;
  int64_t norm_weight_stride = 0;
  const float* rope_cos = nullptr;
  const float* rope_sin = nullptr;
  int64_t rope_cos_row_stride = 0;
  int64_t rope_sin_row_stride = 0;
  int64_t max_position = 0;  // rows of the RoPE tables
  IndexView block_table;
  int64_t max_blocks = 0;
  PagedPool cache;
  float norm_eps = 1e-6f;
  KeyFormat key_format = KeyFormat::kMXFP4;
  bool rotate = true;
  Counter invalid_count;

  HDK_HOST_DEVICE int64_t accumulators() const { return overlap ? 3 : 1; }
  HDK_HOST_DEVICE int64_t input_width() const { return overlap ? 2 * dim : dim; }
  // Floats of one accumulator: running max, sum of exponentials, weighted sum; d each.
  HDK_HOST_DEVICE int64_t accumulator_floats() const { return 3 * dim; }
};

// store_and_compress: a layer's store and its 1 or 2 compressor calls.
struct LayerWritesProblem {
  StoreEntriesProblem store;
  CompressorProblem compressors[2];
};

static_assert(std::is_trivially_copyable<StoreEntriesProblem>::value, "taken by value");
static_assert(std::is_trivially_copyable<GatherEntriesProblem>::value, "taken by value");
static_assert(std::is_trivially_copyable<StoreKeysProblem>::value, "taken by value");
static_assert(std::is_trivially_copyable<GatherKeysProblem>::value, "taken by value");
static_assert(std::is_trivially_copyable<CompressorProblem>::value, "taken by value");

// Byte offsets inside a page (the spec's "Exact storage formats").
constexpr int64_t kEntryDataBytes = 576;  // 448 FP8 + 64 bf16
constexpr int64_t kEntryScaleBytes = 8;   // 7 UE8M0 + pad
constexpr int64_t kNopeGroups = 7;
constexpr int64_t kNopeGroupSize = 64;
constexpr int64_t kKeyDataBytes = 64;  // the FP4 formats' packed E2M1 (kFP8: 128 E4M3)

// A key page holds block_size keys' data, then their scales: key i's data at
// i * key_data_bytes, its scales at block_size * key_data_bytes + i * key_scale_bytes.
HDK_HOST_DEVICE constexpr int64_t key_data_bytes(KeyFormat format) {
  return format == KeyFormat::kFP8 ? 128 : kKeyDataBytes;
}

HDK_HOST_DEVICE constexpr int64_t key_scale_bytes(KeyFormat format) {
  return format == KeyFormat::kNVFP4 ? 8 : 4;
}

HDK_HOST_DEVICE constexpr int64_t key_entry_bytes(KeyFormat format) {
  return key_data_bytes(format) + key_scale_bytes(format);
}

// Which state accumulator holds what, for CSA (overlap): the first-d channels of windows of each
// parity (the previous window's is the other parity), then the current window's last-d channels.
HDK_HOST_DEVICE int64_t first_half_accumulator(int64_t window) {
  return window & 1;
}
constexpr int64_t kSecondHalfAccumulator = 2;

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
