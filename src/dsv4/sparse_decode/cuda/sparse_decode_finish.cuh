// The end of a CTA of sparse_decode's tensor-core kernels (both run it the same way): which row,
// head group and split the CTA works on, and finish_row, which combines the row's splits across
// its cluster or leaves the CTA's partial result in the workspace for the combine kernel.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "core/bf16_pairs.h"
#include "core/cuda/cluster_barrier.cuh"
#include "core/cuda/count_invalid.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_device.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

namespace cg = cooperative_groups;

// Which query row, head group and list split a CTA of a tensor-core kernel works on. In clusters
// a row is one cluster and the rank says the group and split; through the workspace a cluster is
// one split's head groups, and the row's CTAs are consecutive blocks of the grid, split-major.
struct CtaRole {
  int64_t n;
  int group;
  int split;
};
template <bool kThroughWorkspace>
__device__ __forceinline__ CtaRole cta_role(const SparsePlan& plan) {
  if constexpr (kThroughWorkspace) {
    const int within = static_cast<int>(blockIdx.x % plan.row_ctas());
    return CtaRole{blockIdx.x / plan.row_ctas(), within % plan.groups, within / plan.groups};
  } else {
    const int rank = static_cast<int>(cg::this_cluster().block_rank());
    return CtaRole{blockIdx.x / plan.cluster(), rank % plan.groups, rank / plan.groups};
  }
}

// Where a tensor-core kernel keeps what finish_row reads and writes in its shared memory.
struct CtaSpace {
  float* stage;       // [64][kStageStride] fp32: the CTA's unnormalized O, over its operand tiles
  float* stat_m;      // [64] row maxima (log2 units)
  float* stat_l;      // [64] row sums
  const float* sink;  // [64] the group's sinks as load_sink gave them, each by its own thread
  int* bad;           // the CTA's invalid-row flag
  float* factors;     // [splits][64] each split's weight in the combined row
};

// The sink of head `tid` of the group of kGroupHeads heads starting at head0 (0 for threads past
// the group's heads or without sinks), loaded by each kernel before its list so that the round
// trip to memory is hidden behind the list rather than added to the end (1.2 us of a one-row
// call's finish, H200). The kernel keeps it in CtaSpace::sink, which the same thread reads in
// finish_row.
template <int kGroupHeads = kHeads>
__device__ __forceinline__ float load_sink(const SparseDecodeProblem& p, int64_t head0, int tid) {
  return tid < kGroupHeads && p.sink != nullptr && head0 + tid < p.num_heads
             ? p.sink[(head0 + tid) * p.sink_stride]
             : 0.0f;
}

// Whether a row of one split finishes without the combine's jobs: bf16 outputs on 16 bytes take
// its O in 16-byte runs (store_bf16_runs).
__device__ __forceinline__ bool one_split_bf16_row(const SparseDecodeProblem& p,
                                                   const SparsePlan& plan) {
  return plan.splits == 1 && p.out_dtype == DType::kBFloat16 &&
         reinterpret_cast<uintptr_t>(p.out) % 16 == 0 && p.out_row_stride % 8 == 0 &&
         p.out_head_stride % 8 == 0;
}

// Row n's O for the group's heads from head0, eight bf16 columns a job: `run_of(h, run)` is head
// h's run of columns 8 run .. 8 run + 7 as four bf16 pairs. An invalid row is zeros, NaN partials
// included.
template <int kCtaThreads, typename RunOf>
__device__ __forceinline__ void store_bf16_runs(const SparseDecodeProblem& p, int64_t n,
                                                int64_t head0, int tid, bool row_bad,
                                                RunOf run_of) {
  constexpr int kRuns = static_cast<int>(kHeadDim) / 8;  // 16-byte runs a row
  for (int job = tid; job < kHeads * kRuns; job += kCtaThreads) {
    const int h = static_cast<int>(static_cast<unsigned>(job) / kRuns);
    const int run = static_cast<int>(static_cast<unsigned>(job) % kRuns);
    if (head0 + h >= p.num_heads) continue;
    uint4 packed = make_uint4(0, 0, 0, 0);
    if (!row_bad) packed = run_of(h, run);
    *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) + n * p.out_row_stride +
                              (head0 + h) * p.out_head_stride + 8 * run) = packed;
  }
}

// The end of a CTA's slice: its partial result (row maxima and sums, unnormalized O) staged in
// its shared memory, then, across the row's cluster, the row's validity agreed on, the sink added
// once, lse written and this CTA's column slice of its group's heads finished from every split's
// partial. `o_half`: which 256 columns of O this thread's accumulators hold (-1: none);
// `holds_stats`: whether its row_max / row_sum are the CTA's softmax statistics. kGroupHeads:
// the heads of a group (SparsePlan::group_heads), fewer than 64 only through the workspace.
// `shared_conversion`: the peer CTA writes into this one's shared memory (the pipelined kernel's
// shared conversion), so the cluster meets at the end even through the workspace. Every thread of
// the CTA calls it (it holds CTA and cluster barriers).
// A row of one split in its cluster with bf16 outputs on 16 bytes (one_split_bf16_row) skips the
// combine's jobs and stores its O in 16-byte runs, ending without the barrier's fence. With
// kStageOneSplitRowsAsBf16 (the tensor-core kernel) the weights come before the cluster barrier
// and O is staged as the finished bf16 rows straight from the accumulators; the pipelined kernel,
// whose accumulators kept across the weights spilled, scales its fp32 staging as it stores. A
// row of several splits with bf16 outputs combines bf16 partials (`bf16_partials`); through the
// workspace, kPartials says which records the instance writes.
template <int kCtaThreads, SparsePartials kPartials, int kGroupHeads = kHeads,
          bool kStageOneSplitRowsAsBf16 = false>
__device__ void finish_row(const SparseDecodeProblem& p, const SparsePlan& plan,
                           const CtaSpace& space, int64_t n, int tid, int o_half, bool holds_stats,
                           const float (&o)[128], const float (&row_max)[2], float (&row_sum)[2],
                           bool out_vector, bool shared_conversion) {
  constexpr bool kThroughWorkspace = kPartials != SparsePartials::kInCluster;
  cg::cluster_group cluster = cg::this_cluster();
  const CtaRole role = cta_role<kThroughWorkspace>(plan);
  static_assert(kGroupHeads == kHeads || kThroughWorkspace, "a cluster combines 64-head groups");
  const int group = role.group, split = role.split;
  const int64_t head0 = int64_t{group} * kGroupHeads;
  const int lane = tid % 32;
  const int thread = tid % 128;          // in the warpgroup (wgmma_d_coord)
  const int head_tile = (tid / 32) % 4;  // heads 16 head_tile .. + 15 of the warpgroup's products
  const int quad_row = lane / 4;         // rows quad_row and quad_row + 8 of the head tile
  float* stage = space.stage;
  float* stat_m = space.stat_m;
  float* stat_l = space.stat_l;
  int* bad = space.bad;
  float* factors = space.factors;

  // ---- this CTA's partial result: (row max, row sum, unnormalized O) per head ---------------
  bool nan = false;
  if (holds_stats) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int mask = 1; mask <= 2; mask *= 2)
        row_sum[r] += __shfl_xor_sync(kFullMask, row_sum[r], mask);
      nan = nan || isnan(row_sum[r]);
    }
  }
  if (o_half >= 0) {
#pragma unroll
    for (int i = 0; i < 128; ++i)
      nan = nan || isnan(o[i]);
  }
  if (tid < kGroupHeads && p.sink != nullptr && head0 + tid < p.num_heads) {
    const float sink = space.sink[tid];
    nan = nan || isnan(sink) || sink == INFINITY;  // the CPU's NaN results for such a sink
  }
  if (nan) *bad = 1;
  // Staged as bf16 rows below, after the weights.
  const bool one_split_rows =
      kStageOneSplitRowsAsBf16 && !kThroughWorkspace && one_split_bf16_row(p, plan);
  // The splits of a row combined in its cluster with bf16 outputs stage their partial O as bf16
  // pairs, rows kBf16StageWords apart: the combine's reads through distributed shared memory,
  // whose bytes bound it, are halved. Their rounding adds at most 2^-9 max|E| to o
  // (docs/dsv4-attention.md, "Accuracy").
  // Through the workspace the records are bf16 in the instances for them (bf16 outputs,
  // SparsePlan::bf16_records), which halves what a CTA writes there and what the combine kernel
  // reads; the other instances keep only the fp32 records' code.
  const bool bf16_partials = kThroughWorkspace ? kPartials == SparsePartials::kBf16Records
                                               : plan.splits > 1 && p.out_dtype == DType::kBFloat16;
  if (!one_split_rows) __syncthreads();  // the operand tiles are free for the staging
  if (!one_split_rows && o_half >= 0 && (kGroupHeads == kHeads || 16 * head_tile < kGroupHeads)) {
    if (bf16_partials) {
      uint32_t* rows = reinterpret_cast<uint32_t*>(stage);
#pragma unroll
      for (int i = 0; i < 128; i += 2) {
        const MatrixCoord at = wgmma_d_coord(thread, i);
        rows[at.row * kBf16StageWords + 128 * o_half + at.col / 2] =
            pack_floats_bf16x2(o[i], o[i + 1]);
      }
    } else {
#pragma unroll
      for (int i = 0; i < 128; i += 2) {
        const MatrixCoord at = wgmma_d_coord(thread, i);
        *reinterpret_cast<float2*>(stage + at.row * kStageStride + 256 * o_half + at.col) =
            make_float2(o[i], o[i + 1]);
      }
    }
  }
  if (holds_stats && lane % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * head_tile + quad_row + 8 * r;
      stat_m[row] = row_max[r];
      stat_l[row] = row_sum[r];
    }
  }
  // Head tid's weight of each split in the combined row (`factors`) and its lse, from the splits'
  // maxima and sums and the sink.
  float lse = 0.0f;
  auto statistics = [&](auto max_splits) {
    constexpr int kMaxSplits = decltype(max_splits)::value;
    const int h = tid;
    float split_m[kMaxSplits], split_l[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      if (s < plan.splits) {
        const int peer = s * plan.groups + group;
        // One split is this CTA's own (no distributed load).
        split_m[s] = kMaxSplits == 1 ? stat_m[h] : cluster.map_shared_rank(stat_m, peer)[h];
        split_l[s] = kMaxSplits == 1 ? stat_l[h] : cluster.map_shared_rank(stat_l, peer)[h];
      }
    }
    float top = -INFINITY;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)
      if (s < plan.splits) top = fmaxf(top, split_m[s]);
    const bool has_head = head0 + h < p.num_heads;
    const float sink = p.sink != nullptr && has_head ? space.sink[h] * kLog2e : -INFINITY;
    const float list_top = top;
    top = fmaxf(top, sink);
    lse = -INFINITY;
    if (top == -INFINITY) {  // empty list and no sink: o = 0, lse = -inf
      for (int s = 0; s < plan.splits; ++s)
        factors[s * kHeads + h] = 0.0f;
    } else {
      float denominator = exp2f(sink - top);
      float weight[kMaxSplits];
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s) {
        if (s < plan.splits) {
          weight[s] = exp2f(split_m[s] - top);
          denominator += split_l[s] * weight[s];
        }
      }
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s)
        if (s < plan.splits) factors[s * kHeads + h] = weight[s] / denominator;
      // An empty list leaves the sink alone in the denominator: lse is the sink itself, not
      // its round trip through log2 units.
      lse = list_top == -INFINITY ? space.sink[h] : (top + log2f(denominator)) * kLn2;
    }
    if (!p.lse_includes_sink) {  // log of the list's own sum (FlashMLA's lse)
      float list_sum = 0.0f;
#pragma unroll
      for (int s = 0; s < kMaxSplits; ++s)
        if (s < plan.splits) list_sum += split_l[s] * exp2f(split_m[s] - list_top);
      lse = list_top == -INFINITY ? -INFINITY : (list_top + log2f(list_sum)) * kLn2;
    }
  };
  if constexpr (kStageOneSplitRowsAsBf16) {
    if (one_split_rows) {
      // The weights before the cluster barrier, so that the accumulators are staged and dead
      // before it (kept across it, they spilled at the pipelined kernel's 168 registers).
      __syncthreads();  // the statistics are complete; the operand tiles are free
      if (tid < kHeads) statistics(std::integral_constant<int, 1>());
      __syncthreads();  // the factors are complete
      // Accumulators 4 k + 2 r, 4 k + 2 r + 1 are columns 8 k + 2 (lane % 4) + {0, 1} of row
      // 16 head_tile + lane / 4 + 8 r (wgmma_d_coord): bf16 pair (word) 4 k + lane % 4 of the
      // warpgroup's half row. Rows kBf16StageWords apart keep a warp's stores on 32 banks.
      uint32_t* rows = reinterpret_cast<uint32_t*>(stage);
      if (o_half >= 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int row = 16 * head_tile + quad_row + 8 * r;
          const float factor = factors[row];
          uint32_t* at = rows + row * kBf16StageWords + 128 * o_half + lane % 4;
#pragma unroll
          for (int k = 0; k < 32; ++k)
            at[4 * k] =
                pack_floats_bf16x2(o[4 * k + 2 * r] * factor, o[4 * k + 2 * r + 1] * factor);
        }
      }
      cluster.sync();  // every CTA's flag is visible cluster-wide, the bf16 rows CTA-wide
      const int rank_bad = tid < plan.cluster() ? *cluster.map_shared_rank(bad, tid) : 0;
      const bool row_bad = __syncthreads_or(rank_bad) != 0;
      if (tid < kHeads && head0 + tid < p.num_heads && p.lse != nullptr)
        p.lse[n * p.lse_row_stride + (head0 + tid) * p.lse_head_stride] = row_bad ? NAN : lse;
      // The peers' flags are read: a peer may leave once this CTA is past here too.
      hdk::detail::cluster_arrive_relaxed();
      store_bf16_runs<kCtaThreads>(p, n, head0, tid, row_bad, [&](int h, int run) {
        return *reinterpret_cast<const uint4*>(rows + h * kBf16StageWords + 4 * run);
      });
      if (group == 0 && tid == 0 && row_bad) count_invalid(p.invalid_count, 1);
      hdk::detail::cluster_wait();  // no CTA leaves while a peer may still read its flag
      return;
    }
  }
  if constexpr (kThroughWorkspace) {
    // The row's other splits are CTAs of other clusters: the partial goes to the workspace for
    // sparse_decode_combine_kernel. With a shared conversion the cluster (this split's head
    // groups) still meets at the end: the peer's copies and arrivals land in this CTA's shared
    // memory.
    __syncthreads();  // the staged O, the statistics and the flag are complete
    // The group's rows only: smaller groups leave an SM fewer bytes to write.
    const SparseWorkspaceLayout layout =
        sparse_workspace_layout(p.num_rows, plan.groups, plan.splits, kGroupHeads);
    const int64_t record = sparse_record(n, split, group, plan.splits, plan.groups);
    if (bf16_partials) {  // [kGroupHeads][512] bf16 in the first half of the fp32 record space
      uint4* o_record = reinterpret_cast<uint4*>(p.workspace + layout.o_offset) +
                        record * (kGroupHeads * kSparseRecordColumns / 8);
      const uint32_t* rows = reinterpret_cast<const uint32_t*>(stage);
      for (int job = tid; job < kGroupHeads * (kHeadDim / 8); job += kCtaThreads) {
        const int h = job / (kHeadDim / 8), octet = job % (kHeadDim / 8);
        o_record[job] = *reinterpret_cast<const uint4*>(rows + h * kBf16StageWords + 4 * octet);
      }
    } else {
      float4* o_record = reinterpret_cast<float4*>(p.workspace + layout.o_offset) +
                         record * (kGroupHeads * kSparseRecordColumns / 4);
      for (int job = tid; job < kGroupHeads * (kHeadDim / 4); job += kCtaThreads) {
        const int h = job / (kHeadDim / 4), quad = job % (kHeadDim / 4);
        o_record[job] = *reinterpret_cast<const float4*>(stage + h * kStageStride + 4 * quad);
      }
    }
    float* stats =
        reinterpret_cast<float*>(p.workspace + layout.stats_offset) + record * 2 * kGroupHeads;
    if (tid < kGroupHeads) {
      stats[tid] = stat_m[tid];
      stats[kGroupHeads + tid] = stat_l[tid];
    }
    if (tid == 0) reinterpret_cast<int*>(p.workspace + layout.flags_offset)[record] = *bad;
    // Nothing else of a CTA is read by its peers here, and the combine kernel sees the records
    // once this grid is done: without a shared conversion a CTA leaves without waiting for them.
    if (shared_conversion) cluster.sync();
    return;
  }
  cluster.sync();  // every CTA's partials and flag are visible cluster-wide

  // ---- combine: the row's validity, then this CTA's column slice of its group's heads -------
  // Every distributed load of the statistics goes out in one round: thread r reads rank r's
  // flag, and each head's thread its splits' maxima and sums (unrolled over the most splits the
  // plan allows), before any is used. Read one after another, they took 1.2-2.1 us of a
  // one-row call (H200).
  const int rank_bad = tid < plan.cluster() ? *cluster.map_shared_rank(bad, tid) : 0;
  // Unrolled for the row's split count up to 4, as the bf16 combine below: the code a row runs
  // is fetched cold inside a decode step. One split reads its own statistics.
  if (tid < kHeads) {
    if (plan.splits == 1) {
      statistics(std::integral_constant<int, 1>());
    } else if (plan.splits == 2) {
      statistics(std::integral_constant<int, 2>());
    } else if (plan.splits == 3) {
      statistics(std::integral_constant<int, 3>());
    } else if (plan.splits == 4) {
      statistics(std::integral_constant<int, 4>());
    } else if (plan.splits <= kSparseMaxCluster) {
      statistics(std::integral_constant<int, kSparseMaxCluster>());
    } else {
      statistics(std::integral_constant<int, kSparseMaxWideCluster>());
    }
  }
  // The row's validity, and the factors are complete.
  const bool row_bad = __syncthreads_or(rank_bad) != 0;
  if (tid < kHeads && split == 0 && head0 + tid < p.num_heads && p.lse != nullptr) {
    p.lse[n * p.lse_row_stride + (head0 + tid) * p.lse_head_stride] = row_bad ? NAN : lse;
  }
  // A row of one split staged in fp32: eight columns a job from the CTA's own staging.
  if (!kStageOneSplitRowsAsBf16 && one_split_bf16_row(p, plan)) {
    hdk::detail::cluster_arrive_relaxed();  // the peers' flags and statistics are read
    store_bf16_runs<kCtaThreads>(p, n, head0, tid, row_bad, [&](int h, int run) {
      const float f = factors[h];
      const float4 a = *reinterpret_cast<const float4*>(stage + h * kStageStride + 8 * run);
      const float4 b = *reinterpret_cast<const float4*>(stage + h * kStageStride + 8 * run + 4);
      return make_uint4(pack_floats_bf16x2(f * a.x, f * a.y), pack_floats_bf16x2(f * a.z, f * a.w),
                        pack_floats_bf16x2(f * b.x, f * b.y), pack_floats_bf16x2(f * b.z, f * b.w));
    });
    if (group == 0 && tid == 0 && row_bad) count_invalid(p.invalid_count, 1);
    hdk::detail::cluster_wait();  // no CTA leaves while a peer may still read its shared memory
    return;
  }

  // Each thread sums four columns (eight of bf16 partials) of one head over the splits: every
  // split's partial is loaded (distributed shared memory) before any is used, then the values are
  // stored at once. The split finishes its combine_slice of every head's columns.
  const CombineSlice slice = combine_slice(split, plan.splits, bf16_partials ? 64 : 128);
  // The arrays below are unrolled over the most splits the plan allows: 8 unless the row's
  // cluster is one of the non-portable 16, whose longer loops cost the others 1-4% on an H100.
  auto combine = [&](auto max_splits, auto in_bf16) {
    constexpr int kMaxSplits = decltype(max_splits)::value;
    const float* peer_stage[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      peer_stage[s] =
          s < plan.splits ? cluster.map_shared_rank(stage, s * plan.groups + group) : stage;
    }
    if constexpr (decltype(in_bf16)::value) {  // eight columns a job, 16 bytes of a split's pairs
      for (int job = tid; job < kHeads * slice.count; job += kCtaThreads) {
        const int h = head_of_job(static_cast<uint32_t>(job), slice.inverse);
        const int octet = slice.first + job - h * slice.count;
        const int64_t head = head0 + h;
        if (head >= p.num_heads) continue;
        float sum[8] = {};
        if (!row_bad) {
          uint4 partial[kMaxSplits];
#pragma unroll
          for (int s = 0; s < kMaxSplits; ++s) {
            if (s < plan.splits) {
              partial[s] =
                  *reinterpret_cast<const uint4*>(reinterpret_cast<const uint32_t*>(peer_stage[s]) +
                                                  h * kBf16StageWords + 4 * octet);
            }
          }
#pragma unroll
          for (int s = 0; s < kMaxSplits; ++s) {
            if (s < plan.splits)
              PartialColumns<uint16_t, 8>::add(sum, factors[s * kHeads + h], partial[s]);
          }
        }
        const int64_t offset = n * p.out_row_stride + head * p.out_head_stride + 8 * octet;
        store_output4(p, offset, make_float4(sum[0], sum[1], sum[2], sum[3]), out_vector);
        store_output4(p, offset + 4, make_float4(sum[4], sum[5], sum[6], sum[7]), out_vector);
      }
    } else {
      for (int job = tid; job < kHeads * slice.count; job += kCtaThreads) {
        const int h = head_of_job(static_cast<uint32_t>(job), slice.inverse);
        const int col = 4 * (slice.first + job - h * slice.count);
        const int64_t head = head0 + h;
        if (head >= p.num_heads) continue;
        float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (!row_bad && plan.splits == 1) {  // the CTA's own partial alone
          const float f = factors[h];
          const float4 v = *reinterpret_cast<const float4*>(stage + h * kStageStride + col);
          sum = make_float4(f * v.x, f * v.y, f * v.z, f * v.w);
        } else if (!row_bad) {
          float4 partial[kMaxSplits];
#pragma unroll
          for (int s = 0; s < kMaxSplits; ++s) {
            if (s < plan.splits) {
              partial[s] = *reinterpret_cast<const float4*>(peer_stage[s] + h * kStageStride + col);
            }
          }
#pragma unroll
          for (int s = 0; s < kMaxSplits; ++s) {
            if (s < plan.splits) {
              const float f = factors[s * kHeads + h];
              sum.x += f * partial[s].x, sum.y += f * partial[s].y;
              sum.z += f * partial[s].z, sum.w += f * partial[s].w;
            }
          }
        }
        const int64_t offset = n * p.out_row_stride + head * p.out_head_stride + col;
        store_output4(p, offset, sum, out_vector);
      }
    }
  };
  // The bf16 partials' loop is unrolled for the row's split count where it is small: its code is
  // fetched cold inside a decode step, and the 8-split form is three times the fp32 loop's.
  using Bf16 = std::true_type;
  using Fp32 = std::false_type;
  if (bf16_partials && plan.splits <= 4) {
    if (plan.splits == 2) {
      combine(std::integral_constant<int, 2>(), Bf16());
    } else if (plan.splits == 3) {
      combine(std::integral_constant<int, 3>(), Bf16());
    } else {
      combine(std::integral_constant<int, 4>(), Bf16());
    }
  } else if (plan.splits <= kSparseMaxCluster) {
    if (bf16_partials) {
      combine(std::integral_constant<int, kSparseMaxCluster>(), Bf16());
    } else {
      combine(std::integral_constant<int, kSparseMaxCluster>(), Fp32());
    }
  } else if (bf16_partials) {
    combine(std::integral_constant<int, kSparseMaxWideCluster>(), Bf16());
  } else {
    combine(std::integral_constant<int, kSparseMaxWideCluster>(), Fp32());
  }
  if (split == 0 && group == 0 && tid == 0 && row_bad) count_invalid(p.invalid_count, 1);
  cluster.sync();  // no CTA leaves while a peer may still read its shared memory
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
