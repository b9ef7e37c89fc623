// Device pieces that several of sparse_decode's kernels share (included by their .cu files only):
// the output stores, the FP8-to-bf16 conversion of stored entries, the query tile of the
// tensor-core kernels and their online softmax over a tile. finish_row, the end of a
// tensor-core CTA, is sparse_decode_finish.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "core/bf16_pairs.h"
#include "core/cuda/async_copy.cuh"
#include "core/cuda/shared_address.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_kernels.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

// In an anonymous namespace: each kernel's translation unit has its own copy, inlined there.
using hdk::detail::cp_async_16;
using hdk::detail::shared_address;

constexpr unsigned kFullMask = 0xffffffffu;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kHeads = kSparseGroupHeads;
constexpr int kTile = kSparseTile;
constexpr int kChunksPerRow = static_cast<int>(kHeadDim / 8);  // 16-byte chunks of a bf16 row
constexpr int kStageStride = static_cast<int>(kHeadDim) + 8;   // floats per staged O row
// Words per bf16 O row staged in finish_row (a row of one split, or a split's partial): 256
// pairs and 4 of padding, so the 8 rows of a warp's store start 4 banks apart.
constexpr int kBf16StageWords = static_cast<int>(kHeadDim) / 2 + 4;
constexpr int kQBytes = operand_bytes(kHeads);  // 64 heads x 512 bf16
constexpr int kEBytes = operand_bytes(kTile);   // 64 entries x 512 bf16
constexpr int kScoreRegisters = kTile / 2;      // S accumulators per thread
static_assert(kHeads == 64 && kTile == 64, "one warpgroup's M; the m64n64 score product");

// ---- output stores ------------------------------------------------------------------------------

__device__ __forceinline__ void store_output(const SparseDecodeProblem& p, int64_t offset,
                                             float value) {
  if (p.out_dtype == DType::kFloat32) {
    static_cast<float*>(p.out)[offset] = value;
  } else {
    static_cast<uint16_t*>(p.out)[offset] = static_cast<uint16_t>(pack_floats_bf16x2(value, 0.0f));
  }
}

// Four consecutive outputs; `vector`: one 16-byte (fp32) or 8-byte (bf16) store is aligned.
__device__ __forceinline__ void store_output4(const SparseDecodeProblem& p, int64_t offset,
                                              float4 value, bool vector) {
  if (!vector) {
    store_output(p, offset, value.x);
    store_output(p, offset + 1, value.y);
    store_output(p, offset + 2, value.z);
    store_output(p, offset + 3, value.w);
  } else if (p.out_dtype == DType::kFloat32) {
    *reinterpret_cast<float4*>(static_cast<float*>(p.out) + offset) = value;
  } else {
    *reinterpret_cast<uint2*>(static_cast<uint16_t*>(p.out) + offset) =
        make_uint2(pack_floats_bf16x2(value.x, value.y), pack_floats_bf16x2(value.z, value.w));
  }
}

// kColumns consecutive columns of one split's partial O, added to `sum` times the split's
// weight: fp32 partials four columns a 16-byte load, bf16 pairs eight (the cluster combine's
// staging and the workspace's records alike).
template <typename Element, int kColumns>
struct PartialColumns;
template <>
struct PartialColumns<float, 4> {
  using Load = float4;
  __device__ static void add(float (&sum)[4], float f, const Load& v) {
    sum[0] += f * v.x, sum[1] += f * v.y, sum[2] += f * v.z, sum[3] += f * v.w;
  }
};
template <>
struct PartialColumns<uint16_t, 8> {
  using Load = uint4;
  __device__ static void add(float (&sum)[8], float f, const Load& v) {
    const uint32_t pairs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      sum[2 * k] += f * bf16_bits_value(pairs[k] & 0xffffu);
      sum[2 * k + 1] += f * bf16_bits_value(pairs[k] >> 16);
    }
  }
};

// ---- list slots --------------------------------------------------------------------------------

// List entry j's slot (indices over cache, then extra_indices over extra_cache; -1 past the list),
// loaded where it is written and kept as loaded: converting an int32 slot to int64 right after
// the load would wait for it there. slot_value converts it at its use, so the round trip overlaps
// whatever the kernel issues in between.
struct LoadedSlot {
  uint32_t low = 0xffffffffu, high = 0xffffffffu;  // -1: past the list
  bool wide = true;                                // an int64 slot (else int32 in `low`)
};
__device__ __forceinline__ LoadedSlot load_slot_now(const SparseDecodeProblem& p, int64_t n,
                                                    int64_t j) {
  LoadedSlot loaded;
  if (j >= p.list_length()) return loaded;
  const bool first_list = j < p.num_indices;
  const IndexView& view = first_list ? p.indices : p.extra_indices;
  const int64_t offset =
      n * view.row_stride + (first_list ? j : j - p.num_indices) * view.column_stride;
  loaded.wide = view.dtype == DType::kInt64;
  if (loaded.wide) {
    asm volatile("ld.global.nc.v2.u32 {%0, %1}, [%2];\n"
                 : "=r"(loaded.low), "=r"(loaded.high)
                 : "l"(static_cast<const int64_t*>(view.data) + offset));
  } else {
    asm volatile("ld.global.nc.u32 %0, [%1];\n"
                 : "=r"(loaded.low)
                 : "l"(static_cast<const int32_t*>(view.data) + offset));
  }
  return loaded;
}
__device__ __forceinline__ int64_t slot_value(const LoadedSlot& loaded) {
  return loaded.wide ? static_cast<int64_t>((uint64_t{loaded.high} << 32) | loaded.low)
                     : static_cast<int64_t>(static_cast<int32_t>(loaded.low));
}

// ---- the query tile of the tensor-core kernels --------------------------------------------------

// 16-byte chunk `chunk` of row `row` of the Q tile.
__device__ __forceinline__ uint8_t* query_chunk(uint8_t* tile, int row, int chunk) {
  return tile + operand_chunk_offset(row, chunk, kHeads);
}

constexpr int kQueryJobs = kHeads * kChunksPerRow / kSparseThreads;  // chunks a thread loads
static_assert(kHeads * kChunksPerRow % kSparseThreads == 0, "whole jobs per thread");

// Chunk c of the group's head h (of kGroupHeads heads from head0), bf16 q with 16-byte aligned
// rows: requested by cp.async as stored, or zeros beyond the group and beyond Hq.
template <int kGroupHeads>
__device__ __forceinline__ void copy_query_chunk(const SparseDecodeProblem& p, int64_t n,
                                                 int64_t head0, uint8_t* q_tile, int h, int c) {
  uint8_t* target = query_chunk(q_tile, h, c);
  // (A 64-head group skips the first test, which the compiler cannot drop.)
  if ((kGroupHeads == kHeads || h < kGroupHeads) && head0 + h < p.num_heads) {
    cp_async_16(target, static_cast<const uint16_t*>(p.q.data) + n * p.q.row_stride +
                            (head0 + h) * p.q.head_stride + 8 * c);
  } else {
    *reinterpret_cast<uint4*>(target) = make_uint4(0, 0, 0, 0);
  }
}

// Job tid + kSparseThreads i is chunk tid % kChunksPerRow of head tid / kChunksPerRow +
// kQueryHeadStep i: a thread takes the same chunk of every fourth head.
constexpr int kQueryHeadStep = kSparseThreads / kChunksPerRow;
static_assert(kSparseThreads % kChunksPerRow == 0, "a thread's chunk is the same in every job");

// The thread's chunks [first_job, end_job) of the CTA's 64 query rows (copy_query_chunk). The
// caller commits them and checks them once they have landed (queries_finite, or the tensor-core
// kernel's scores). Each job's head and chunk divided out of its number (signed) had cost about
// 45 instructions a copy, issued before the first tile's requests: the stepped heads made the
// tensor-core kernel 1.01-1.06x at 1-16 rows (H200).
template <int kGroupHeads = kHeads>
__device__ void copy_queries_async(const SparseDecodeProblem& p, int64_t n, int64_t head0,
                                   uint8_t* q_tile, int tid, int first_job, int end_job) {
  const int c = static_cast<int>(static_cast<unsigned>(tid) % kChunksPerRow);
  const int first_head = static_cast<int>(static_cast<unsigned>(tid) / kChunksPerRow);
  for (int i = first_job; i < end_job; ++i)
    copy_query_chunk<kGroupHeads>(p, n, head0, q_tile, first_head + kQueryHeadStep * i, c);
}

// The CTA's 64 query rows as bf16, its group's kGroupHeads heads from head0 (zero rows beyond the
// group and beyond Hq): bf16 q with 16-byte aligned rows by copy_query_chunk; other q loaded
// four 8-value chunks at a time (one round trip per four chunks), converted to bf16, checked (a
// NaN or infinity marks the CTA bad) and stored.
template <int kGroupHeads = kHeads>
__device__ void load_queries(const SparseDecodeProblem& p, int64_t n, int64_t head0, bool q_async,
                             bool q_vector, uint8_t* q_tile, int* bad, int tid) {
  if (q_async) {
    // The same chunks as copy_queries_async, each job's divided out of its number: the pipelined
    // kernel's consumers (168 registers) spilled more with the stepped heads.
    for (int i = 0; i < kQueryJobs; ++i) {
      const int job = tid + i * kSparseThreads;
      copy_query_chunk<kGroupHeads>(p, n, head0, q_tile, job / kChunksPerRow, job % kChunksPerRow);
    }
    return;
  }
  constexpr int kBatch = 4;
  bool finite = true;
  for (int batch = 0; batch < kQueryJobs; batch += kBatch) {
    float x[kBatch][8];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int job = tid + (batch + b) * kSparseThreads;
      const int h = job / kChunksPerRow, c = job % kChunksPerRow;
      const int64_t head = head0 + h;
      const int64_t offset = n * p.q.row_stride + head * p.q.head_stride + 8 * c;
      if ((kGroupHeads < kHeads && h >= kGroupHeads) || head >= p.num_heads) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          x[b][i] = 0.0f;
      } else if (p.q.dtype == DType::kFloat32) {
        const float* source = static_cast<const float*>(p.q.data) + offset;
        if (q_vector) {
          const float4 v0 = reinterpret_cast<const float4*>(source)[0];
          const float4 v1 = reinterpret_cast<const float4*>(source)[1];
          x[b][0] = v0.x, x[b][1] = v0.y, x[b][2] = v0.z, x[b][3] = v0.w;
          x[b][4] = v1.x, x[b][5] = v1.y, x[b][6] = v1.z, x[b][7] = v1.w;
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            x[b][i] = source[i];
        }
      } else {
        const uint16_t* source = static_cast<const uint16_t*>(p.q.data) + offset;
#pragma unroll
        for (int i = 0; i < 8; ++i)
          x[b][i] = bf16_bits_value(source[i]);
      }
    }
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int job = tid + (batch + b) * kSparseThreads;
      const int h = job / kChunksPerRow, c = job % kChunksPerRow;
      uint32_t words[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        finite = finite && is_finite(x[b][2 * i]) && is_finite(x[b][2 * i + 1]);
        words[i] = pack_floats_bf16x2(x[b][2 * i], x[b][2 * i + 1]);
      }
      *reinterpret_cast<uint4*>(query_chunk(q_tile, h, c)) =
          make_uint4(words[0], words[1], words[2], words[3]);
    }
  }
  if (!finite) *bad = 1;
}

// Whether the query chunks this thread copied by cp.async (load_queries) are finite: read back
// by the same thread after its wait, so no barrier is needed. The pairs' non-finite bits are
// ORed and tested once (each half tested by chained comparisons, the check took 1.3 us of a
// one-tile CTA, H200).
__device__ bool queries_finite(const uint8_t* q_tile, int tid) {
  uint32_t nonfinite = 0;
  const int c = static_cast<int>(static_cast<unsigned>(tid) % kChunksPerRow);
  const int first_head = static_cast<int>(static_cast<unsigned>(tid) / kChunksPerRow);
#pragma unroll
  for (int i = 0; i < kQueryJobs; ++i) {
    const int h = first_head + kQueryHeadStep * i;  // copy_queries_async's jobs
    const uint4 v =
        *reinterpret_cast<const uint4*>(query_chunk(const_cast<uint8_t*>(q_tile), h, c));
    nonfinite |= bf16x2_nonfinite_bits(v.x) | bf16x2_nonfinite_bits(v.y) |
                 bf16x2_nonfinite_bits(v.z) | bf16x2_nonfinite_bits(v.w);
  }
  return nonfinite == 0;
}

// ---- online softmax
// -------------------------------------------------------------------------------

// Online softmax over one tile's scores (log2 units), shared by both tensor-core kernels. A head's
// row lies in the four threads of a quad. Entries that are not real score -inf; fmaxf skips NaN
// scores, whose weights turn the sums NaN (caught at the end). Updates the running maxima and
// sums, rescales O by each row's `alpha` where a maximum moved, and packs the weights as the A
// fragments of O = P E: accumulators 8 k .. 8 k + 7 are k-step k's fragment.
__device__ __forceinline__ void softmax_tile(float (&s)[kScoreRegisters], const int* tile_valid,
                                             int thread, float score_scale, float (&row_max)[2],
                                             float (&row_sum)[2], float (&o)[128],
                                             float (&alpha)[2],
                                             uint32_t (&weights)[kTile / 16][4]) {
  float local_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int i = 0; i < kScoreRegisters; ++i) {
    s[i] = tile_valid[wgmma_d_coord(thread, i).col] ? s[i] * score_scale : -INFINITY;
    local_max[(i / 2) % 2] = fmaxf(local_max[(i / 2) % 2], s[i]);
  }
  float base[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int mask = 1; mask <= 2; mask *= 2)
      local_max[r] = fmaxf(local_max[r], __shfl_xor_sync(kFullMask, local_max[r], mask));
    const float new_max = fmaxf(row_max[r], local_max[r]);
    base[r] = new_max == -INFINITY ? 0.0f : new_max;
    alpha[r] = exp2f(row_max[r] - base[r]);
    row_max[r] = new_max;
    row_sum[r] *= alpha[r];
  }
  // Once the maxima settle, whole warps keep theirs: no rescale then.
  if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
    for (int i = 0; i < 128; ++i)
      o[i] *= alpha[(i / 2) % 2];
  }
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {
      const int i = 8 * k + 2 * reg;
      const float w0 = exp2f(s[i] - base[reg % 2]), w1 = exp2f(s[i + 1] - base[reg % 2]);
      row_sum[reg % 2] += w0;
      row_sum[reg % 2] += w1;
      weights[k][reg] = pack_floats_bf16x2(w0, w1);
    }
  }
}

}  // namespace
}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
