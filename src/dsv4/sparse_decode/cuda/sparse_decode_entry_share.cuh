// A thread's share of an entry (a quarter of its stored bytes) in sparse_decode's tensor-core
// kernels: where it lies, its loads (into registers, or through shared memory by cp.async) and its
// conversion into a tile of E. The pipelined kernel's producer warpgroup converts its stages this
// way (sparse_decode_pipelined_kernel.cu), and the tensor-core kernel its tiles from the raw tile
// (sparse_decode_mma_kernel.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/bf16_pairs.h"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/shared_address.cuh"
#include "core/fast_divide.h"
#include "core/index_view.h"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/kv_cache/e4m3_bits.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_device.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::cp_async_8;

// One thread's share of one entry: output chunks share_chunk(quarter, j), j < 16, of
// E's row (sparse_decode_layout.h; j < 14: FP8 chunks, 8 codes each, two per 16 stored bytes;
// j = 14, 15: RoPE chunks), as stored. Quarters 0..3 of an entry are lanes l, l + 8, l + 16,
// l + 24 of a warp, so a 16-byte load instruction reads 64 contiguous bytes of each of 8 entries.
constexpr int kShareFp8Chunks = static_cast<int>(kNopeDim / 8) / 4;  // 14
struct EntryShare {
  uint4 codes[kShareFp8Chunks / 2];  // chunks 2 k and 2 k + 1 of the thread's share
  uint4 rope[2];
  uint2 scales;  // the entry's 8 scale bytes
};

// Global loads the compiler keeps where they are written (volatile asm keeps its order with the
// shared-memory stores, also volatile asm): the next tile's bytes and slots are requested while
// this tile is converted instead of being sunk to the loop's end, where their latency would
// stall the next tile's conversion.
__device__ __forceinline__ uint2 load_now_8(const uint8_t* source) {
  uint2 v;
  asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(source));
  return v;
}
__device__ __forceinline__ uint4 load_now_16(const uint8_t* source) {
  uint4 v;
  asm volatile("ld.global.nc.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(source));
  return v;
}

// Where a producer thread's entry is: its data and scale bytes, and whether it is real. An entry
// that is not real (skipped, past the list, beyond its cache) points at bytes that exist (the
// first entry of a pool with slots), which are loaded and discarded: the loads need no branch.
struct ProducerEntry {
  const uint8_t* data;
  const uint8_t* scales;
  bool real;
};

template <bool kWide>
__device__ __forceinline__ void load_share(const ProducerEntry& entry, int quarter,
                                           EntryShare& share) {
  // 16 bytes at 16 (quarter + 4 k) of the FP8 codes: chunks share_chunk(quarter, 2 k) and
  // share_chunk(quarter, 2 k + 1); 32 bytes at 32 quarter of the RoPE values.
  auto load_16 = [&](const uint8_t* source) {
    if (kWide) return load_now_16(source);
    const uint2 lo = load_now_8(source);
    const uint2 hi = load_now_8(source + 8);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  };
#pragma unroll
  for (int k = 0; k < kShareFp8Chunks / 2; ++k)
    share.codes[k] = load_16(entry.data + 16 * (quarter + 4 * k));
#pragma unroll
  for (int k = 0; k < 2; ++k)
    share.rope[k] = load_16(entry.data + kNopeDim + 32 * quarter + 16 * k);
  share.scales = load_now_8(entry.scales);
}

// load_share's bytes into shared memory instead of registers: the same offsets from `raw` (the
// entry's row of the raw pass, kRawEntryStride bytes) as from the entry's data, the scale bytes
// at kEntryDataBytes, copied by quarter 0 only. Registers would be waited for together with every
// global load issued after them (a warp's loads here share one dependency counter, which the
// first use of any of them waits to drain: ptxas's SASS for this kernel), so the pass in flight
// while the other converts comes through shared memory and its own cp.async group.
template <bool kWide>
__device__ __forceinline__ void copy_share_async(const ProducerEntry& entry, int quarter,
                                                 uint8_t* raw) {
  auto copy_16 = [&](int offset) {
    if (kWide) {
      cp_async_16(raw + offset, entry.data + offset);
    } else {
      cp_async_8(raw + offset, entry.data + offset);
      cp_async_8(raw + offset + 8, entry.data + offset + 8);
    }
  };
#pragma unroll
  for (int k = 0; k < kShareFp8Chunks / 2; ++k)
    copy_16(16 * (quarter + 4 * k));
#pragma unroll
  for (int k = 0; k < 2; ++k)
    copy_16(kNopeDim + 32 * quarter + 16 * k);
  if (quarter == 0) cp_async_8(raw + kEntryDataBytes, entry.scales);
}
__device__ __forceinline__ EntryShare read_share(const uint8_t* raw, int quarter) {
  const uint32_t base = shared_address(raw);
  auto read_16 = [&](int offset) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(base + offset));
    return v;
  };
  EntryShare share;
#pragma unroll
  for (int k = 0; k < kShareFp8Chunks / 2; ++k)
    share.codes[k] = read_16(16 * (quarter + 4 * k));
#pragma unroll
  for (int k = 0; k < 2; ++k)
    share.rope[k] = read_16(kNopeDim + 32 * quarter + 16 * k);
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
               : "=r"(share.scales.x), "=r"(share.scales.y)
               : "r"(base + static_cast<uint32_t>(kEntryDataBytes)));
  return share;
}

// The producer's locate_entry, without a branch: the page division by a multiply-high (`pages`:
// by the block sizes of cache and extra_cache; the launcher runs this kernel only for pools of
// fewer than 2^31 slots), `dummy` for an entry that is not real.
__device__ __forceinline__ ProducerEntry producer_entry(const SparseDecodeProblem& p, int64_t j,
                                                        int64_t slot,
                                                        const hdk::detail::FastDivide (&pages)[2],
                                                        const ProducerEntry& dummy, int* bad) {
  const bool first_list = j < p.num_indices;
  const PagedPool& pool = first_list ? p.cache : p.extra_cache;
  const bool real = slot >= 0 && slot < pool.num_slots();
  if (slot >= pool.num_slots()) *bad = 1;
  const uint32_t narrow = real ? static_cast<uint32_t>(slot) : 0u;
  // The divider picked field by field: indexing `pages` by a run-time value would put the
  // array in local memory.
  hdk::detail::FastDivide divide;
  divide.divisor = first_list ? pages[0].divisor : pages[1].divisor;
  divide.multiplier = first_list ? pages[0].multiplier : pages[1].multiplier;
  divide.shift = first_list ? pages[0].shift : pages[1].shift;
  const uint32_t block = divide.quotient(narrow);
  const uint32_t offset = narrow - block * static_cast<uint32_t>(pool.block_size);
  const uint8_t* page = pool.data + static_cast<int64_t>(block) * pool.page_stride;
  const ProducerEntry entry{
      page + int64_t{offset} * kEntryDataBytes,
      page + pool.block_size * kEntryDataBytes + int64_t{offset} * kEntryScaleBytes, true};
  return real ? entry : dummy;
}

// Eight stored FP8 codes times a bf16 pair `factor`, each placed pair (value x 2^-120) times it
// once. For a scale byte up to kOneMultiplyMaxScale (UE8M0 2^7; the writer's scales of values up
// to 448 x 2^7) the factor one_multiply_factor(scale byte), 2^(scale - 7), gives the exact
// value x 2^(scale - 127); 0 gives the zero row of an entry that is not real; 2^120 gives the
// exact values, to be scaled after. NaN codes come out as some finite value: the caller flags
// them.
constexpr uint32_t kOneMultiplyMaxScale = 134;
__device__ __forceinline__ uint32_t one_multiply_factor(uint32_t scale_byte) {
  return ((scale_byte + 120u) << 7) * 0x10001u;
}
__device__ __forceinline__ uint4 dequantize_8_by(uint2 codes, uint32_t factor) {
  auto convert = [&](uint32_t spread) {
    return mul_bf16x2(e4m3_spread_pair_as_scaled_bf16(spread), factor);
  };
  return make_uint4(
      convert(__byte_perm(codes.x, 0, 0x4140)), convert(__byte_perm(codes.x, 0, 0x4342)),
      convert(__byte_perm(codes.y, 0, 0x4140)), convert(__byte_perm(codes.y, 0, 0x4342)));
}

// How store_share scales a chunk's placed codes (value x 2^-120) by its scale byte: where every
// real entry of the warp has scale bytes up to kOneMultiplyMaxScale, by one multiply a pair, with
// two multiplies a pair in a second copy of the loop for the other warps (kOneWhereExact); or by
// two multiplies a pair always (kTwo), one copy of the loop, 6 KB less code, which a decode step
// fetches cold. Measured on an H200 with the instruction caches flushed: the tensor-core kernel's
// cells from 4 rows read 0.93-0.96x with both copies, 1.00-1.05x with one; the pipelined kernel's
// producers 1.00-1.08x with one where two head groups share the conversion (Pro: each converts
// half of a tile; the decode step's Pro CSA and HCA layers 0.99-1.07x), but where one producer
// converts every entry (Flash), bound by its instructions, 0.88-0.95x warm from 16 rows.
enum class ShareScaling { kOneWhereExact, kTwo };

// The share's chunks as bf16 into row `entry` of the E tile at shared address `stage` (zeros for
// an entry that is not real); returns, for a real entry, nonzero where a code is an FP8 NaN or a
// scale byte the NaN scale. Such a value is not turned into NaN: the caller marks the row bad,
// which is what its NaN would have done (every head's sums take it in).
template <ShareScaling kScaling>
__device__ __forceinline__ uint32_t store_share(const EntryShare& share, bool real, uint32_t stage,
                                                int entry, int quarter) {
  const uint32_t row = static_cast<uint32_t>(entry) * 128;
  // Chunk share_chunk(quarter, j) lies at chunk (2 quarter + j % 2) ^ (entry % 8) of block
  // j / 2 (share_chunk_offset): two swizzled positions serve all sixteen.
  const uint32_t swizzled[2] = {static_cast<uint32_t>(((2 * quarter) ^ (entry % 8)) * 16),
                                static_cast<uint32_t>(((2 * quarter + 1) ^ (entry % 8)) * 16)};
  auto store = [&](int j, uint4 value) {
    const uint32_t offset = row + (j / 2) * operand_block_bytes(kTile) + swizzled[j % 2];
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(stage + offset), "r"(value.x),
                 "r"(value.y), "r"(value.z), "r"(value.w)
                 : "memory");
  };
  auto scale_of = [&](int j) {  // chunk share_chunk(quarter, j)'s scale group is j / 2
    const int group = j / 2;
    return ((group < 4 ? share.scales.x : share.scales.y) >> (8 * (group % 4))) & 0xffu;
  };
  // Bit 7 of a byte ends up set for the codes 0x7f and 0xff (e4m3_nan_carries); the other bits
  // collect garbage and are masked at the end.
  auto codes_of = [&](int j) {
    const uint4 pair = share.codes[j / 2];
    return j % 2 == 0 ? make_uint2(pair.x, pair.y) : make_uint2(pair.z, pair.w);
  };
  uint32_t nan_sum = 0;
  auto add_nan_flags = [&](uint2 codes) {
    nan_sum |= e4m3_nan_carries(codes.x) | e4m3_nan_carries(codes.y);
  };
  auto two_multiplies = [&] {
    const uint32_t up = kBf16TwoTo120 * 0x10001u;
#pragma unroll
    for (int j = 0; j < kShareFp8Chunks; ++j) {
      add_nan_flags(codes_of(j));
      const uint4 placed = dequantize_8_by(codes_of(j), up);  // the values, exact
      const uint32_t scale = real ? ue8m0_as_bf16(scale_of(j)) * 0x10001u : 0u;
      store(j, make_uint4(mul_bf16x2(placed.x, scale), mul_bf16x2(placed.y, scale),
                          mul_bf16x2(placed.z, scale), mul_bf16x2(placed.w, scale)));
    }
  };
  if constexpr (kScaling == ShareScaling::kTwo) {
    two_multiplies();
  } else {
    // The 7 scale bytes (the 8th is padding) decide, for the whole warp, whether one multiply a
    // pair is exact; the other path is for scales above 2^7.
    uint32_t top = __vmaxu4(share.scales.x, share.scales.y & 0x00ffffffu);
    top = __vmaxu4(top, top >> 16);
    top = __vmaxu4(top, top >> 8) & 0xffu;
    if (__all_sync(kFullMask, !real || top <= kOneMultiplyMaxScale)) {
#pragma unroll
      for (int j = 0; j < kShareFp8Chunks; ++j) {
        add_nan_flags(codes_of(j));
        store(j, dequantize_8_by(codes_of(j), real ? one_multiply_factor(scale_of(j)) : 0u));
      }
    } else {
      two_multiplies();
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // RoPE chunks 56 + 2 quarter + k, copied
    const uint4 value = share.rope[k];
    store(kShareFp8Chunks + k, real ? value : make_uint4(0, 0, 0, 0));
  }
  // A scale byte 0xff is a zero byte of its complement (the padding byte's complement is 0xff).
  auto has_zero_byte = [](uint32_t v) { return (v - 0x01010101u) & ~v & 0x80808080u; };
  const uint32_t nan_scales =
      has_zero_byte(~share.scales.x) | has_zero_byte(~(share.scales.y & 0x00ffffffu));
  return real ? (nan_sum & 0x80808080u) | nan_scales : 0u;
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
