// CUDA kernels of the KV cache operations. One warp per entry or key: a MODEL1 entry is 28 lanes
// of 16 FP8 values (4 lanes per scale group of 64) and 4 lanes of 16 RoPE values, each lane
// moving 16 bytes at a time; a key is 32 lanes of 4 values (the Hadamard butterflies of span >= 4
// go through shuffles; the encoder, shared with quantize_indexer_query, is key_encode.cuh). The
// compressor runs one CTA per batch row (of one call or two), a thread per channel, and hands
// the finished entry to the same warp writers through shared memory. No atomics except the
// invalid-row counter, which only invalid rows touch; 64-bit offsets throughout.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cuda/count_invalid.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/named_barrier.cuh"
#include "core/cuda_helpers.h"
#include "dsv4/kv_cache/compressor_math.h"
#include "dsv4/kv_cache/cuda/key_encode.cuh"
#include "dsv4/kv_cache/cuda/kv_cache_cuda.h"
#include "dsv4/kv_cache/e4m3_bits.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpsPerBlock = 4;
constexpr int kEntryLanes = 28;  // lanes holding FP8 values; lanes 28..31 hold RoPE values
constexpr uint32_t kCanonicalNaN = 0x7fc00000u;

__device__ __forceinline__ uint16_t bf16_bits(float value) {
  const uint32_t b = __float_as_uint(value);
  if ((b & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((b >> 16) | 0x40u);
  return static_cast<uint16_t>((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

__device__ __forceinline__ float bf16_value(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// `count` consecutive values of a fp32 or bf16 row; 16-byte loads when `aligned`.
template <int kCount>
__device__ __forceinline__ void load_values(const void* base, DType dtype, int64_t offset,
                                            bool aligned, float (&x)[kCount]) {
  if (dtype == DType::kFloat32) {
    const float* source = static_cast<const float*>(base) + offset;
    if (aligned && kCount % 4 == 0) {
#pragma unroll
      for (int i = 0; i < kCount; i += 4) {
        const float4 v = *reinterpret_cast<const float4*>(source + i);
        x[i] = v.x, x[i + 1] = v.y, x[i + 2] = v.z, x[i + 3] = v.w;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kCount; ++i)
        x[i] = source[i];
    }
  } else {
    const uint16_t* source = static_cast<const uint16_t*>(base) + offset;
    if (aligned && kCount % 8 == 0) {
#pragma unroll
      for (int i = 0; i < kCount; i += 8) {
        const uint4 v = *reinterpret_cast<const uint4*>(source + i);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          x[i + 2 * j] = __uint_as_float(words[j] << 16);
          x[i + 2 * j + 1] = __uint_as_float(words[j] & 0xffff0000u);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kCount; ++i)
        x[i] = bf16_value(source[i]);
    }
  }
}

// 16 bytes to a page: one 16-byte store when pages are 16-byte aligned, else two 8-byte ones
// (every offset in a page is a multiple of 8).
template <bool kWide>
__device__ __forceinline__ void store_16_bytes(uint8_t* target, uint4 v) {
  if (kWide) {
    *reinterpret_cast<uint4*>(target) = v;
  } else {
    reinterpret_cast<uint2*>(target)[0] = make_uint2(v.x, v.y);
    reinterpret_cast<uint2*>(target)[1] = make_uint2(v.z, v.w);
  }
}

// Writes the entry whose 16 values this lane holds (lanes 0..27: values 16 * lane ...; lanes
// 28..31: RoPE values 16 * (lane - 28) ...). Returns, on every lane, whether it is non-finite.
template <bool kWide>
__device__ bool warp_write_entry(const float (&x)[16], const PagedPool& pool, int64_t slot,
                                 int lane) {
  bool finite = true;
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    finite = finite && is_finite(x[i]);
    amax = fmaxf(amax, fabsf(x[i]));
  }
  // Scale groups of 64 are quads of lanes.
#pragma unroll
  for (int mask = 1; mask <= 2; mask *= 2) {
    amax = fmaxf(amax, __shfl_xor_sync(kFullMask, amax, mask));
    finite = __shfl_xor_sync(kFullMask, static_cast<int>(finite), mask) != 0 && finite;
  }
  const auto [page, offset] = pool.locate(slot);
  uint8_t* data = page + offset * kEntryDataBytes;
  uint32_t scale = kScaleNaN;
  if (lane < kEntryLanes) {
    uint32_t words[4] = {0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu, 0x7f7f7f7fu};
    if (finite) {
      const int e = fp8_scale_exponent(amax);
      const float inverse = power_of_two(-e);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        words[w] = e4m3_pair(x[4 * w] * inverse, x[4 * w + 1] * inverse) |
                   (e4m3_pair(x[4 * w + 2] * inverse, x[4 * w + 3] * inverse) << 16);
      }
      scale = static_cast<uint32_t>(e + 127);
    }
    store_16_bytes<kWide>(data + 16 * lane, make_uint4(words[0], words[1], words[2], words[3]));
  } else {
    uint32_t words[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      words[w] = static_cast<uint32_t>(bf16_bits(x[2 * w])) |
                 (static_cast<uint32_t>(bf16_bits(x[2 * w + 1])) << 16);
    }
    uint8_t* rope = data + kNopeDim + 32 * (lane - kEntryLanes);
    store_16_bytes<kWide>(rope, make_uint4(words[0], words[1], words[2], words[3]));
    store_16_bytes<kWide>(rope + 16, make_uint4(words[4], words[5], words[6], words[7]));
  }
  // Lane 0 writes the 7 scale bytes and the pad as one 8-byte word.
  uint32_t low = 0, high = 0;
#pragma unroll
  for (int g = 0; g < kNopeGroups; ++g) {
    const uint32_t byte = __shfl_sync(kFullMask, scale, 4 * g);
    if (g < 4) {
      low |= byte << (8 * g);
    } else {
      high |= byte << (8 * (g - 4));
    }
  }
  if (lane == 0) {
    uint8_t* scales = page + pool.block_size * kEntryDataBytes + offset * kEntryScaleBytes;
    *reinterpret_cast<uint2*>(scales) = make_uint2(low, high);
  }
  return __any_sync(kFullMask, !finite) != 0;
}

// Writes the key whose values 4 * lane .. 4 * lane + 3 this lane holds into its slot of `pool`,
// rotating first when asked (key_encode.cuh, the encoder quantize_indexer_query shares).
// Returns, on every lane, whether it is non-finite.
__device__ bool warp_write_key(float (&x)[4], const PagedPool& pool, int64_t slot, KeyFormat format,
                               bool rotate, int lane) {
  const WarpKey key = warp_encode_key(x, format, rotate, lane);
  const auto [page, offset] = pool.locate(slot);
  const int64_t data_bytes = key_data_bytes(format);
  warp_store_key(key, format, page + offset * data_bytes,
                 page + pool.block_size * data_bytes + offset * key_scale_bytes(format), lane);
  return key.nonfinite;
}

// ---- store / gather kernels -----------------------------------------------------------------

// Row n of a store, written by one warp.
template <bool kWide>
__device__ __forceinline__ void store_entry_row(const StoreEntriesProblem& p, int64_t n,
                                                bool aligned_values, int lane) {
  // The row's values are requested together with its slot, not after it: one DRAM round trip
  // before the entry can be written instead of two (a padding row's values are read for nothing;
  // H100: 8.6-9.3 us from N = 1 to 512, before 9-10 us).
  float x[16];
  load_values<16>(p.values, p.values_dtype, n * p.values_row_stride + 16 * lane, aligned_values, x);
  const int64_t slot = p.slots.at(n);
  if (slot < 0) return;
  if (slot >= p.cache.num_slots()) {
    if (lane == 0) count_invalid(p.invalid_count, 1);
    return;
  }
  const bool nonfinite = warp_write_entry<kWide>(x, p.cache, slot, lane);
  if (lane == 0 && nonfinite) count_invalid(p.invalid_count, 1);
}

template <bool kWide>
__global__ void store_entries_kernel(StoreEntriesProblem p, bool aligned_values) {
  hdk::detail::begin_dependent_kernel();
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n < p.num_rows) store_entry_row<kWide>(p, n, aligned_values, threadIdx.x % 32);
}

// (n, l) of the flat index n * columns + l of a gather's output row: 32-bit division where both
// fit, as in PagedPool::locate.
struct FlatRow {
  int64_t n, l;
};
__device__ __forceinline__ FlatRow split_flat_row(int64_t row, int64_t columns) {
  if ((static_cast<uint64_t>(row) | static_cast<uint64_t>(columns)) <= 0xffffffffull) {
    const uint32_t narrow = static_cast<uint32_t>(row), size = static_cast<uint32_t>(columns);
    return FlatRow{narrow / size, narrow % size};
  }
  return FlatRow{row / columns, row % columns};
}

template <typename Out>
__device__ __forceinline__ void store_outputs(Out* target, const float (&x)[16]);

template <>
__device__ __forceinline__ void store_outputs<float>(float* target, const float (&x)[16]) {
#pragma unroll
  for (int i = 0; i < 16; i += 4)
    *reinterpret_cast<float4*>(target + i) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
}

template <>
__device__ __forceinline__ void store_outputs<uint16_t>(uint16_t* target, const float (&x)[16]) {
  uint32_t words[8];
#pragma unroll
  for (int w = 0; w < 8; ++w) {
    words[w] = static_cast<uint32_t>(bf16_bits(x[2 * w])) |
               (static_cast<uint32_t>(bf16_bits(x[2 * w + 1])) << 16);
  }
  reinterpret_cast<uint4*>(target)[0] = make_uint4(words[0], words[1], words[2], words[3]);
  reinterpret_cast<uint4*>(target)[1] = make_uint4(words[4], words[5], words[6], words[7]);
}

// store_outputs for values that are not NaN: bf16 by the hardware's round-to-nearest-even
// conversion, which equals bf16_bits except on NaN payloads.
template <typename Out>
__device__ __forceinline__ void store_finite_outputs(Out* target, const float (&x)[16]) {
  if constexpr (sizeof(Out) == 4) {
    store_outputs<Out>(target, x);
  } else {
    uint32_t words[8];
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      const __nv_bfloat162 pair = __floats2bfloat162_rn(x[2 * w], x[2 * w + 1]);
      words[w] = *reinterpret_cast<const uint32_t*>(&pair);
    }
    reinterpret_cast<uint4*>(target)[0] = make_uint4(words[0], words[1], words[2], words[3]);
    reinterpret_cast<uint4*>(target)[1] = make_uint4(words[4], words[5], words[6], words[7]);
  }
}

template <typename Out, bool kWide>
__global__ void gather_entries_kernel(GatherEntriesProblem p) {
  hdk::detail::begin_dependent_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.num_rows * p.num_columns) return;
  const auto [n, l] = split_flat_row(row, p.num_columns);
  const int64_t slot = p.slots.at(n, l);
  Out* out = static_cast<Out*>(p.out) + n * p.out_row_stride + l * p.out_column_stride + 16 * lane;
  float x[16];
  if (slot < 0 || slot >= p.cache.num_slots()) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
      x[i] = 0.0f;
    store_outputs<Out>(out, x);
    if (slot >= 0 && lane == 0) count_invalid(p.invalid_count, 1);
    return;
  }
  const auto [page, offset] = p.cache.locate(slot);
  const uint8_t* data = page + offset * kEntryDataBytes;
  if (lane < kEntryLanes) {
    uint4 v;
    if (kWide) {
      v = *reinterpret_cast<const uint4*>(data + 16 * lane);
    } else {
      const uint2 a = reinterpret_cast<const uint2*>(data + 16 * lane)[0];
      const uint2 b = reinterpret_cast<const uint2*>(data + 16 * lane)[1];
      v = make_uint4(a.x, a.y, b.x, b.y);
    }
    const uint8_t scale_byte =
        page[p.cache.block_size * kEntryDataBytes + offset * kEntryScaleBytes + lane / 4];
    const float scale = decode_ue8m0(scale_byte);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    const bool any_nan = scale_byte == kScaleNaN || any_e4m3_nan(words[0]) ||
                         any_e4m3_nan(words[1]) || any_e4m3_nan(words[2]) || any_e4m3_nan(words[3]);
    if (!any_nan) {
      // Each code placed as fp32 bits (its value times 2^-120), times 2^120, times the scale:
      // both products are the ones decode_e4m3(code) * scale computes, so the result is bit
      // for bit the reference's. decode_e4m3 per value made the kernel issue-bound (H100, N x
      // L = 64 x 2048: 57% of copy with it, 87% without; docs/dsv4-kv-cache.md).
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const uint32_t pair = e4m3_spread_pair_as_scaled_bf16(
            __byte_perm(words[i / 2], 0, i % 2 == 0 ? 0x4140 : 0x4342));
        x[2 * i] = __uint_as_float(pair << 16) * 0x1p120f * scale;
        x[2 * i + 1] = __uint_as_float(pair & 0xffff0000u) * 0x1p120f * scale;
      }
      store_finite_outputs<Out>(out, x);
    } else {
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const uint8_t code = static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)));
        const bool nan = (code & 0x7f) == kFp8NaN || scale_byte == kScaleNaN;
        x[i] = nan ? __uint_as_float(kCanonicalNaN) : decode_e4m3(code) * scale;
      }
      store_outputs<Out>(out, x);
    }
  } else {
    const uint8_t* rope = data + kNopeDim + 32 * (lane - kEntryLanes);
    uint32_t words[8];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const uint2 a = reinterpret_cast<const uint2*>(rope + 16 * half)[0];
      const uint2 b = reinterpret_cast<const uint2*>(rope + 16 * half)[1];
      words[4 * half] = a.x, words[4 * half + 1] = a.y, words[4 * half + 2] = b.x;
      words[4 * half + 3] = b.y;
    }
    if (sizeof(Out) == 2) {
      // bf16 as stored, bit for bit.
      uint4* target = reinterpret_cast<uint4*>(out);
      target[0] = make_uint4(words[0], words[1], words[2], words[3]);
      target[1] = make_uint4(words[4], words[5], words[6], words[7]);
    } else {
#pragma unroll
      for (int w = 0; w < 8; ++w) {
        x[2 * w] = __uint_as_float(words[w] << 16);
        x[2 * w + 1] = __uint_as_float(words[w] & 0xffff0000u);
      }
      store_outputs<Out>(out, x);
    }
  }
}

__global__ void store_keys_kernel(StoreKeysProblem p, bool aligned_values) {
  hdk::detail::begin_dependent_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (n >= p.num_rows) return;
  const int64_t slot = p.slots.at(n);
  if (slot < 0) return;
  if (slot >= p.cache.num_slots()) {
    if (lane == 0) count_invalid(p.invalid_count, 1);
    return;
  }
  float x[4];
  load_values<4>(p.keys, p.keys_dtype, n * p.keys_row_stride + 4 * lane,
                 aligned_values && p.keys_dtype == DType::kFloat32, x);
  const bool nonfinite = warp_write_key(x, p.cache, slot, p.format, p.rotate, lane);
  if (lane == 0 && nonfinite) count_invalid(p.invalid_count, 1);
}

template <typename Out>
__global__ void gather_keys_kernel(GatherKeysProblem p) {
  hdk::detail::begin_dependent_kernel();
  const int lane = threadIdx.x % 32;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= p.num_rows * p.num_columns) return;
  const auto [n, l] = split_flat_row(row, p.num_columns);
  const int64_t slot = p.slots.at(n, l);
  Out* out = static_cast<Out*>(p.out) + n * p.out_row_stride + l * p.out_column_stride + 4 * lane;
  float x[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (slot >= 0 && slot < p.cache.num_slots()) {
    const auto [page, offset] = p.cache.locate(slot);
    const int64_t data_bytes = key_data_bytes(p.format);
    const uint8_t* data = page + offset * data_bytes;
    const uint8_t* scales =
        page + p.cache.block_size * data_bytes + offset * key_scale_bytes(p.format);
    if (p.format == KeyFormat::kFP8) {
      // Code x the key's fp32 scale, whatever fp32 the page holds; a NaN product (a NaN code or
      // scale, or 0 x infinity) is the canonical NaN, as on the CPU.
      const uint32_t codes = reinterpret_cast<const uint32_t*>(data)[lane];
      const float scale = *reinterpret_cast<const float*>(scales);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float value = decode_e4m3(static_cast<uint8_t>(codes >> (8 * i))) * scale;
        x[i] = isnan(value) ? __uint_as_float(kCanonicalNaN) : value;
      }
    } else {
      const bool mx = p.format == KeyFormat::kMXFP4;
      const uint32_t codes = reinterpret_cast<const uint16_t*>(data)[lane];
      const uint8_t scale_byte = scales[mx ? lane / 8 : lane / 4];
      const bool nan = mx ? scale_byte == kScaleNaN : (scale_byte & 0x7f) == kE4m3ScaleNaN;
      const float scale = mx ? decode_ue8m0(scale_byte) : decode_e4m3(scale_byte);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        x[i] = nan ? __uint_as_float(kCanonicalNaN)
                   : decode_e2m1(static_cast<uint8_t>((codes >> (4 * i)) & 0xf)) * scale;
      }
    }
  } else if (slot >= 0 && lane == 0) {
    count_invalid(p.invalid_count, 1);
  }
  if (sizeof(Out) == 4) {
    *reinterpret_cast<float4*>(out) = make_float4(x[0], x[1], x[2], x[3]);
  } else {
    const uint32_t low = bf16_bits(x[0]) | (static_cast<uint32_t>(bf16_bits(x[1])) << 16);
    const uint32_t high = bf16_bits(x[2]) | (static_cast<uint32_t>(bf16_bits(x[3])) << 16);
    *reinterpret_cast<uint2*>(out) = make_uint2(low, high);
  }
}

// ---- compressor -----------------------------------------------------------------------------

__device__ __forceinline__ float load_input(const void* base, DType dtype, int64_t offset) {
  return dtype == DType::kFloat32 ? static_cast<const float*>(base)[offset]
                                  : bf16_value(static_cast<const uint16_t*>(base)[offset]);
}

// Every index the row will use is in range (else the row is skipped and counted).
__device__ bool compressor_row_valid(const CompressorProblem& p, int64_t n, int64_t state_slot) {
  if (state_slot >= p.num_states) return false;
  const int64_t first = p.positions.at(n);
  if (first < 0) return false;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t position = first + t;
    if ((position + 1) % p.ratio != 0) continue;
    const int64_t entry = position / p.ratio;
    if (entry * p.ratio >= p.max_position) return false;
    const int64_t page = entry / p.cache.block_size;
    if (page >= p.max_blocks) return false;
    const int64_t block = p.block_table.at(n, page);
    if (block < 0 || block >= p.cache.num_blocks) return false;
  }
  return true;
}

// What channel c of a CTA reads for token t: its score and kv values (CSA: also those of channel
// d + c) with their ape terms, and where the token completes a window (and c is a RoPE channel)
// its RoPE factors. Loaded in two parts, so that a cold call waits on memory for few rounds:
// the inputs, which depend on nothing, go out with the row's state slot and position; the
// position's terms go out with the state.
struct CompressorToken {
  float score = 0.0f, kv = 0.0f, score_high = 0.0f, kv_high = 0.0f;
  float ape = 0.0f, ape_high = 0.0f, cosine = 0.0f, sine = 0.0f;
};

__device__ __forceinline__ void load_token_inputs(const CompressorProblem& p, int64_t n, int64_t t,
                                                  int c, CompressorToken& token) {
  const int64_t offset = n * p.input_row_stride + t * p.input_token_stride;
  token.score = load_input(p.score, p.input_dtype, offset + c);
  token.kv = load_input(p.kv, p.input_dtype, offset + c);
  if (p.overlap) {
    token.score_high = load_input(p.score, p.input_dtype, offset + p.dim + c);
    token.kv_high = load_input(p.kv, p.input_dtype, offset + p.dim + c);
  }
}

// position >= 0. The RoPE factors only where they lie in the tables (else the row is invalid).
__device__ __forceinline__ void load_position_terms(const CompressorProblem& p, int64_t position,
                                                    int c, CompressorToken& token) {
  const int64_t d = p.dim, m = p.ratio;
  const float* ape = p.ape + (position % m) * p.ape_row_stride;
  token.ape = ape[c];
  if (p.overlap) token.ape_high = ape[d + c];
  const int64_t first_position = position / m * m;
  if (position % m == m - 1 && c >= d - kRopeDim && first_position < p.max_position) {
    const int64_t pair = (c - (d - kRopeDim)) / 2;
    token.cosine = p.rope_cos[first_position * p.rope_cos_row_stride + pair];
    token.sine = p.rope_sin[first_position * p.rope_sin_row_stride + pair];
  }
}

// Up to two compressor calls and a store in one launch (compress with two calls, and
// store_and_compress). CTAs [0, first_rows) take the first call's rows, the rest the second's;
// the store's rows go to warps added after the compressors' threads (warps store_warp0 ..
// store_warp0 + store_warps - 1 of every CTA), so the launch keeps the compressors' grid and a
// store row's work overlaps a compressor row's wait for its inputs. Without compressor rows every
// warp stores.
struct WriteLaunch {
  CompressorProblem problem[2];
  int64_t first_rows = 0;
  StoreEntriesProblem store;
  bool store_values_aligned = false;
  int store_warp0 = 0;
  int store_warps = 0;
};

// Store warps a compressor CTA takes at most (the launch bounds of write_layer_kernel); a store of
// more rows loops.
constexpr int kStoreWarpsAtMost = 4;

// One CTA per batch row of a call, thread c owning channel c (and, CSA, channel d + c of the
// inputs); a CTA wider than the call's d (a launch of two calls takes the wider one's) has its
// other threads return, so the row's threads meet at a named barrier of their own count.
// Accumulators live in registers for the call and go back to the state at the end.
template <bool kWide>
__device__ __forceinline__ void compress_row(const CompressorProblem& p, int64_t n, float* entry,
                                             float* partial_sums) {
  const int dim = static_cast<int>(p.dim);
  const int c = static_cast<int>(threadIdx.x);
  if (c >= dim) return;
  const int64_t d = p.dim, m = p.ratio;
  const int lane = c % 32, warp = c / 32;
  // Loads that depend on nothing first, then those that depend on the slot and the position: a
  // row's loads take two memory round trips before its arithmetic (at N = 1 with cold caches,
  // each round trip that the loads wait for one after another is most of the kernel's time).
  const int64_t state_slot = p.state_slots.at(n);
  const int64_t first = p.positions.at(n);
  const float norm_weight = p.norm_weight[c * p.norm_weight_stride];
  CompressorToken token;
  if (p.num_tokens > 0) load_token_inputs(p, n, 0, c, token);
  if (state_slot < 0) return;
  const int64_t accumulators = p.accumulators();
  float* state = p.state + state_slot * p.state_slot_stride;
  SoftmaxAccumulator acc[3] = {};
  if (state_slot < p.num_states) {
    for (int64_t a = 0; a < accumulators; ++a) {
      const float* base = state + a * 3 * d;
      acc[a] = SoftmaxAccumulator{base[c], base[d + c], base[2 * d + c]};
    }
  }
  if (p.num_tokens > 0 && first >= 0) load_position_terms(p, first, c, token);
  if (!compressor_row_valid(p, n, state_slot)) {
    if (c == 0) count_invalid(p.invalid_count, 1);
    return;
  }
  int64_t invalid = 0;
  for (int64_t t = 0; t < p.num_tokens; ++t) {
    const int64_t position = first + t;
    const int64_t window = position / m, row = position % m;
    if (t > 0) {
      load_token_inputs(p, n, t, c, token);
      load_position_terms(p, position, c, token);
    }
    const int first_half = p.overlap ? static_cast<int>(first_half_accumulator(window)) : 0;
    if (row == 0) acc[first_half] = empty_accumulator();
    accumulate(acc[first_half], token.score + token.ape, token.kv);
    // The next kernel may be scheduled once the row's first inputs have arrived, not earlier: with
    // store_and_compress triggering at its start, the next kernel ran later than after a plain
    // launch (H200: the Flash HCA step 0.85-0.88x at N = 1..16, sparse_decode ending 6 us later;
    // CSA at 2048 entries 0.96-0.99x, the index scoring kernel twice as long); triggered here,
    // every CSA and HCA step cell 1.00-1.13x faster than the store and the compressors apart
    // (docs/dsv4-kv-cache.md).
    if (t == 0) hdk::detail::allow_dependent_grids_if_small();
    if (p.overlap) {
      if (row == 0) acc[kSecondHalfAccumulator] = empty_accumulator();
      accumulate(acc[kSecondHalfAccumulator], token.score_high + token.ape_high, token.kv_high);
    }
    if (row != m - 1) continue;

    float value;
    if (p.overlap) {
      const SoftmaxAccumulator previous =
          window > 0 ? acc[first_half_accumulator(window + 1)] : empty_accumulator();
      value = softmax_merge(previous, acc[kSecondHalfAccumulator]);
    } else {
      value = softmax_merge(empty_accumulator(), acc[0]);
    }
    // RMSNorm: the sum of squares in a fixed order (warps, then warp sums in order).
    float square = value * value;
#pragma unroll
    for (int mask = 16; mask >= 1; mask /= 2)
      square += __shfl_xor_sync(kFullMask, square, mask);
    if (lane == 0) partial_sums[warp] = square;
    hdk::detail::named_barrier_sync(hdk::detail::kFirstNamedBarrier, dim);
    float sum_squares = 0.0f;
    for (int w = 0; w < static_cast<int>(d / 32); ++w)
      sum_squares += partial_sums[w];
    const float inverse_rms = 1.0f / sqrtf(sum_squares / static_cast<float>(d) + p.norm_eps);
    value = value * inverse_rms * norm_weight;
    // RoPE on the last 64 channels: pairs (2i, 2i + 1) are neighbouring lanes.
    const float partner = __shfl_xor_sync(kFullMask, value, 1);
    if (c >= d - kRopeDim) {
      value = (c % 2 == 0) ? value * token.cosine - partner * token.sine
                           : partner * token.sine + value * token.cosine;
    }
    entry[c] = value;
    hdk::detail::named_barrier_sync(hdk::detail::kFirstNamedBarrier, dim);
    if (warp == 0) {
      const int64_t block = p.block_table.at(n, window / p.cache.block_size);
      const int64_t slot = block * p.cache.block_size + window % p.cache.block_size;
      bool nonfinite;
      if (d == kHeadDim) {
        float x[16];
#pragma unroll
        for (int i = 0; i < 16; ++i)
          x[i] = entry[16 * lane + i];
        nonfinite = warp_write_entry<kWide>(x, p.cache, slot, lane);
      } else {
        float x[4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
          x[i] = entry[4 * lane + i];
        nonfinite = warp_write_key(x, p.cache, slot, p.key_format, p.rotate, lane);
      }
      invalid += nonfinite ? 1 : 0;
    }
    // entry and partial_sums are reused by the next window
    hdk::detail::named_barrier_sync(hdk::detail::kFirstNamedBarrier, dim);
  }
  for (int64_t a = 0; a < accumulators; ++a) {
    float* base = state + a * 3 * d;
    base[c] = acc[a].max;
    base[d + c] = acc[a].sum;
    base[2 * d + c] = acc[a].weighted;
  }
  if (c == 0) count_invalid(p.invalid_count, invalid);
}

// One call: CTA n takes row n.
template <bool kWide>
__global__ void compress_kernel(CompressorProblem p) {
  hdk::detail::wait_for_prior_grid();  // compress_row lets the next kernel start
  __shared__ float entry[kHeadDim];
  __shared__ float partial_sums[kHeadDim / 32];
  compress_row<kWide>(p, blockIdx.x, entry, partial_sums);
}

// Several calls: the CTA's call read in place from the launch's parameters (__grid_constant__: no
// copy to local memory), one copy of the row's code for both compressor calls. Inlining a copy of
// it for each call instead (each call's parameters as constants) took 116 registers and made a
// compressor pair 1.16x slower at N = 1 (10.6 against 9.15 us, H200). The wider call's d threads,
// then the store warps: 640 threads at most.
template <bool kWide>
__global__ void __launch_bounds__(kHeadDim + 32 * kStoreWarpsAtMost)
    write_layer_kernel(const __grid_constant__ WriteLaunch launch) {
  hdk::detail::wait_for_prior_grid();  // compress_row lets the next kernel start
  __shared__ float entry[kHeadDim];
  __shared__ float partial_sums[kHeadDim / 32];
  const int warp = static_cast<int>(threadIdx.x / 32);
  if (warp >= launch.store_warp0) {
    const int64_t warps = int64_t{gridDim.x} * launch.store_warps;
    for (int64_t n = int64_t{blockIdx.x} * launch.store_warps + (warp - launch.store_warp0);
         n < launch.store.num_rows; n += warps) {
      store_entry_row<kWide>(launch.store, n, launch.store_values_aligned, threadIdx.x % 32);
    }
    return;
  }
  const int64_t cta = blockIdx.x;
  const bool second = cta >= launch.first_rows;
  const CompressorProblem& p = second ? launch.problem[1] : launch.problem[0];
  compress_row<kWide>(p, second ? cta - launch.first_rows : cta, entry, partial_sums);
}

// ---- host side --------------------------------------------------------------------------------

bool aligned_16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// 16-byte stores into the pool when its base and page stride allow, else 8-byte ones; a base
// that is not even 8-byte aligned is an error.
bool wide_pool(const PagedPool& pool, const char* operation) {
  if (reinterpret_cast<uintptr_t>(pool.data) % 8 != 0 || pool.page_stride % 8 != 0) {
    throw Error(std::string(operation) +
                ": argument 'cache' must be 8-byte aligned with a page stride that is a multiple "
                "of 8 bytes on CUDA");
  }
  return aligned_16(pool.data) && pool.page_stride % 16 == 0;
}

// Key pages hold 2-byte code pairs (FP4) or 4-byte code words (FP8) and 4-byte (MXFP4, FP8's
// fp32 scale) or 8-byte (NVFP4) scale words, so MXFP4 and FP8 pools need only 4-byte alignment:
// their page strides (block_size x 68 or 132 bytes) are multiples of 8 only for even block sizes.
void check_key_pool(const PagedPool& pool, KeyFormat format, const char* operation) {
  const int64_t alignment = format == KeyFormat::kNVFP4 ? 8 : 4;
  if (reinterpret_cast<uintptr_t>(pool.data) % alignment != 0 ||
      pool.page_stride % alignment != 0) {
    const char* name = format == KeyFormat::kMXFP4   ? "MXFP4"
                       : format == KeyFormat::kNVFP4 ? "NVFP4"
                                                     : "FP8";
    throw Error(std::string(operation) + ": argument 'cache' must be " + std::to_string(alignment) +
                "-byte aligned with a page stride that is a multiple of " +
                std::to_string(alignment) + " bytes on CUDA for " + name + " keys");
  }
}

// Outputs of the gathers are written 8 or 16 bytes at a time.
void check_output_alignment(const void* out, DType dtype, int64_t row_stride, int64_t column_stride,
                            const char* operation) {
  const int64_t element = dtype == DType::kFloat32 ? 4 : 2;
  if (!aligned_16(out) || (row_stride * element) % 16 != 0 || (column_stride * element) % 16 != 0) {
    throw Error(std::string(operation) +
                ": argument 'out' must be 16-byte aligned with strides that are multiples of 16 "
                "bytes on CUDA");
  }
}

unsigned warp_blocks(int64_t rows) {
  return static_cast<unsigned>((rows + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

bool aligned_values(const StoreEntriesProblem& p) {
  const int64_t element = p.values_dtype == DType::kFloat32 ? 4 : 2;
  return aligned_16(p.values) && (p.values_row_stride * element) % 16 == 0;
}

}  // namespace

void store_entries_cuda(const StoreEntriesProblem& p, int device, CudaStream stream) {
  const char* operation = "hdk::dsv4::store_entries";
  if (p.num_rows == 0) return;
  const bool wide = wide_pool(p.cache, operation);
  hdk::detail::CudaDeviceGuard guard(device, operation);
  auto kernel = wide ? store_entries_kernel<true> : store_entries_kernel<false>;
  hdk::detail::check_launch(
      hdk::detail::launch_dependent(kernel, warp_blocks(p.num_rows), 32 * kWarpsPerBlock, 0, stream,
                                    p, aligned_values(p)),
      operation, "store_entries_kernel");
}

void gather_entries_cuda(const GatherEntriesProblem& p, int device, CudaStream stream) {
  const char* operation = "hdk::dsv4::gather_entries";
  const int64_t rows = p.num_rows * p.num_columns;
  if (rows == 0) return;
  const bool wide = wide_pool(p.cache, operation);
  check_output_alignment(p.out, p.out_dtype, p.out_row_stride, p.out_column_stride, operation);
  hdk::detail::CudaDeviceGuard guard(device, operation);
  auto kernel =
      p.out_dtype == DType::kFloat32
          ? (wide ? gather_entries_kernel<float, true> : gather_entries_kernel<float, false>)
          : (wide ? gather_entries_kernel<uint16_t, true> : gather_entries_kernel<uint16_t, false>);
  hdk::detail::check_launch(
      hdk::detail::launch_dependent(kernel, warp_blocks(rows), 32 * kWarpsPerBlock, 0, stream, p),
      operation, "gather_entries_kernel");
}

void store_indexer_keys_cuda(const StoreKeysProblem& p, int device, CudaStream stream) {
  const char* operation = "hdk::dsv4::store_indexer_keys";
  if (p.num_rows == 0) return;
  check_key_pool(p.cache, p.format, operation);
  const int64_t element = p.keys_dtype == DType::kFloat32 ? 4 : 2;
  const bool aligned = aligned_16(p.keys) && (p.keys_row_stride * element) % 16 == 0;
  hdk::detail::CudaDeviceGuard guard(device, operation);
  hdk::detail::check_launch(
      hdk::detail::launch_dependent(store_keys_kernel, warp_blocks(p.num_rows), 32 * kWarpsPerBlock,
                                    0, stream, p, aligned),
      operation, "store_keys_kernel");
}

void gather_indexer_keys_cuda(const GatherKeysProblem& p, int device, CudaStream stream) {
  const char* operation = "hdk::dsv4::gather_indexer_keys";
  const int64_t rows = p.num_rows * p.num_columns;
  if (rows == 0) return;
  check_key_pool(p.cache, p.format, operation);
  check_output_alignment(p.out, p.out_dtype, p.out_row_stride, p.out_column_stride, operation);
  hdk::detail::CudaDeviceGuard guard(device, operation);
  auto kernel =
      p.out_dtype == DType::kFloat32 ? gather_keys_kernel<float> : gather_keys_kernel<uint16_t>;
  hdk::detail::check_launch(
      hdk::detail::launch_dependent(kernel, warp_blocks(rows), 32 * kWarpsPerBlock, 0, stream, p),
      operation, "gather_keys_kernel");
}

void write_layer_cuda(const CompressorProblem* problems, int count,
                      const StoreEntriesProblem* store, int device, CudaStream stream) {
  const char* operation =
      store != nullptr ? "hdk::dsv4::store_and_compress" : "hdk::dsv4::compress";
  WriteLaunch launch;
  int64_t rows = 0, threads = 0;
  bool entries = false, wide = true;
  for (int i = 0; i < count; ++i) {
    const CompressorProblem& p = problems[i];
    // Entries (d = 512) go through the 8- or 16-byte entry stores, keys (d = 128) through the
    // key stores and their own alignment rule; one launch takes the 16-byte stores only where
    // every entry pool allows them.
    if (p.dim != kHeadDim) {
      check_key_pool(p.cache, p.key_format, operation);
    } else {
      entries = true;
      wide = wide_pool(p.cache, operation) && wide;
    }
    launch.problem[i] = p;
    rows += p.num_rows;
    if (p.num_rows > 0) threads = std::max(threads, p.dim);
  }
  launch.first_rows = problems[0].num_rows;
  // Without a store every thread is a compressor's (the store warps start past the block).
  launch.store_warp0 = static_cast<int>(threads / 32);
  int64_t ctas = rows;
  if (store != nullptr && store->num_rows > 0) {
    entries = true;
    wide = wide_pool(store->cache, operation) && wide;
    launch.store = *store;
    launch.store_values_aligned = aligned_values(*store);
    if (rows > 0) {
      launch.store_warps = static_cast<int>(
          std::min<int64_t>((store->num_rows + rows - 1) / rows, kStoreWarpsAtMost));
    } else {
      launch.store_warps = kWarpsPerBlock;
      ctas = warp_blocks(store->num_rows);
    }
    threads += 32 * launch.store_warps;
  }
  wide = wide && entries;
  if (ctas == 0) return;
  hdk::detail::CudaDeviceGuard guard(device, operation);
  const unsigned grid = static_cast<unsigned>(ctas), block = static_cast<unsigned>(threads);
  // One compressor call alone keeps the kernel that takes its parameters by value.
  const bool single = count == 1 && store == nullptr;
  cudaError_t error;
  if (single) {
    auto kernel = wide ? compress_kernel<true> : compress_kernel<false>;
    error = hdk::detail::launch_dependent(kernel, grid, block, 0, stream, launch.problem[0]);
  } else {
    auto kernel = wide ? write_layer_kernel<true> : write_layer_kernel<false>;
    error = hdk::detail::launch_dependent(kernel, grid, block, 0, stream, launch);
  }
  hdk::detail::check_launch(error, operation, single ? "compress_kernel" : "write_layer_kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
