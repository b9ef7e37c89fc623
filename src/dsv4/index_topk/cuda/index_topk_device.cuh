// Device pieces every index_topk kernel shares (included by index_topk_cuda.cu only, inside its
// anonymous namespace like sparse_decode's: one translation unit, everything inlined there): the
// launch shape, the query kinds, relu, how a warpgroup writes a tile's scores, the aligned shared
// memory with the select's first-level histogram, and a CTA's segment of a row.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/ceil_div.h"
#include "core/cuda/shared_address.cuh"
#include "core/fast_divide.h"
#include "core/host_device.h"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "topk/cuda/cluster_select.cuh"
#include "topk/select_layout.h"
#include "topk/topk_key.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

namespace cg = cooperative_groups;
using hdk::detail::ceil_div;
using hdk::detail::cluster_select;
using hdk::detail::column_of;
using hdk::detail::FastDivide;
using hdk::detail::ordered_key;
using hdk::detail::select_layout;
using hdk::detail::shared_address;

// 8 warps: with two tiles per warp the tensor-core kernels take 146-155 registers a thread.
constexpr int kThreads = 256;
// The workspace's select kernel, which scores nothing, runs 16 warps (127 registers, no spill):
// every pass over a CTA's keys takes half the rounds, and Pro's 1024 winners sort one 64-entry
// run a warp. Against 8 warps (H200): 1.05-1.12x wherever the select runs with top 1024 (one row
// of 16384 keys 27.4 -> 25.3 us), 1.05-1.08x with top 512 from 65536 keys a row (64 x 65536
// E4M3 keys 243.3 -> 229.0 us), ties at 2048 keys; 32 warps (64 registers, 92 bytes of spill):
// 0.85-0.93x at 2048 keys.
constexpr int kSelectThreads = 512;
// A row alone in one select CTA (IndexWorkspacePlan::select_in_one_cta) gets 16 warps too (56
// registers): a pass over 16384 keys is 8 quads of keys a thread. Against 32 warps (H200, one
// device call, two rounds, E4M3 and MXFP4 keys, 1-16 rows of 2048-16384 keys, top 512 and 1024):
// 1.03-1.10x in every cell with the instruction caches warm (one Flash row of 2048 E4M3 keys
// 18.7 -> 16.9 us), 1.03-1.09x with them flushed but for one or two MXFP4 rows of 2048-8192 keys
// (0.96-0.99x, where the call takes 27-32 us with its code fetched cold); 8 warps 0.86-1.08x.
constexpr int kCtaSelectThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kTilesPerWarp = 2;  // 8-entry tiles per warp per query fragment read
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kWarpgroups = kThreads / 128;
// Tiles of raw key bytes a warpgroup thread holds in registers ahead of the one it converts:
// with 3, an SM has about 26 KiB of key loads in flight (and the kernel 234-254 registers).
constexpr int kWarpgroupStages = 3;

// Which kernel scores: the warpgroup's wgmma (up to 64 heads), the warp's mma.sync, CUDA cores.
enum class ScoreKernel { kWarpgroup, kWarp, kCudaCore };

// The kernel's q (IndexQueryForm, with the exact form split by dtype): bf16 or fp32 on bf16
// tensor cores, E4M3 codes or packed MXFP4 on FP8 tensor cores (index_fp8_layout.h).
enum class QueryKind { kBf16, kFp32, kE4M3, kMXFP4 };

HDK_HOST_DEVICE constexpr bool is_fp8_query(QueryKind q) {
  return q == QueryKind::kE4M3 || q == QueryKind::kMXFP4;
}

// relu that keeps NaN, as the CPU backend's: a key stored with NaN markers must score NaN.
__device__ __forceinline__ float relu(float x) {
  return x < 0.0f ? 0.0f : x;
}

// The same in one instruction (max.NaN; -0 may come back as +0, which scores the same).
__device__ __forceinline__ float relu_keep_nan(float x) {
  float y;
  asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
  return y;
}

// Lanes t = 0..3 of a quad hold partial sums of rows upper and upper + 8 of a 64-entry tile (the
// tile's entry `tile_entry` first) over their heads: the quad's totals, lane 0 writing row upper's
// key and lane 1 row upper + 8's (`finish` maps a total to its score), each counted into the
// select's first level when given. Every warpgroup kernel ends its tiles so.
template <typename Finish>
__device__ __forceinline__ void write_quad_rows(float (&sum)[2], int64_t tile_entry, int upper,
                                                int t, int64_t count, uint32_t* out,
                                                uint32_t* first_level, Finish&& finish) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 1);
    sum[r] += __shfl_xor_sync(kFullMask, sum[r], 2);
  }
  if (t < 2) {  // lane t = 0 writes the upper row, t = 1 the lower one
    // In 32 bits (a row's entries are below 2^31, checked on the host): 64-bit compares and adds
    // take the ALU pipe, which the MXFP4 placement keeps busy.
    const uint32_t e = static_cast<uint32_t>(tile_entry) + static_cast<uint32_t>(upper + 8 * t);
    if (e < static_cast<uint32_t>(count)) {
      const uint32_t key = ordered_key(finish(t == 0 ? sum[0] : sum[1]));
      out[e] = key;
      if (first_level != nullptr)
        atomicAdd(&first_level[key >> (32 - hdk::detail::kSelectDigitBits)], 1u);
    }
  }
}

// The dynamic shared memory from its first 1024-byte boundary: wgmma swizzles by shared-address
// bits, and a cluster's select addresses its peers' memory by offsets from there (the same in
// every CTA of the cluster).
__device__ __forceinline__ uint8_t* aligned_shared(uint8_t* bytes) {
  return bytes + (kIndexSharedAlignment - shared_address(bytes) % kIndexSharedAlignment) %
                     kIndexSharedAlignment;
}

// The select's first-level histogram (select_layout's buffer 0) where a kernel counts that level
// while it fills the keys (`counted`), else nullptr.
__device__ __forceinline__ uint32_t* first_level_of(uint8_t* shared, const IndexLaunch& launch,
                                                    bool counted) {
  return counted
             ? reinterpret_cast<uint32_t*>(shared + select_layout(launch.sort_capacity).histogram)
             : nullptr;
}

template <int kCtaThreads = kThreads>
__device__ __forceinline__ void zero_first_level(uint32_t* first_level) {
  if (first_level == nullptr) return;
  for (int bin = threadIdx.x; bin < hdk::detail::kSelectBins; bin += kCtaThreads)
    first_level[bin] = 0;
}

// This CTA's cluster size and rank in it; kOneCta: a CTA launched without a cluster, alone with
// its row (1 and 0).
struct ClusterPlace {
  int size, rank;
};
template <bool kOneCta>
__device__ __forceinline__ ClusterPlace cluster_place() {
  if constexpr (kOneCta) {
    return ClusterPlace{1, 0};
  } else {
    cg::cluster_group cluster = cg::this_cluster();
    return ClusterPlace{static_cast<int>(cluster.num_blocks()),
                        static_cast<int>(cluster.block_rank())};
  }
}

// Which block ids a CTA's staging checks: the row's used pages (the one-launch kernel: every CTA
// of the row's cluster reaches the same verdict), or the row's first kIndexEarlyPages and its own
// share's (the workspace's scoring kernel; attention_workspace.h says how the select reads the
// verdicts).
enum class PageCheck { kRowPages, kOwnPages };

// A CTA's contiguous share of a row: entries first .. last - 1.
struct Segment {
  int64_t first, last;
};

// Share `part` of a row of `length` entries split evenly over `parts` CTAs (a cluster's), in
// whole multiples of `granule` entries (the select kernel's 4: each share starts on 16 bytes of a
// workspace row, whose keys it loads in 16-byte pieces).
__device__ __forceinline__ Segment cluster_segment(int64_t length, int parts, int part,
                                                   int granule = 1) {
  const int64_t share = ceil_div(ceil_div(length, parts), granule) * granule;
  const int64_t first = min(length, part * share);
  return Segment{first, min(length, first + share)};
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
