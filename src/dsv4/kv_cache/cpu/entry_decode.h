// Host decoding of one stored MODEL1 entry or indexer key into fp32, shared by the gathers and the
// read side (index_topk, sparse_decode), which decode one entry at a time straight from its page.
// Every decoded value is exact in fp32 (a code times a power of two, or an E2M1 value times an
// E4M3 scale; a kFP8 key's fp32 scale is a power of two where hdk wrote it, and any other scale
// is one fp32 product, rounded once). A value of a group stored with NaN markers decodes to NaN:
// the NaN code or the NaN scale byte makes the product NaN, so no separate test is needed.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/float_convert.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// The 448 FP8 values of the entry at `slot`: code x 2^(scale - 127).
inline void decode_entry_nope(const PagedPool& pool, int64_t slot, float* out) {
  const int64_t offset = slot % pool.block_size;
  const uint8_t* page = pool.page(slot);
  const uint8_t* data = page + offset * kEntryDataBytes;
  const uint8_t* scales = page + pool.block_size * kEntryDataBytes + offset * kEntryScaleBytes;
  for (int64_t g = 0; g < kNopeGroups; ++g) {
    const float scale = decode_ue8m0(scales[g]);
    for (int64_t i = g * kNopeGroupSize; i < (g + 1) * kNopeGroupSize; ++i)
      out[i] = decode_e4m3(data[i]) * scale;
  }
}

// All 512 values: the 448 above, then the 64 RoPE values as stored (bf16).
inline void decode_entry(const PagedPool& pool, int64_t slot, float* out) {
  decode_entry_nope(pool, slot, out);
  const uint8_t* rope = pool.page(slot) + (slot % pool.block_size) * kEntryDataBytes + kNopeDim;
  for (int64_t i = 0; i < kRopeDim; ++i) {
    uint16_t bits;
    std::memcpy(&bits, rope + 2 * i, 2);
    out[kNopeDim + i] = hdk::detail::bf16_to_float(bits);
  }
}

// The 128 values of the indexer key at `slot`, in the basis it was stored in. kFP8: code x the
// key's fp32 scale (whatever fp32 the page holds; a NaN code or a NaN scale gives NaN).
inline void decode_key(const PagedPool& pool, int64_t slot, KeyFormat format, float* out) {
  const int64_t offset = slot % pool.block_size;
  const int64_t data_bytes = key_data_bytes(format);
  const uint8_t* page = pool.page(slot);
  const uint8_t* data = page + offset * data_bytes;
  const uint8_t* scales = page + pool.block_size * data_bytes + offset * key_scale_bytes(format);
  if (format == KeyFormat::kFP8) {
    uint32_t bits = 0;
    for (int b = 0; b < 4; ++b)
      bits |= static_cast<uint32_t>(scales[b]) << (8 * b);
    float scale;
    std::memcpy(&scale, &bits, 4);
    for (int64_t i = 0; i < kIndexerKeyDim; ++i)
      out[i] = decode_e4m3(data[i]) * scale;
    return;
  }
  const int64_t group_size = format == KeyFormat::kMXFP4 ? 32 : 16;
  for (int64_t g = 0; g < kIndexerKeyDim / group_size; ++g) {
    const float scale =
        format == KeyFormat::kMXFP4 ? decode_ue8m0(scales[g]) : decode_e4m3(scales[g]);
    for (int64_t i = g * group_size; i < (g + 1) * group_size; ++i)
      out[i] = decode_e2m1((data[i / 2] >> (i % 2 ? 4 : 0)) & 0xf) * scale;
  }
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
