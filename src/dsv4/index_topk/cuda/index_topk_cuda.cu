// CUDA backend of hdk::dsv4::index_topk: one launch, a cluster of C CTAs (C = 1..8) per row, each
// CTA owning a contiguous segment of the row's entries. A CTA
//  1. stages the row's weights and queries in shared memory (the queries already in the mma
//     fragment order of dsv4/index_topk/index_mma_layout.h), checks that they are finite and that
//     the row's num_entries and the block ids of its used pages are in range (every CTA of the
//     cluster reads the same values and reaches the same verdict, so no cluster barrier is
//     needed before an invalid row returns);
//  2. scores its segment straight from the paged FP4 key cache into shared memory, as the
//     order-preserving uint32 keys of topk_key.h: on tensor cores, up to 64 heads by warpgroups
//     (a warpgroup takes 64 entries at a time: each thread dequantizes 32 dims of two keys by
//     bit placement into bf16 A fragments, wgmma m64n64k16 against the staged q, then relu,
//     weight and a sum over heads within a quad; dsv4/index_topk/index_wgmma_layout.h), above 64
//     heads by warps (two 8-entry tiles at a time: mma.sync m16n8k16 for every 16 heads;
//     dsv4/index_topk/index_mma_layout.h), or, as a test cross-check, on CUDA cores (one warp per
//     entry, fp32 FMAs);
//  3. runs hdk::topk's cluster radix select (topk/cuda/cluster_select.cuh) over those scores
//     (the warpgroup kernel has counted its first level while scoring, where the launch plan
//     keeps that histogram apart from the staged data); the leader CTA writes the row's outputs.
// The scores never leave shared memory: the cluster holds up to 8 x 32768 of them, which covers
// 262144 entries per row with no workspace. A longer row still gets exact results: each CTA
// then scores its segment in chunks again on every pass of the select (usually 2 or 3 passes,
// at most 7).
// With a workspace, few rows (and the rows that stream, index_ring_rows: E4M3 rows by their
// sizes or all of them, every packed-MXFP4 row where index_mxfp4_ring_pays, every row of the
// exact q over MXFP4 keys on warpgroups) take two launches instead: scoring CTAs over every SM
// write each row's keys to the workspace (index_score_kernel; streaming rows come through a ring in
// shared memory there, index_key_ring.cuh), then a cluster a row, or one CTA for a row of up to
// 16384 keys (cta_select), selects from them (index_select_kernel). The pieces:
// index_topk_device.cuh (shared), index_query_staging.cuh (1), index_key_loads.cuh,
// index_key_ring.cuh and index_score_{bf16,fp8,cuda_core}.cuh (2), index_select_row.cuh (2 and
// 3); this file holds the kernels and their dispatch. docs/dsv4-attention.md has the reasoning
// and the numbers.
#include "dsv4/index_topk/cuda/index_topk_cuda.h"

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "core/ceil_div.h"
#include "core/cuda/count_invalid.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda_helpers.h"
#include "core/fast_divide.h"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/index_topk/cuda/index_key_loads.cuh"
#include "dsv4/index_topk/cuda/index_query_staging.cuh"
#include "dsv4/index_topk/cuda/index_score_bf16.cuh"
#include "dsv4/index_topk/cuda/index_score_cuda_core.cuh"
#include "dsv4/index_topk/cuda/index_score_fp8.cuh"
#include "dsv4/index_topk/cuda/index_select_row.cuh"
#include "dsv4/index_topk/cuda/index_topk_device.cuh"
#include "dsv4/index_topk/index_fp8_layout.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "hdk/error.h"
#include "topk/select_layout.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr const char* kOperation = "hdk::dsv4::index_topk";

std::atomic<int> g_score_path{static_cast<int>(IndexScorePath::kTensorCore)};
std::atomic<int> g_key_ring{static_cast<int>(IndexKeyRingChoice::kAuto)};

// Scores entries first .. first + count - 1 of the row into out[0 .. count) (shared or global
// memory) on the kernel's path; the warpgroup kernel also counts them into `first_level` when
// given.
// `kKeyRing`: the keys through the launch's key ring (the workspace's scoring kernel; the FP8
// forms, and the exact q over MXFP4 keys on the warpgroup kernel).
template <ScoreKernel kScore, QueryKind kQ, KeyFormat kFormat, bool kKeyRing = false>
__device__ __forceinline__ void score_entries(const IndexerProblem& p, int64_t row, int64_t first,
                                              int64_t count, const IndexLaunch& launch,
                                              uint8_t* shared, uint32_t* out, bool wide,
                                              const KeyPages& pages, uint32_t* first_level,
                                              bool remainder) {
  if constexpr (kKeyRing && is_fp8_query(kQ) && kScore != ScoreKernel::kCudaCore) {
    score_warpgroup_ring<kQ>(p, row, first, count, launch, shared, out, wide, pages, first_level,
                             remainder);
  } else if constexpr (kKeyRing) {
    static_assert(kScore == ScoreKernel::kWarpgroup && kFormat == KeyFormat::kMXFP4,
                  "the exact q streams MXFP4 keys on the warpgroup kernel");
    score_warpgroup_ring_exact<kQ>(p, row, first, count, launch, shared, out, wide, pages,
                                   first_level);
  } else if constexpr (is_fp8_query(kQ) && kScore != ScoreKernel::kCudaCore) {
    score_warpgroup_fp8<kQ>(p, row, first, count, launch, shared, out, wide, pages, first_level,
                            remainder);
  } else if constexpr (kScore == ScoreKernel::kWarpgroup) {
    score_warpgroup<kQ, kFormat>(p, row, first, count, launch, shared, out, wide, pages,
                                 first_level);
  } else if constexpr (kScore == ScoreKernel::kWarp) {
    score_warp<kQ, kFormat>(p, row, first, count, launch, shared, out, wide, pages);
  } else {
    score_cuda_core<kQ, kFormat>(p, row, first, count, launch, shared, out, pages);
  }
}

// The one-launch kernel: a cluster per row stages, scores its segments into shared memory (again
// on every pass of the select where they do not fit) and selects.
template <ScoreKernel kScore, QueryKind kQ, KeyFormat kFormat>
__global__ void __launch_bounds__(kThreads, 1)
    index_topk_kernel(IndexerProblem p, IndexLaunch launch, FastDivide page_divide, bool wide) {
  hdk::detail::begin_dependent_kernel();
  cg::cluster_group cluster = cg::this_cluster();
  const int cluster_size = static_cast<int>(cluster.num_blocks());
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / cluster_size;
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  uint8_t* shared = aligned_shared(shared_bytes);
  // The warpgroup kernel counts the select's first level while it scores, where the plan keeps
  // that histogram apart from the staged data.
  uint32_t* const first_level =
      first_level_of(shared, launch, kScore == ScoreKernel::kWarpgroup && launch.count_first_level);
  KeyPages pages;
  pages.divide = page_divide;
  int64_t length = 0;
  bool remainder = false;
  const bool bad = stage_row<kScore, kQ, PageCheck::kRowPages>(
      p, row, launch, shared, first_level,
      [&](int64_t entries) { return cluster_segment(entries, cluster_size, rank); }, length, pages,
      remainder);
  if (bad) {
    length = 0;
    if (rank == 0 && threadIdx.x == 0) count_invalid(p.invalid_count);
  }
  select_row(p, row, length, launch, shared, first_level,
             [&](int64_t first, int64_t count, uint32_t* out, uint32_t* counts) {
               score_entries<kScore, kQ, kFormat>(p, row, first, count, launch, shared, out, wide,
                                                  pages, counts, remainder);
             });
}

// Scoring through the workspace, over every SM: CTA `segment` of the row's `segments` scores its
// share (index_score_segment) straight into the row's workspace keys, and writes its verdict on
// that share to the row's flags, the only words of the row that every call writes whatever the
// row holds (attention_workspace.h: how the select reads them). A launch takes rows row_base ..,
// the workspace's row r holding row row_base + r. `kKeyRing`: the FP8 forms' keys through the
// launch's key ring in shared memory, not registers, two CTAs an SM.
template <ScoreKernel kScore, QueryKind kQ, KeyFormat kFormat, bool kKeyRing>
__global__ void __launch_bounds__(kThreads, kKeyRing ? 2 : 1)
    index_score_kernel(IndexerProblem p, IndexLaunch launch, IndexWorkspaceLayout layout,
                       FastDivide segments, int64_t row_base, FastDivide page_divide, bool wide) {
  hdk::detail::begin_dependent_kernel();
  const uint32_t local_row = segments.quotient(blockIdx.x);
  const int64_t row = row_base + local_row;
  const int segment = static_cast<int>(blockIdx.x - local_row * segments.divisor);
  // Every division here and in the staging is by a FastDivide. The int64 divisions they replace
  // (a test of the high words, then a 32-bit division sequence or a call) held every CTA's
  // staging for about 9% of the scoring kernel's warp samples (ncu, H200, one row of 16384 E4M3
  // keys), and the call kept a 32-byte stack frame in the packed MXFP4 query's register-fed
  // kernel: E4M3 keys 1.00-1.03x, the packed MXFP4 query 1.07-1.36x at 1-16 rows.
  auto segment_of = [&](int64_t entries) {
    const int64_t share = index_score_tiles(segments.ceil_quotient(static_cast<uint32_t>(entries)));
    const int64_t first = min(entries, segment * share);
    return Segment{first, min(entries, first + share)};
  };
  // Every CTA stages and checks the queries and weights itself, and the block ids of the row's
  // first pages and of its own (PageCheck::kOwnPages), and one past the row's entries returns
  // after the staging: deciding that first put a round trip for num_entries before the
  // staging's loads.
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  uint8_t* shared = aligned_shared(shared_bytes);
  KeyPages pages;
  pages.divide = page_divide;
  int64_t length = 0;
  bool remainder = false;
  const bool bad = stage_row<kScore, kQ, PageCheck::kOwnPages>(
      p, row, launch, shared, nullptr, segment_of, length, pages, remainder);
  if (threadIdx.x == 0) {
    reinterpret_cast<int32_t*>(
        p.workspace + layout.flags_offset)[local_row * index_flag_stride(layout) + segment] =
        bad ? 1 : 0;
  }
  if (bad) return;
  const Segment share = segment_of(length);
  if (share.last <= share.first) return;
  uint32_t* keys =
      reinterpret_cast<uint32_t*>(p.workspace + layout.keys_offset) + local_row * layout.row_stride;
  score_entries<kScore, kQ, kFormat, kKeyRing>(p, row, share.first, share.last - share.first,
                                               launch, shared, keys + share.first, wide, pages,
                                               nullptr, remainder);
}

// The keys of a 16-byte piece: the select kernel's shares are whole pieces.
constexpr int kFillQuad = 4;

// `count` keys of a row's share (cluster_segment, or the whole row where one CTA selects it:
// `keys` is the share's first, on 16 bytes) from the workspace to shared memory in 16-byte
// pieces, 4 a thread in flight, each key counted into the select's first level when `counts` is
// not null. Workspace rows start on 256 bytes with a stride of 64 keys, and `out` on 16 bytes
// with room for whole pieces, so the last piece may carry up to 3 keys past the share's end:
// copied, never counted, never read by the select. Against one key a load (16 in flight), 16384
// keys filled in 2.4 instead of 3.0 us (H200, %globaltimer marks, one CTA a row).
template <int kCtaThreads>
__device__ __forceinline__ void fill_by_quads(const uint32_t* keys, int count, uint32_t* out,
                                              uint32_t* counts) {
  constexpr int kQuadBatch = 4;
  const int quads = (count + 3) / 4;
  const uint4* source = reinterpret_cast<const uint4*>(keys);
  uint4* target = reinterpret_cast<uint4*>(out);
  for (int base = 0; base < quads; base += kQuadBatch * kCtaThreads) {
    uint4 four[kQuadBatch];
#pragma unroll
    for (int j = 0; j < kQuadBatch; ++j) {
      const int q = base + static_cast<int>(threadIdx.x) + j * kCtaThreads;
      four[j] = q < quads ? source[q] : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int j = 0; j < kQuadBatch; ++j) {
      const int q = base + static_cast<int>(threadIdx.x) + j * kCtaThreads;
      if (q >= quads) break;
      target[q] = four[j];
      if (counts == nullptr) continue;
      const uint32_t key[4] = {four[j].x, four[j].y, four[j].z, four[j].w};
      // Every quad but the share's last is whole: its four counts go without a test a key.
      if (4 * q + 4 <= count) {
#pragma unroll
        for (int c = 0; c < 4; ++c)
          atomicAdd(&counts[key[c] >> (32 - hdk::detail::kSelectDigitBits)], 1u);
        continue;
      }
#pragma unroll
      for (int c = 0; c < 3; ++c) {
        if (4 * q + c < count)
          atomicAdd(&counts[key[c] >> (32 - hdk::detail::kSelectDigitBits)], 1u);
      }
    }
  }
}

// The select through the workspace: a cluster per row loads its segments' keys from the row's
// workspace keys in place of scoring them (counting the first level as it goes) and selects
// as the one-launch kernel does; or, kOneCta, one CTA of kCtaSelectThreads holds the whole row
// and selects it alone (cta_select).
template <bool kOneCta>
__global__ void __launch_bounds__(kOneCta ? kCtaSelectThreads : kSelectThreads, 1)
    index_select_kernel(IndexerProblem p, IndexLaunch launch, IndexWorkspaceLayout layout,
                        int64_t row_base, int segments) {
  constexpr int kCtaThreads = kOneCta ? kCtaSelectThreads : kSelectThreads;
  // Waits, but never lets the next kernel start early, though its grid is small: sparse_decode
  // scheduled during the select ran slower by more than the launch it hid (Flash CSA step at
  // N = 2 and 4, 65536 context, H200: 77.7 and 79.8 us with the early start, 69.4 and 71.5
  // without; no step cell slower, docs/dsv4-attention.md).
  hdk::detail::wait_for_prior_grid();
  const ClusterPlace place = cluster_place<kOneCta>();
  const int cluster_size = place.size;
  const int rank = place.rank;
  const int64_t local_row = blockIdx.x / cluster_size;
  const int64_t row = row_base + local_row;
  extern __shared__ __align__(16) uint8_t shared_bytes[];
  uint8_t* shared = aligned_shared(shared_bytes);
  uint32_t* const first_level = first_level_of(shared, launch, launch.count_first_level);
  zero_first_level<kCtaThreads>(first_level);
  // The row's flags and num_entries go out together (num_entries is read even for an invalid
  // row), and the barrier that orders the zeroed histogram before any count does not wait for
  // them. A row of at most kIndexEarlyPages pages has its verdict in its first flag; a longer
  // one's is the OR of all, its scoring CTAs' own pages (a barrier that ORed every row's flags
  // made rows of 2048 keys 0.98-0.99x, H200).
  const int32_t* flags = reinterpret_cast<const int32_t*>(p.workspace + layout.flags_offset) +
                         local_row * index_flag_stride(layout);
  const int32_t first_flag = flags[0];
  const int32_t own_flag = static_cast<int>(threadIdx.x) < segments ? flags[threadIdx.x] : 0;
  const int64_t entries = p.num_entries.at(row);
  __syncthreads();
  bool bad = first_flag != 0;
  if (entries > kIndexEarlyPages * p.keys.block_size) {
    int32_t flag = own_flag;
    for (int s = threadIdx.x + kCtaThreads; s < segments; s += kCtaThreads)
      flag |= flags[s];
    bad = __syncthreads_or(bad || flag != 0) != 0;
  }
  const int64_t length = bad ? 0 : entries;
  if (bad && rank == 0 && threadIdx.x == 0) count_invalid(p.invalid_count);
  const uint32_t* keys = reinterpret_cast<const uint32_t*>(p.workspace + layout.keys_offset) +
                         local_row * layout.row_stride;
  select_row<kCtaThreads, kOneCta, kOneCta ? 1 : kFillQuad>(
      p, row, length, launch, shared, first_level,
      [&](int64_t first, int64_t count, uint32_t* out, uint32_t* counts) {
        fill_by_quads<kCtaThreads>(keys + first, static_cast<int>(count), out, counts);
      });
}

using OneLaunchKernel = void (*)(IndexerProblem, IndexLaunch, FastDivide, bool);
using ScoringKernel = void (*)(IndexerProblem, IndexLaunch, IndexWorkspaceLayout, FastDivide,
                               int64_t, FastDivide, bool);

// The kernels of one scoring path, query dtype and key format.
// `scoring`: the workspace's scoring kernel that reads keys into registers; `scoring_ring`: the
// one that streams them through the key ring (the FP8 forms on tensor cores, E4M3 keys always;
// the exact q over MXFP4 keys on the warpgroup kernel; index_key_ring_bytes says when), nullptr
// for the other forms.
struct Kernels {
  OneLaunchKernel one_launch;
  ScoringKernel scoring;
  ScoringKernel scoring_ring;
};

template <ScoreKernel kScore, QueryKind kQ, KeyFormat kFormat>
Kernels kernels_of() {
  constexpr bool kRing = is_fp8_query(kQ)
                             ? kScore != ScoreKernel::kCudaCore
                             : kScore == ScoreKernel::kWarpgroup && kFormat == KeyFormat::kMXFP4;
  if constexpr (kRing && kQ == QueryKind::kE4M3) {
    return Kernels{index_topk_kernel<kScore, kQ, kFormat>, nullptr,
                   index_score_kernel<kScore, kQ, kFormat, true>};
  } else if constexpr (kRing) {
    return Kernels{index_topk_kernel<kScore, kQ, kFormat>,
                   index_score_kernel<kScore, kQ, kFormat, false>,
                   index_score_kernel<kScore, kQ, kFormat, true>};
  } else {
    return Kernels{index_topk_kernel<kScore, kQ, kFormat>,
                   index_score_kernel<kScore, kQ, kFormat, false>, nullptr};
  }
}

// The exact forms' kernels (bf16 tensor cores or CUDA cores).
template <ScoreKernel kScore>
Kernels pick_kernels(QueryKind query, KeyFormat format) {
  if (query == QueryKind::kFp32) {
    return format == KeyFormat::kMXFP4 ? kernels_of<kScore, QueryKind::kFp32, KeyFormat::kMXFP4>()
                                       : kernels_of<kScore, QueryKind::kFp32, KeyFormat::kNVFP4>();
  }
  return format == KeyFormat::kMXFP4 ? kernels_of<kScore, QueryKind::kBf16, KeyFormat::kMXFP4>()
                                     : kernels_of<kScore, QueryKind::kBf16, KeyFormat::kNVFP4>();
}

// The FP8 forms run on FP8 tensor cores at any head count (kWarpgroup, whatever the path asks
// for) or, asked for, on CUDA cores.
Kernels pick_kernels(ScoreKernel score, QueryKind query, KeyFormat format) {
  if (query == QueryKind::kE4M3) {
    return score == ScoreKernel::kCudaCore
               ? kernels_of<ScoreKernel::kCudaCore, QueryKind::kE4M3, KeyFormat::kFP8>()
               : kernels_of<ScoreKernel::kWarpgroup, QueryKind::kE4M3, KeyFormat::kFP8>();
  }
  if (query == QueryKind::kMXFP4) {
    return score == ScoreKernel::kCudaCore
               ? kernels_of<ScoreKernel::kCudaCore, QueryKind::kMXFP4, KeyFormat::kMXFP4>()
               : kernels_of<ScoreKernel::kWarpgroup, QueryKind::kMXFP4, KeyFormat::kMXFP4>();
  }
  switch (score) {
    case ScoreKernel::kWarpgroup:
      return pick_kernels<ScoreKernel::kWarpgroup>(query, format);
    case ScoreKernel::kWarp:
      return pick_kernels<ScoreKernel::kWarp>(query, format);
    case ScoreKernel::kCudaCore:
      break;
  }
  return pick_kernels<ScoreKernel::kCudaCore>(query, format);
}

QueryKind query_kind(const IndexerProblem& p) {
  switch (p.q_form) {
    case IndexQueryForm::kE4M3:
      return QueryKind::kE4M3;
    case IndexQueryForm::kMXFP4:
      return QueryKind::kMXFP4;
    case IndexQueryForm::kExact:
      break;
  }
  return p.q.dtype == DType::kFloat32 ? QueryKind::kFp32 : QueryKind::kBf16;
}

}  // namespace

void set_index_score_path(IndexScorePath path) {
  g_score_path.store(static_cast<int>(path), std::memory_order_relaxed);
}

IndexScorePath index_score_path() {
  return static_cast<IndexScorePath>(g_score_path.load(std::memory_order_relaxed));
}

void set_index_key_ring_override(IndexKeyRingChoice choice) {
  g_key_ring.store(static_cast<int>(choice), std::memory_order_relaxed);
}

namespace {

// What a call launches: the kernels of its scoring path, the one-launch plan and, with a
// workspace, the workspace plan (segments > 0 where it is used).
struct IndexLaunchChoice {
  Kernels kernels;
  IndexLaunchPlan plan;
  IndexWorkspacePlan workspace;
  FastDivide pages;
  bool wide = false;
  bool key_ring = false;  // the workspace's scoring kernel streams the keys (scoring_ring)
};

IndexLaunchChoice choose_launch(const IndexerProblem& p, int device) {
  const int64_t block_size = p.keys.block_size;
  const int64_t capacity = p.max_blocks * block_size;
  if (capacity > INT_MAX) {
    throw Error(std::string(kOperation) + ": block_table's " + std::to_string(p.max_blocks) +
                " pages of " + std::to_string(block_size) + " entries exceed the " +
                std::to_string(INT_MAX) + " entries per row the int32 indices can name");
  }
  // Key pages hold 4-byte (MXFP4, FP8) or 8-byte (NVFP4) scale words read whole (as the KV cache
  // kernels do); 16-byte code loads when the pool allows them.
  const int64_t alignment = key_scale_bytes(p.format);
  const uintptr_t base = reinterpret_cast<uintptr_t>(p.keys.data);
  if (base % alignment != 0 || p.keys.page_stride % alignment != 0) {
    throw Error(std::string(kOperation) + ": argument 'key_cache' must be " +
                std::to_string(alignment) +
                "-byte aligned with a page stride that is a multiple of " +
                std::to_string(alignment) + " bytes on CUDA");
  }
  IndexLaunchChoice choice;
  choice.wide = base % 16 == 0 && p.keys.page_stride % 16 == 0;
  const IndexScorePath path = index_score_path();
  const bool tensor = path != IndexScorePath::kCudaCore;
  const ScoreKernel score =
      path == IndexScorePath::kCudaCore ? ScoreKernel::kCudaCore
      : path == IndexScorePath::kTensorCore && warpgroup_scoring_fits(p.num_heads)
          ? ScoreKernel::kWarpgroup
          : ScoreKernel::kWarp;
  const QueryKind query = query_kind(p);
  const bool fp32_q = query == QueryKind::kFp32;
  // The FP8 kernel stages whole tiles of 64 heads (codes, then MXFP4's multipliers: less than
  // the bf16 bytes the plan keeps for as many heads).
  const int64_t planned_heads = is_fp8_query(query) && tensor
                                    ? ceil_div(p.num_heads, kFp8HeadTile) * kFp8HeadTile
                                    : p.num_heads;

  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  const int shared_limit = hdk::detail::cached_device_attribute(
      cudaDevAttrMaxSharedMemoryPerBlockOptin, device, kOperation);

  choice.kernels = pick_kernels(score, query, p.format);
  // The kernels run one CTA per SM (their registers), whatever shared memory they take.
  hdk::detail::allow_dynamic_shared_memory(choice.kernels.one_launch, shared_limit, device,
                                           kOperation);
  // Every size; above 8 the non-portable sizes, 0 where the device does not run them.
  const hdk::detail::ResidentClusterCounts& clusters = hdk::detail::resident_clusters(
      choice.kernels.one_launch, kThreads, static_cast<size_t>(shared_limit), device, kOperation);
  choice.plan = plan_index_launch(p.num_rows, planned_heads, capacity, p.top_k, tensor, fp32_q,
                                  sm_count, shared_limit, clusters);
  if (p.workspace != nullptr) {
    hdk::detail::allow_dynamic_shared_memory(index_select_kernel<false>, shared_limit, device,
                                             kOperation);
    hdk::detail::allow_dynamic_shared_memory(index_select_kernel<true>, shared_limit, device,
                                             kOperation);
    const hdk::detail::ResidentClusterCounts& select_clusters =
        hdk::detail::resident_clusters(index_select_kernel<false>, kSelectThreads,
                                       static_cast<size_t>(shared_limit), device, kOperation);
    const bool exact_mxfp4_warpgroup = p.q_form == IndexQueryForm::kExact &&
                                       score == ScoreKernel::kWarpgroup &&
                                       p.format == KeyFormat::kMXFP4;
    const IndexKeyRing ring =
        index_key_ring(p.q_form, tensor, exact_mxfp4_warpgroup, choice.wide, p.keys.block_size,
                       p.num_rows, capacity, kWarpgroups,
                       static_cast<IndexKeyRingChoice>(g_key_ring.load(std::memory_order_relaxed)));
    choice.workspace =
        plan_index_workspace(p.num_rows, planned_heads, capacity, p.top_k, tensor, fp32_q, sm_count,
                             shared_limit, choice.plan, select_clusters, ring.bytes, ring.rows);
    choice.key_ring = ring.bytes > 0 && choice.workspace.segments > 0;
    // The scoring kernel's shared memory has a ring exactly when the plan gave it one.
    if (ring.bytes > 0) choice.kernels.scoring = choice.kernels.scoring_ring;
    if (choice.workspace.segments > 0) {
      if (choice.kernels.scoring == nullptr) {
        throw Error(std::string(kOperation) + ": internal error: no scoring kernel for the plan");
      }
      hdk::detail::allow_dynamic_shared_memory(choice.kernels.scoring, shared_limit, device,
                                               kOperation);
    }
  }
  // Entry ordinals are below capacity <= INT_MAX; a larger block size comes only with no pages
  // (nothing is ever located then).
  choice.pages = FastDivide(static_cast<uint32_t>(std::min<int64_t>(block_size, INT_MAX)));
  const int cluster_size = choice.plan.cluster_size;
  if (p.num_rows > INT_MAX / cluster_size) {
    throw Error(std::string(kOperation) + ": the CUDA backend takes at most " +
                std::to_string(INT_MAX / cluster_size) + " rows per call, got " +
                std::to_string(p.num_rows));
  }
  return choice;
}

}  // namespace

IndexLaunchReport index_topk_launch_report(const IndexerProblem& p, int device) {
  IndexLaunchReport report;
  if (p.num_rows == 0) return report;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const IndexLaunchChoice choice = choose_launch(p, device);
  report.segments = choice.workspace.segments;
  report.cluster_size =
      report.segments > 0 ? choice.workspace.select.cluster_size : choice.plan.cluster_size;
  report.select_in_one_cta = report.segments > 0 && choice.workspace.select_in_one_cta;
  report.key_ring = choice.key_ring;
  return report;
}

void index_topk_cuda(const IndexerProblem& p, int device, CudaStream stream) {
  if (p.num_rows == 0) return;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const IndexLaunchChoice choice = choose_launch(p, device);
  const cudaStream_t cuda_stream = reinterpret_cast<cudaStream_t>(stream);
  const IndexWorkspacePlan& workspace = choice.workspace;
  if (workspace.segments > 0) {
    // attention.cpp checked that the workspace holds index_topk_workspace_bytes. Each pair of
    // launches takes the next rows_per_launch rows; the select never lets the next kernel start
    // before it ends, so the next scoring writes the workspace after it is read.
    const IndexLaunchPlan& select = workspace.select;
    for (int64_t base = 0; base < p.num_rows; base += workspace.rows_per_launch) {
      const int64_t rows = std::min(workspace.rows_per_launch, p.num_rows - base);
      hdk::detail::check_launch(
          hdk::detail::launch_dependent(
              choice.kernels.scoring, static_cast<unsigned>(rows * workspace.segments), kThreads,
              workspace.score.bytes, cuda_stream, p, workspace.score, workspace.layout,
              FastDivide(static_cast<uint32_t>(workspace.segments)), base, choice.pages,
              choice.wide),
          kOperation, "launching index_score_kernel");
      const bool alone = workspace.select_in_one_cta;
      hdk::detail::check_launch(
          hdk::detail::launch_in_clusters(
              alone ? index_select_kernel<true> : index_select_kernel<false>,
              static_cast<unsigned>(rows * select.cluster_size),
              alone ? kCtaSelectThreads : kSelectThreads, select.launch.bytes, cuda_stream,
              static_cast<unsigned>(alone ? 0 : select.cluster_size), p, select.launch,
              workspace.layout, base, static_cast<int>(workspace.segments)),
          kOperation, "launching index_select_kernel");
    }
    return;
  }
  const IndexLaunchPlan& plan = choice.plan;
  hdk::detail::check_launch(
      hdk::detail::launch_in_clusters(
          choice.kernels.one_launch, static_cast<unsigned>(p.num_rows * plan.cluster_size),
          kThreads, plan.launch.bytes, cuda_stream, static_cast<unsigned>(plan.cluster_size), p,
          plan.launch, choice.pages, choice.wide),
      kOperation, "launching index_topk_kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
