// CUDA kernels of sparse_decode. The design, the work split and what was verified where:
// docs/dsv4-attention.md ("CUDA kernels").
//
// Tensor-core kernel: one thread-block cluster per query row. Its CTAs are `groups` head groups
// of 64 heads times `splits` slices of the list (plan_sparse_decode). A CTA walks its slice in
// tiles of 64 entries: cp.async brings the next tile's stored bytes into shared memory while the
// current tile, dequantized once to bf16, feeds S = Q E^T and O += P E through Hopper's
// warpgroup MMA (wgmma.cuh). Two warpgroups: warpgroup h computes S over dims 256 h .. + 255
// (the two halves are summed through shared memory, so both hold the whole 64 x 64 S and run the
// same softmax) and owns O's columns 256 h .. + 255, with P passed from the score accumulators
// to the output product in registers. The splits' partial results meet in shared memory across
// the cluster (no global workspace), where the sink is added once and the row's validity agreed
// on (finish_row).
//
// Pipelined tensor-core kernel: the same clusters, tiles and finish_row, with the work split by
// role (warp specialization): a producer warpgroup converts tile t + 1 into the second of two E
// stages while the other two multiply tile t (docs/dsv4-attention.md, "The pipelined
// tensor-core kernel"); with two head groups their two CTAs convert half a tile each and copy
// it to the other. The dispatcher's choice from 3 tiles a CTA (kPipelinedMinTiles).
//
// CUDA-core kernel: one CTA per query row, one warp per head at a time, lane l holding entry
// values 16 l .. 16 l + 15 in fp32; the CPU backend's arithmetic, step for step.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <string>
#include <tuple>
#include <type_traits>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/mbarrier.cuh"
#include "core/cuda/shared_address.cuh"
#include "core/cuda_helpers.h"
#include "core/fast_divide.h"
#include "dsv4/bf16_pairs.h"
#include "dsv4/cuda/count_invalid.cuh"
#include "dsv4/cuda/sparse_decode_cuda.h"
#include "dsv4/cuda/sparse_decode_layout.h"
#include "dsv4/cuda/wgmma.cuh"
#include "dsv4/kv_formats.h"
#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

namespace cg = cooperative_groups;
using hdk::detail::bulk_copy_to_peer;
using hdk::detail::cluster_shared_address;
using hdk::detail::cp_async_16;
using hdk::detail::cp_async_8;
using hdk::detail::cp_async_commit;
using hdk::detail::cp_async_wait;
using hdk::detail::mbarrier_arrive;
using hdk::detail::mbarrier_arrive_expect_bytes;
using hdk::detail::mbarrier_arrive_remote;
using hdk::detail::mbarrier_init;
using hdk::detail::mbarrier_wait;
using hdk::detail::shared_address;

constexpr const char* kOperation = "hdk::dsv4::sparse_decode";
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kHeads = kSparseHeadsPerCta;
constexpr int kTile = kSparseTile;
constexpr int kChunksPerRow = static_cast<int>(kHeadDim / 8);  // 16-byte chunks of a bf16 row
constexpr int kStageStride = static_cast<int>(kHeadDim) + 8;   // floats per staged O row

std::atomic<SparseDecodeKernel> kernel_override{SparseDecodeKernel::kAuto};
std::atomic<int> splits_override{0};
std::atomic<SparseWorkspaceChoice> workspace_override{SparseWorkspaceChoice::kAuto};
std::atomic<bool> dependent_launch{true};

// ---- shared memory of the tensor-core kernel (byte offsets from a 1024-byte boundary) --------
constexpr int kQBytes = operand_bytes(kHeads);             // 64 heads x 512 bf16
constexpr int kEBytes = operand_bytes(kTile);              // 64 entries x 512 bf16
constexpr int kScoreRegisters = kTile / 2;                 // S accumulators per thread
constexpr int kExchangeBytes = kScoreRegisters * 128 * 4;  // one warpgroup's partial S
constexpr int kQOffset = 0;
constexpr int kEOffset = kQOffset + kQBytes;
constexpr int kRawOffset = kEOffset + kEBytes;                            // [64][576] stored bytes
constexpr int kScaleOffset = kRawOffset + kTile * kEntryDataBytes;        // [64][8] scale bytes
constexpr int kExchangeOffset = kScaleOffset + kTile * kEntryScaleBytes;  // [2 halves] S
constexpr int kValidOffset = kExchangeOffset + 2 * kExchangeBytes;        // [2 buffers][64] int
constexpr int kStatOffset = kValidOffset + 2 * kTile * 4;                 // m[64], l[64] fp32
constexpr int kBadOffset = kStatOffset + 2 * kHeads * 4;                  // int (+ pad)
constexpr int kFactorOffset = kBadOffset + 16;                            // [8 splits][64] fp32
constexpr int kUsedBytes = kFactorOffset + kSparseMaxWideCluster * kHeads * 4;
// The dynamic shared memory is aligned up to the swizzle atom inside the kernel.
constexpr int kSharedBytes = kUsedBytes + kSwizzleAtomBytes;
// After the list, the CTA's unnormalized O ([64][kStageStride] fp32) overlays Q, E and the raw
// tile, which are no longer read.
constexpr int kStageOffset = 0;
static_assert(kStageOffset + kHeads * kStageStride * 4 <= kExchangeOffset, "O staging overlaps");
static_assert(kSharedBytes <= 227 * 1024, "shared memory beyond an SM's");
static_assert(kEntryDataBytes % 16 == 0 && kRawOffset % 16 == 0 && kEOffset % 1024 == 0, "align");
static_assert(kHeads == 64 && kTile == 64, "one warpgroup's M; the m64n64 score product");

// ---- PTX wrappers ---------------------------------------------------------------------------

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

// ---- tensor-core kernel: pieces ---------------------------------------------------------------

// 16-byte chunk `chunk` of row `row` of the Q tile.
__device__ __forceinline__ uint8_t* query_chunk(uint8_t* tile, int row, int chunk) {
  return tile + operand_chunk_offset(row, chunk, kHeads);
}

// Where an entry's stored bytes are: its 576 data bytes and 8 scale bytes, or nothing (data ==
// nullptr) for a skipped entry and a slot beyond its cache (which also marks the CTA bad).
struct EntrySource {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
};

constexpr int kEntriesPerWarp = kTile / kWarps;

// Slot of list entry j of row n (indices over cache, then extra_indices over extra_cache); -1
// past the list.
__device__ __forceinline__ int64_t listed_slot(const SparseDecodeProblem& p, int64_t n, int64_t j) {
  return j < p.list_length() ? p.list_slot(n, j) : -1;
}

// Where list entry j's stored bytes are, for its slot (listed_slot): nothing for a skipped entry
// and for a slot beyond its cache, which also marks the CTA bad.
__device__ __forceinline__ EntrySource locate_entry(const SparseDecodeProblem& p, int64_t j,
                                                    int64_t slot, int* bad) {
  EntrySource source;
  if (slot < 0) return source;
  const PagedPool& pool = p.list_pool(j);
  if (slot >= pool.num_slots()) {
    *bad = 1;
    return source;
  }
  const auto [page, offset] = pool.locate(slot);
  source.data = page + offset * kEntryDataBytes;
  source.scales = page + pool.block_size * kEntryDataBytes + offset * kEntryScaleBytes;
  return source;
}

// Lane l of warp w resolves entry w + 8 (l % 8) of tile `tile` of row n's list; lanes 8.. repeat
// lanes 0..7, so the warp's eight slots cost one round trip. Called a tile ahead of issue_tile,
// so that round trip overlaps the current tile's wait and dequantization.
__device__ __forceinline__ EntrySource resolve_entry(const SparseDecodeProblem& p, int64_t n,
                                                     int64_t tile, int* bad, int warp, int lane) {
  const int64_t j = tile * kTile + warp + kWarps * (lane % kEntriesPerWarp);
  return locate_entry(p, j, listed_slot(p, n, j), bad);
}

__device__ __forceinline__ const uint8_t* shuffle_pointer(const uint8_t* pointer, int lane) {
  const uint64_t bits = reinterpret_cast<uint64_t>(pointer);
  const uint32_t lo = __shfl_sync(kFullMask, static_cast<uint32_t>(bits), lane);
  const uint32_t hi = __shfl_sync(kFullMask, static_cast<uint32_t>(bits >> 32), lane);
  return reinterpret_cast<const uint8_t*>((static_cast<uint64_t>(hi) << 32) | lo);
}

// Enqueues the stored bytes of the warp's eight entries of a tile (resolved by resolve_entry)
// into the raw buffer and records which are real (valid[e]). The warp's lanes share each entry's
// 36 (or 72) data chunks and its scale word.
template <bool kWide>
__device__ void issue_tile(const EntrySource& mine, uint8_t* smem, int* valid, int warp, int lane) {
  uint8_t* raw = smem + kRawOffset;
  uint8_t* raw_scales = smem + kScaleOffset;
#pragma unroll 1
  for (int i = 0; i < kEntriesPerWarp; ++i) {
    const int e = warp + kWarps * i;
    const uint8_t* data = shuffle_pointer(mine.data, i);
    const uint8_t* scales = shuffle_pointer(mine.scales, i);
    if (lane == 0) valid[e] = data != nullptr ? 1 : 0;
    if (data == nullptr) continue;
    uint8_t* target = raw + e * kEntryDataBytes;
    constexpr int kChunk = kWide ? 16 : 8;
    constexpr int kDataChunks = static_cast<int>(kEntryDataBytes) / kChunk;
    constexpr int kPasses = (kDataChunks + 1 + 31) / 32;  // the data chunks, then the scales
#pragma unroll
    for (int pass = 0; pass < kPasses; ++pass) {
      const int c = lane + 32 * pass;
      if (c < kDataChunks) {
        if (kWide) {
          cp_async_16(target + c * kChunk, data + c * kChunk);
        } else {
          cp_async_8(target + c * kChunk, data + c * kChunk);
        }
      } else if (c == kDataChunks) {
        cp_async_8(raw_scales + e * kEntryScaleBytes, scales);
      }
    }
  }
}

// Eight stored FP8 codes times 2^(scale - 127) as eight bf16 (exact; scale byte 0 is 2^-127).
// NaN codes and the NaN scale come out as some finite value: the caller flags them
// (fp8_nan_seen) instead.
__device__ __forceinline__ uint4 dequantize_8(uint2 codes, uint32_t scale_byte) {
  const uint32_t up = kBf16TwoTo120 * 0x10001u;
  const uint32_t scale = ue8m0_as_bf16(scale_byte) * 0x10001u;
  auto convert = [&](uint32_t spread) {
    return mul_bf16x2(mul_bf16x2(e4m3_spread_pair_as_scaled_bf16(spread), up), scale);
  };
  return make_uint4(
      convert(__byte_perm(codes.x, 0, 0x4140)), convert(__byte_perm(codes.x, 0, 0x4342)),
      convert(__byte_perm(codes.y, 0, 0x4140)), convert(__byte_perm(codes.y, 0, 0x4342)));
}

// dequantize_8 with one multiply: the placed pair (value x 2^-120) times 2^(scale - 7) is the
// same exact product, and 2^(scale - 7) is a bf16 number for scale bytes up to
// kOneMultiplyMaxScale (UE8M0 2^7; the writer's scales of values up to 448 x 2^7). `factor`:
// one_multiply_factor(scale byte), or 0 for an entry that is not real (its row comes out zero).
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

// Nonzero where a code is an FP8 NaN or the scale byte is the NaN scale (0xff + 1 sets bit 8).
__device__ __forceinline__ uint32_t fp8_nan_bits(uint2 codes, uint32_t scale_byte) {
  return e4m3_nan_flags(codes.x) | e4m3_nan_flags(codes.y) | ((scale_byte + 1) & 0x100u);
}

// The raw tile to bf16 rows of E (zero rows for entries that are not real). Thread t converts
// output chunk c = t % 64 (8 values) of entries t / 64, + 4, ...: chunks 0..55 are FP8 values
// (scale group c / 8), 56..63 the RoPE values copied as stored. Returns whether a real entry
// held an FP8 NaN code or a NaN scale: such a value is not turned into NaN here, the caller
// marks the row bad, which is what its NaN would have done (every head's sums take it in).
__device__ bool dequantize_tile(uint8_t* smem, const int* valid, int tid) {
  const uint8_t* raw = smem + kRawOffset;
  const uint8_t* raw_scales = smem + kScaleOffset;
  constexpr int kNopeChunks = static_cast<int>(kNopeDim / 8);
  constexpr int kEntriesPerPass = kThreads / kChunksPerRow;
  static_assert(kEntriesPerPass == 4, "rows e and e + 4 alternate between two swizzles");
  const int c = tid % kChunksPerRow;
  const int first_entry = tid / kChunksPerRow;
  const bool fp8 = c < kNopeChunks;
  const int source = fp8 ? 8 * c : static_cast<int>(kNopeDim) + 16 * (c - kNopeChunks);
  // Rows e and e + 4 swizzle chunk c differently (e % 8 differs by 4); eight rows later the
  // pattern repeats one swizzle atom further.
  const uint32_t e_tile = shared_address(smem + kEOffset);
  const uint32_t target_even = e_tile + operand_chunk_offset(first_entry, c, kTile);
  const uint32_t target_odd =
      e_tile + operand_chunk_offset(first_entry + kEntriesPerPass, c, kTile);
  uint32_t nan_bits = 0;
#pragma unroll 4
  for (int i = 0; i < kTile / kEntriesPerPass; ++i) {
    const int e = first_entry + kEntriesPerPass * i;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (valid[e]) {
      const uint8_t* entry = raw + e * kEntryDataBytes;
      if (fp8) {
        const uint2 codes = *reinterpret_cast<const uint2*>(entry + source);
        const uint32_t scale_byte = raw_scales[e * kEntryScaleBytes + c / 8];
        nan_bits |= fp8_nan_bits(codes, scale_byte);
        value = dequantize_8(codes, scale_byte);
      } else {
        value = *reinterpret_cast<const uint4*>(entry + source);
      }
    }
    const uint32_t target = (i % 2 == 0 ? target_even : target_odd) + (i / 2) * kSwizzleAtomBytes;
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(target), "r"(value.x),
                 "r"(value.y), "r"(value.z), "r"(value.w)
                 : "memory");
  }
  return nan_bits != 0;
}

// The CTA's 64 query heads as bf16 rows (zero rows beyond Hq). bf16 q with 16-byte aligned rows
// goes by cp.async (committed with the first tile; queries_finite checks it once it has landed);
// other q is loaded four 8-value chunks at a time (one round trip per four chunks), converted to
// bf16, checked (a NaN or infinity marks the CTA bad) and stored.
__device__ void load_queries(const SparseDecodeProblem& p, int64_t n, int64_t head0, bool q_async,
                             bool q_vector, uint8_t* smem, int* bad, int tid) {
  uint8_t* q_tile = smem + kQOffset;
  constexpr int kJobs = kHeads * kChunksPerRow / kThreads;
  static_assert(kHeads * kChunksPerRow % kThreads == 0, "whole jobs per thread");
  if (q_async) {
    for (int i = 0; i < kJobs; ++i) {
      const int job = tid + i * kThreads;
      const int h = job / kChunksPerRow, c = job % kChunksPerRow;
      uint8_t* target = query_chunk(q_tile, h, c);
      if (head0 + h < p.num_heads) {
        cp_async_16(target, static_cast<const uint16_t*>(p.q.data) + n * p.q.row_stride +
                                (head0 + h) * p.q.head_stride + 8 * c);
      } else {
        *reinterpret_cast<uint4*>(target) = make_uint4(0, 0, 0, 0);
      }
    }
    return;
  }
  constexpr int kBatch = 4;
  bool finite = true;
  for (int batch = 0; batch < kJobs; batch += kBatch) {
    float x[kBatch][8];
#pragma unroll
    for (int b = 0; b < kBatch; ++b) {
      const int job = tid + (batch + b) * kThreads;
      const int h = job / kChunksPerRow, c = job % kChunksPerRow;
      const int64_t head = head0 + h;
      const int64_t offset = n * p.q.row_stride + head * p.q.head_stride + 8 * c;
      if (head >= p.num_heads) {
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
      const int job = tid + (batch + b) * kThreads;
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
// by the same thread after its wait, so no barrier is needed.
__device__ bool queries_finite(const uint8_t* smem, int tid) {
  const uint8_t* q_tile = smem + kQOffset;
  bool finite = true;
  for (int i = 0; i < kHeads * kChunksPerRow / kThreads; ++i) {
    const int job = tid + i * kThreads;
    const int h = job / kChunksPerRow, c = job % kChunksPerRow;
    const uint4 v =
        *reinterpret_cast<const uint4*>(query_chunk(const_cast<uint8_t*>(q_tile), h, c));
    // bf16x2_finite (bf16_pairs.h) written out: through the function, ptxas laid this loop out
    // with branches and Flash CSA lists ran 1.3-2.5% slower (H100, 2026-11-27).
    for (const uint32_t word : {v.x, v.y, v.z, v.w}) {
      finite = finite && (word & 0x7f80u) != 0x7f80u && (word & 0x7f800000u) != 0x7f800000u;
    }
  }
  return finite;
}

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
  float* stage;    // [64][kStageStride] fp32: the CTA's unnormalized O, over its operand tiles
  float* stat_m;   // [64] row maxima (log2 units)
  float* stat_l;   // [64] row sums
  int* bad;        // the CTA's invalid-row flag
  float* factors;  // [splits][64] each split's weight in the combined row
};

// The end of a CTA's slice: its partial result (row maxima and sums, unnormalized O) staged in
// its shared memory, then, across the row's cluster, the row's validity agreed on, the sink added
// once, lse written and this CTA's column slice of its group's heads finished from every split's
// partial. `o_half`: which 256 columns of O this thread's accumulators hold (-1: none);
// `holds_stats`: whether its row_max / row_sum are the CTA's softmax statistics. Every thread of
// the CTA calls it (it holds CTA and cluster barriers).
template <int kCtaThreads, bool kThroughWorkspace>
__device__ void finish_row(const SparseDecodeProblem& p, const SparsePlan& plan,
                           const CtaSpace& space, int64_t n, int tid, int o_half, bool holds_stats,
                           const float (&o)[128], const float (&row_max)[2], float (&row_sum)[2],
                           bool out_vector) {
  cg::cluster_group cluster = cg::this_cluster();
  const CtaRole role = cta_role<kThroughWorkspace>(plan);
  const int group = role.group, split = role.split;
  const int64_t head0 = int64_t{group} * kHeads;
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
  if (tid < kHeads && p.sink != nullptr && head0 + tid < p.num_heads) {
    const float sink = p.sink[(head0 + tid) * p.sink_stride];
    nan = nan || isnan(sink) || sink == INFINITY;  // the CPU's NaN results for such a sink
  }
  if (nan) *bad = 1;
  __syncthreads();  // the operand tiles are free for the staging
  if (o_half >= 0) {
#pragma unroll
    for (int i = 0; i < 128; i += 2) {
      const MatrixCoord at = wgmma_d_coord(thread, i);
      *reinterpret_cast<float2*>(stage + at.row * kStageStride + 256 * o_half + at.col) =
          make_float2(o[i], o[i + 1]);
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
  if constexpr (kThroughWorkspace) {
    // The row's other splits are CTAs of other clusters: the partial goes to the workspace for
    // sparse_decode_combine_kernel. The cluster (this split's head groups) still meets at the
    // end, since a shared conversion writes into the peer's shared memory.
    __syncthreads();  // the staged O, the statistics and the flag are complete
    const SparseWorkspaceLayout layout =
        sparse_workspace_layout(p.num_rows, plan.groups, plan.splits);
    const int64_t record = sparse_record(n, split, group, plan.splits, plan.groups);
    float4* o_record = reinterpret_cast<float4*>(p.workspace + layout.o_offset) +
                       record * (kSparseRecordHeads * kSparseRecordColumns / 4);
    for (int job = tid; job < kHeads * (kHeadDim / 4); job += kCtaThreads) {
      const int h = job / (kHeadDim / 4), quad = job % (kHeadDim / 4);
      o_record[job] = *reinterpret_cast<const float4*>(stage + h * kStageStride + 4 * quad);
    }
    float* stats =
        reinterpret_cast<float*>(p.workspace + layout.stats_offset) + record * 2 * kHeads;
    if (tid < kHeads) {
      stats[tid] = stat_m[tid];
      stats[kHeads + tid] = stat_l[tid];
    }
    if (tid == 0) reinterpret_cast<int*>(p.workspace + layout.flags_offset)[record] = *bad;
    cluster.sync();
    return;
  }
  cluster.sync();  // every CTA's partials and flag are visible cluster-wide

  // ---- combine: the row's validity, then this CTA's column slice of its group's heads -------
  int row_bad = 0;
  for (int r = 0; r < plan.cluster(); ++r)
    row_bad |= *cluster.map_shared_rank(bad, r);
  if (tid < kHeads) {
    const int h = tid;
    float top = -INFINITY;
    for (int s = 0; s < plan.splits; ++s)
      top = fmaxf(top, cluster.map_shared_rank(stat_m, s * plan.groups + group)[h]);
    const bool has_head = head0 + h < p.num_heads;
    const float sink =
        p.sink != nullptr && has_head ? p.sink[(head0 + h) * p.sink_stride] * kLog2e : -INFINITY;
    const float list_top = top;
    top = fmaxf(top, sink);
    float lse = -INFINITY;
    if (top == -INFINITY) {  // empty list and no sink: o = 0, lse = -inf
      for (int s = 0; s < plan.splits; ++s)
        factors[s * kHeads + h] = 0.0f;
    } else {
      float denominator = exp2f(sink - top);
      for (int s = 0; s < plan.splits; ++s) {
        const int peer = s * plan.groups + group;
        const float weight = exp2f(cluster.map_shared_rank(stat_m, peer)[h] - top);
        denominator += cluster.map_shared_rank(stat_l, peer)[h] * weight;
        factors[s * kHeads + h] = weight;
      }
      for (int s = 0; s < plan.splits; ++s)
        factors[s * kHeads + h] /= denominator;
      // An empty list leaves the sink alone in the denominator: lse is the sink itself, not
      // its round trip through log2 units.
      lse = list_top == -INFINITY ? p.sink[(head0 + h) * p.sink_stride]
                                  : (top + log2f(denominator)) * kLn2;
    }
    if (!p.lse_includes_sink) {  // log of the list's own sum (FlashMLA's lse)
      float list_sum = 0.0f;
      for (int s = 0; s < plan.splits; ++s) {
        const int peer = s * plan.groups + group;
        list_sum += cluster.map_shared_rank(stat_l, peer)[h] *
                    exp2f(cluster.map_shared_rank(stat_m, peer)[h] - list_top);
      }
      lse = list_top == -INFINITY ? -INFINITY : (list_top + log2f(list_sum)) * kLn2;
    }
    if (split == 0 && has_head && p.lse != nullptr) {
      p.lse[n * p.lse_row_stride + (head0 + h) * p.lse_head_stride] = row_bad ? NAN : lse;
    }
  }
  __syncthreads();  // factors are complete

  // Each thread sums four columns of one head over the splits: every split's partial is loaded
  // (distributed shared memory) before any is used, then four values are stored at once. The
  // split finishes its combine_slice of every head's columns.
  const CombineSlice slice = combine_slice(split, plan.splits);
  // The arrays below are unrolled over the most splits the plan allows: 8 unless the row's
  // cluster is one of the non-portable 16, whose longer loops cost the others 1-4% on an H100.
  auto combine = [&](auto max_splits) {
    constexpr int kMaxSplits = decltype(max_splits)::value;
    const float* peer_stage[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) {
      peer_stage[s] =
          s < plan.splits ? cluster.map_shared_rank(stage, s * plan.groups + group) : stage;
    }
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
  };
  if (plan.splits <= kSparseMaxCluster) {
    combine(std::integral_constant<int, kSparseMaxCluster>());
  } else {
    combine(std::integral_constant<int, kSparseMaxWideCluster>());
  }
  if (split == 0 && group == 0 && tid == 0 && row_bad) count_invalid(p.invalid_count, 1);
  cluster.sync();  // no CTA leaves while a peer may still read its shared memory
}

// ---- combine of splits through the workspace --------------------------------------------------
constexpr int kCombineThreads = 256;

// Finishes column slice `slice` of `slices` of one head group of one row from the partial results
// its splits left in the workspace: the row's validity (every CTA's flag, which includes its
// heads' sinks), each split's weight per head, lse, then each output column summed over the
// splits in split order. The same arithmetic as finish_row's.
__global__ void __launch_bounds__(kCombineThreads)
    sparse_decode_combine_kernel(SparseDecodeProblem p, SparsePlan plan, int slices,
                                 bool out_vector) {
  __shared__ float factors[kSparseMaxWorkspaceSplits][kHeads];
  hdk::detail::wait_for_prior_grid();  // the splits' partial results
  const int tid = threadIdx.x;
  const int slice = static_cast<int>(blockIdx.x % slices);
  const int group = static_cast<int>((blockIdx.x / slices) % plan.groups);
  const int64_t n = blockIdx.x / (static_cast<int64_t>(slices) * plan.groups);
  const int64_t head0 = int64_t{group} * kHeads;
  const SparseWorkspaceLayout layout =
      sparse_workspace_layout(p.num_rows, plan.groups, plan.splits);
  const float* o_records = reinterpret_cast<const float*>(p.workspace + layout.o_offset);
  const float* stats = reinterpret_cast<const float*>(p.workspace + layout.stats_offset);
  const int* flags = reinterpret_cast<const int*>(p.workspace + layout.flags_offset);
  auto record = [&](int split) { return sparse_record(n, split, group, plan.splits, plan.groups); };

  int bad = 0;
  for (int r = tid; r < plan.row_ctas(); r += kCombineThreads)
    bad |= flags[n * plan.row_ctas() + r];
  const bool row_bad = __syncthreads_or(bad) != 0;

  if (tid < kHeads) {
    const int h = tid;
    float top = -INFINITY;
    for (int s = 0; s < plan.splits; ++s)
      top = fmaxf(top, stats[record(s) * 2 * kHeads + h]);
    const bool has_head = head0 + h < p.num_heads;
    const float sink =
        p.sink != nullptr && has_head ? p.sink[(head0 + h) * p.sink_stride] * kLog2e : -INFINITY;
    const float list_top = top;
    top = fmaxf(top, sink);
    float lse = -INFINITY;
    if (top == -INFINITY) {
      for (int s = 0; s < plan.splits; ++s)
        factors[s][h] = 0.0f;
    } else {
      float denominator = exp2f(sink - top);
      for (int s = 0; s < plan.splits; ++s) {
        const float* stat = stats + record(s) * 2 * kHeads;
        const float weight = exp2f(stat[h] - top);
        denominator += stat[kHeads + h] * weight;
        factors[s][h] = weight;
      }
      for (int s = 0; s < plan.splits; ++s)
        factors[s][h] /= denominator;
      lse = list_top == -INFINITY ? p.sink[(head0 + h) * p.sink_stride]
                                  : (top + log2f(denominator)) * kLn2;
    }
    if (!p.lse_includes_sink) {
      float list_sum = 0.0f;
      for (int s = 0; s < plan.splits; ++s) {
        const float* stat = stats + record(s) * 2 * kHeads;
        list_sum += stat[kHeads + h] * exp2f(stat[h] - list_top);
      }
      lse = list_top == -INFINITY ? -INFINITY : (list_top + log2f(list_sum)) * kLn2;
    }
    if (slice == 0 && has_head && p.lse != nullptr) {
      p.lse[n * p.lse_row_stride + (head0 + h) * p.lse_head_stride] = row_bad ? NAN : lse;
    }
  }
  __syncthreads();  // factors are complete

  const int quads = static_cast<int>(kHeadDim / 4) / slices;  // column quads of the slice
  for (int job = tid; job < kHeads * quads; job += kCombineThreads) {
    const int h = job / quads;
    const int col = 4 * (slice * quads + job % quads);
    const int64_t head = head0 + h;
    if (head >= p.num_heads) continue;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!row_bad) {
#pragma unroll 4
      for (int s = 0; s < plan.splits; ++s) {
        const float4 v =
            *reinterpret_cast<const float4*>(o_records + (record(s) * kHeads + h) * kHeadDim + col);
        const float f = factors[s][h];
        sum.x += f * v.x, sum.y += f * v.y, sum.z += f * v.z, sum.w += f * v.w;
      }
    }
    store_output4(p, n * p.out_row_stride + head * p.out_head_stride + col, sum, out_vector);
  }
  if (slice == 0 && group == 0 && tid == 0 && row_bad) count_invalid(p.invalid_count, 1);
}

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

// ---- tensor-core kernel -----------------------------------------------------------------------

template <bool kWide, bool kThroughWorkspace>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_decode_mma_kernel(SparseDecodeProblem p, SparsePlan plan, bool q_vector,
                             bool out_vector) {
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  // wgmma swizzles by shared-address bits, so the operand tiles start on a 1024-byte boundary.
  uint8_t* smem =
      shared_bytes +
      (kSwizzleAtomBytes - shared_address(shared_bytes) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
  cg::cluster_group cluster = cg::this_cluster();
  const CtaRole role = cta_role<kThroughWorkspace>(plan);
  const int64_t n = role.n;
  const int group = role.group, split = role.split;
  const int64_t head0 = int64_t{group} * kHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int half = warp / 4;     // the warpgroup: its half of S's dims and of O's columns
  const int thread = tid % 128;  // in the warpgroup (wgmma_d_coord)

  int* valid = reinterpret_cast<int*>(smem + kValidOffset);
  float* stat_m = reinterpret_cast<float*>(smem + kStatOffset);
  float* stat_l = stat_m + kHeads;
  int* bad = reinterpret_cast<int*>(smem + kBadOffset);
  float* factors = reinterpret_cast<float*>(smem + kFactorOffset);

  if (tid == 0) *bad = 0;
  __syncthreads();

  const int64_t tiles = (p.list_length() + kTile - 1) / kTile;
  const int64_t first = split_first_tile(tiles, split, plan.splits);
  const int64_t last = split_first_tile(tiles, split + 1, plan.splits);
  const bool q_async = q_vector && p.q.dtype != DType::kFloat32;
  EntrySource next_source;
  if (first < last) next_source = resolve_entry(p, n, first, bad, warp, lane);
  load_queries(p, n, head0, q_async, q_vector, smem, bad, tid);
  if (first < last) issue_tile<kWide>(next_source, smem, valid + (first & 1) * kTile, warp, lane);
  cp_async_commit();

  const uint32_t q_tile = shared_address(smem + kQOffset);
  const uint32_t e_tile = shared_address(smem + kEOffset);
  float* exchange = reinterpret_cast<float*>(smem + kExchangeOffset);
  // Scores are kept in log2 units: s * scale * log2(e), so exp2 gives the softmax weights.
  const float score_scale = p.scale * kLog2e;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this thread's share; summed over the quad at the end
  float o[128];                     // O's columns 256 half .. as wgmma_d_coord places them
#pragma unroll
  for (int i = 0; i < 128; ++i)
    o[i] = 0.0f;

  for (int64_t t = first; t < last; ++t) {
    const int* tile_valid = valid + (t & 1) * kTile;
    // The next tile's slots, resolved while this tile lands and the last O product runs.
    if (t + 1 < last) next_source = resolve_entry(p, n, t + 1, bad, warp, lane);
    cp_async_wait<0>();
    wgmma_wait<0>();  // the last tile's O = P E no longer reads E
    __syncthreads();  // the raw tile has landed in every thread's view; E is free
    if (dequantize_tile(smem, tile_valid, tid)) *bad = 1;
    fence_shared_for_wgmma();
    __syncthreads();  // E is complete (and Q, on the first tile); the raw buffer is free
    if (t + 1 < last) {
      issue_tile<kWide>(next_source, smem, valid + ((t + 1) & 1) * kTile, warp, lane);
    }
    cp_async_commit();

    // This warpgroup's half of S = Q E^T (64 heads x 64 entries, dims 256 half .. + 255).
    float s[kScoreRegisters];
#pragma unroll
    for (int i = 0; i < kScoreRegisters; ++i)
      s[i] = 0.0f;
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      wgmma_m64n64k16(s, wgmma_descriptor(q_tile, scores_operand(16 * half + k, kHeads)),
                      wgmma_descriptor(e_tile, scores_operand(16 * half + k, kTile)), k > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    // The other half through shared memory: the same thread of the other warpgroup holds the
    // same elements, and a + b == b + a, so both warpgroups hold the same S bit for bit.
#pragma unroll
    for (int i = 0; i < kScoreRegisters; ++i)
      exchange[(half * kScoreRegisters + i) * 128 + thread] = s[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kScoreRegisters; ++i)
      s[i] += exchange[((1 - half) * kScoreRegisters + i) * 128 + thread];

    float alpha[2];
    uint32_t weights[kTile / 16][4];
    softmax_tile(s, tile_valid, thread, score_scale, row_max, row_sum, o, alpha, weights);
    constexpr int kSteps = kTile / 16;

    // O += P E over this warpgroup's 256 columns; waited for before E is next rewritten.
    wgmma_fence();
#pragma unroll
    for (int k = 0; k < kSteps; ++k) {
      wgmma_m64n256k16_a_registers(o, weights[k],
                                   wgmma_descriptor(e_tile, outputs_operand(half, k, kTile)));
    }
    wgmma_commit();
  }
  wgmma_wait<0>();
  cp_async_wait<0>();
  if (q_async && !queries_finite(smem, tid)) *bad = 1;
  const CtaSpace space{reinterpret_cast<float*>(smem + kStageOffset), stat_m, stat_l, bad, factors};
  finish_row<kThreads, kThroughWorkspace>(p, plan, space, n, tid, half, half == 0, o, row_max,
                                          row_sum, out_vector);
}

// ---- warp-specialized tensor-core kernel --------------------------------------------------------
// Three warpgroups and two E stages, so the dequantization of one tile runs while the tensor cores
// multiply the one before it (the mma kernel above runs them one after the other on 8 warps):
// - warpgroup 2, the producer, loads each tile's stored bytes, one pass (or, with two head
//   groups, every other tile) into registers and the other into a raw pass in shared memory
//   (cp.async: a use of a loaded register would also wait for every load issued after it),
//   dequantizes them into E stage t % 2 and signals it full; the next tile's bytes are loaded
//   while this one is converted;
// - warpgroup 0 computes the whole S = Q E^T (64 heads x 64 entries over all 512 dims, so no
//   partial S is exchanged), runs the online softmax, hands P (bf16) and the rows' rescale
//   factors to warpgroup 1 through shared memory and computes O's columns 0..255 with P from its
//   registers;
// - warpgroup 1 rescales and computes O's columns 256..511 with P read from shared memory.
// Handshakes are shared-memory barriers (mbarrier.cuh), every thread of the signalling side
// arriving: stage full (the producer arrives, both consumers wait), stage empty (both consumers
// arrive, the producer waits before refilling it), P ready and P free between the consumers, Q
// ready for warpgroup 0, and warpgroup 0's registers given back (before the others take theirs
// back).
// With two head groups (Hq 65..128, kSharedConversion) the two CTAs of a row slice read the same
// entries, so each converts half of every tile (entries 32 g .. 32 g + 31 for group g) and copies
// its rows into the other's stage (cp.async.bulk between the CTAs' shared memories, the bytes
// completing on the receiver's full barrier); the receiver's consumers also arrive, once a
// warpgroup, on the sender's empty barrier, since the sender refills both copies of a stage.
constexpr int kPipelinedThreads = 384;
constexpr int kPipelinedStages = 2;
constexpr int kProducerThread0 = 256;  // warpgroup 2

// Shared memory (byte offsets from a 1024-byte boundary).
constexpr int kPipeQOffset = kQOffset;                // where load_queries puts Q
constexpr int kPipeEOffset = kPipeQOffset + kQBytes;  // [2 stages] E tiles
constexpr int kPipePOffset = kPipeEOffset + kPipelinedStages * kEBytes;  // P, 64 x 64 bf16
constexpr int kPipePBytes = operand_block_bytes(kHeads);
constexpr int kPipeAlphaOffset = kPipePOffset + kPipePBytes;     // [64] rescale factors
constexpr int kPipeValidOffset = kPipeAlphaOffset + kHeads * 4;  // [2 stages][64] int
constexpr int kPipeStatOffset = kPipeValidOffset + kPipelinedStages * kTile * 4;  // m, l
constexpr int kPipeBadOffset = kPipeStatOffset + 2 * kHeads * 4;
constexpr int kPipeFactorOffset = kPipeBadOffset + 16;
constexpr int kPipeBarrierOffset = kPipeFactorOffset + kSparseMaxWideCluster * kHeads * 4;
constexpr int kPipeBarriers = 2 * kPipelinedStages + 4;  // PipelineBarriers
// One pass of a tile as stored (32 entries of kRawEntryStride bytes: data, then the 8 scale
// bytes), where the producer lands the bytes it does not load into registers (copy_share_async):
// pass 1 of the next tile, or with a shared conversion every odd tile.
constexpr int kPipeRawOffset = (kPipeBarrierOffset + kPipeBarriers * 8 + 15) / 16 * 16;
constexpr int kPipeUsedBytes = kPipeRawOffset + 32 * kRawEntryStride;
// What a CTA's full barrier expects from the peer per tile with a shared conversion: half the
// stage's rows and half its real-entry flags.
constexpr uint32_t kSharedBytesFromPeer = kEBytes / 2 + kTile / 2 * 4;
static_assert(kPipeValidOffset % 16 == 0, "bulk copies of the flags need 16-byte alignment");
static_assert(kSharedBytesFromPeer % 128 == 0, "each producer thread expects an equal share");
constexpr int kPipelinedSharedBytes = kPipeUsedBytes + kSwizzleAtomBytes;
static_assert(kHeads * kStageStride * 4 <= kPipePOffset, "O staging overlaps");
static_assert(kPipelinedSharedBytes <= 227 * 1024, "shared memory beyond an SM's");
static_assert(kPipePOffset % kSwizzleAtomBytes == 0, "P is a swizzled operand tile");
static_assert(kPipeBarrierOffset % 8 == 0, "an mbarrier is 8-byte aligned");
static_assert(kRawEntryStride % 16 == 0 && kRawEntryStride >= kEntryDataBytes + kEntryScaleBytes,
              "a raw entry holds its data and scale bytes at 16-byte alignment");

// Registers per thread of each warpgroup after setmaxnreg: the launch gives every thread 168
// (65536 / 384, rounded down to 8) and the three counts may not add up to more than 3 x 168.
constexpr int kLaunchRegisters = 168;
constexpr int kScoreRegistersCap = 208;  // S (32) + O (128) + P fragments (16)
constexpr int kOutputRegistersCap = 160;
constexpr int kProducerRegistersCap = 136;
static_assert(kScoreRegistersCap + kOutputRegistersCap + kProducerRegistersCap <=
                  3 * kLaunchRegisters,
              "the warpgroups' registers exceed what the launch gave the CTA");

// The handshakes' barriers (kPipeBarrierOffset) and who arrives on each, every thread once per
// phase: one arrival a warp after __syncwarp would order the same accesses, but racecheck credits
// an arrival with its own thread's accesses only and then reports the stage's real-entry flags.
struct PipelineBarriers {
  uint64_t* full;            // [stage] the producer
  uint64_t* empty;           // [stage] both consumers
  uint64_t* p_ready;         // warpgroup 0
  uint64_t* p_free;          // warpgroup 1
  uint64_t* queries_ready;   // both consumers: Q loaded, checked, fenced
  uint64_t* registers_back;  // warpgroup 0, back at the launch's register count
};
__device__ __forceinline__ PipelineBarriers pipeline_barriers(uint8_t* smem) {
  uint64_t* base = reinterpret_cast<uint64_t*>(smem + kPipeBarrierOffset);
  uint64_t* single = base + 2 * kPipelinedStages;  // the barriers without a stage
  return {base, base + kPipelinedStages, single, single + 1, single + 2, single + 3};
}
// `shared_conversion`: the peer CTA's half of each stage arrives by bulk copies (bytes on the
// full barrier, expected by this CTA's producer), and each of its two consumer warpgroups
// arrives once on the empty barrier when it no longer reads its own copy of the stage.
__device__ __forceinline__ void init_pipeline_barriers(const PipelineBarriers& barriers,
                                                       bool shared_conversion) {
  for (int stage = 0; stage < kPipelinedStages; ++stage) {
    mbarrier_init(barriers.full + stage, 128);
    mbarrier_init(barriers.empty + stage, 2 * 128 + (shared_conversion ? 2 : 0));
  }
  mbarrier_init(barriers.p_ready, 128);
  mbarrier_init(barriers.p_free, 128);
  mbarrier_init(barriers.queries_ready, 2 * 128);
  mbarrier_init(barriers.registers_back, 128);
}
template <int kRegisters>
__device__ __forceinline__ void raise_registers() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void lower_registers() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// One producer thread's share of one entry: output chunks producer_chunk(quarter, j), j < 16, of
// E's row (sparse_decode_layout.h; j < 14: FP8 chunks, 8 codes each, two per 16 stored bytes;
// j = 14, 15: RoPE chunks), as stored. Quarters 0..3 of an entry are lanes l, l + 8, l + 16,
// l + 24 of a warp, so a 16-byte load instruction reads 64 contiguous bytes of each of 8 entries.
constexpr int kProducerFp8Chunks = static_cast<int>(kNopeDim / 8) / 4;  // 14
struct EntryShare {
  uint4 codes[kProducerFp8Chunks / 2];  // chunks 2 k and 2 k + 1 of the thread's share
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

// listed_slot, loaded where it is written (load_now_8) and kept as loaded: converting an int32
// slot to int64 right after the load would wait for it there. slot_value converts it at its use.
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
  // 16 bytes at 16 (quarter + 4 k) of the FP8 codes: chunks producer_chunk(quarter, 2 k) and
  // producer_chunk(quarter, 2 k + 1); 32 bytes at 32 quarter of the RoPE values.
  auto load_16 = [&](const uint8_t* source) {
    if (kWide) return load_now_16(source);
    const uint2 lo = load_now_8(source);
    const uint2 hi = load_now_8(source + 8);
    return make_uint4(lo.x, lo.y, hi.x, hi.y);
  };
#pragma unroll
  for (int k = 0; k < kProducerFp8Chunks / 2; ++k)
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
  for (int k = 0; k < kProducerFp8Chunks / 2; ++k)
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
  for (int k = 0; k < kProducerFp8Chunks / 2; ++k)
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

// The share's chunks as bf16 into row `entry` of the E stage at shared address `stage` (zeros
// for an entry that is not real); returns, for a real entry, nonzero where a code is an FP8 NaN
// or a scale byte the NaN scale (what fp8_nan_bits finds, accumulated with fewer instructions).
__device__ __forceinline__ uint32_t store_share(const EntryShare& share, bool real, uint32_t stage,
                                                int entry, int quarter) {
  const uint32_t row = static_cast<uint32_t>(entry) * 128;
  // Chunk producer_chunk(quarter, j) lies at chunk (2 quarter + j % 2) ^ (entry % 8) of block
  // j / 2 (producer_chunk_offset): two swizzled positions serve all sixteen.
  const uint32_t swizzled[2] = {static_cast<uint32_t>(((2 * quarter) ^ (entry % 8)) * 16),
                                static_cast<uint32_t>(((2 * quarter + 1) ^ (entry % 8)) * 16)};
  auto store = [&](int j, uint4 value) {
    const uint32_t offset = row + (j / 2) * operand_block_bytes(kTile) + swizzled[j % 2];
    asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(stage + offset), "r"(value.x),
                 "r"(value.y), "r"(value.z), "r"(value.w)
                 : "memory");
  };
  auto scale_of = [&](int j) {  // chunk producer_chunk(quarter, j)'s scale group is j / 2
    const int group = j / 2;
    return ((group < 4 ? share.scales.x : share.scales.y) >> (8 * (group % 4))) & 0xffu;
  };
  // Bit 7 of a byte ends up set where (code & 0x7f) + 1 carries into it, that is for the codes
  // 0x7f and 0xff (e4m3_nan_flags); the other bits collect garbage and are masked at the end.
  auto codes_of = [&](int j) {
    const uint4 pair = share.codes[j / 2];
    return j % 2 == 0 ? make_uint2(pair.x, pair.y) : make_uint2(pair.z, pair.w);
  };
  uint32_t nan_sum = 0;
  auto add_nan_flags = [&](uint2 codes) {
    nan_sum |= ((codes.x & 0x7f7f7f7fu) + 0x01010101u) | ((codes.y & 0x7f7f7f7fu) + 0x01010101u);
  };
  // The 7 scale bytes (the 8th is padding) decide, for the whole warp, whether one multiply a
  // pair is exact; the other path is for scales above 2^7.
  uint32_t top = __vmaxu4(share.scales.x, share.scales.y & 0x00ffffffu);
  top = __vmaxu4(top, top >> 16);
  top = __vmaxu4(top, top >> 8) & 0xffu;
  if (__all_sync(kFullMask, !real || top <= kOneMultiplyMaxScale)) {
#pragma unroll
    for (int j = 0; j < kProducerFp8Chunks; ++j) {
      add_nan_flags(codes_of(j));
      store(j, dequantize_8_by(codes_of(j), real ? one_multiply_factor(scale_of(j)) : 0u));
    }
  } else {
    const uint32_t up = kBf16TwoTo120 * 0x10001u;
#pragma unroll
    for (int j = 0; j < kProducerFp8Chunks; ++j) {
      add_nan_flags(codes_of(j));
      const uint4 placed = dequantize_8_by(codes_of(j), up);  // the values, exact
      const uint32_t scale = real ? ue8m0_as_bf16(scale_of(j)) * 0x10001u : 0u;
      store(j, make_uint4(mul_bf16x2(placed.x, scale), mul_bf16x2(placed.y, scale),
                          mul_bf16x2(placed.z, scale), mul_bf16x2(placed.w, scale)));
    }
  }
#pragma unroll
  for (int k = 0; k < 2; ++k) {  // RoPE chunks 56 + 2 quarter + k, copied
    const uint4 value = share.rope[k];
    store(kProducerFp8Chunks + k, real ? value : make_uint4(0, 0, 0, 0));
  }
  // A scale byte 0xff is a zero byte of its complement (the padding byte's complement is 0xff).
  auto has_zero_byte = [](uint32_t v) { return (v - 0x01010101u) & ~v & 0x80808080u; };
  const uint32_t nan_scales =
      has_zero_byte(~share.scales.x) | has_zero_byte(~(share.scales.y & 0x00ffffffu));
  return real ? (nan_sum & 0x80808080u) | nan_scales : 0u;
}

template <bool kWide, bool kSharedConversion, bool kThroughWorkspace>
__global__ void __launch_bounds__(kPipelinedThreads, 1)
    sparse_decode_pipelined_kernel(SparseDecodeProblem p, SparsePlan plan, bool q_vector,
                                   bool out_vector) {
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  uint8_t* smem =
      shared_bytes +
      (kSwizzleAtomBytes - shared_address(shared_bytes) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
  cg::cluster_group cluster = cg::this_cluster();
  const CtaRole role = cta_role<kThroughWorkspace>(plan);
  const int64_t n = role.n;
  const int group = role.group, split = role.split;
  const int64_t head0 = int64_t{group} * kHeads;
  const int tid = threadIdx.x, lane = tid % 32;
  const int warpgroup = tid / 128;
  const int thread = tid % 128;  // in the warpgroup

  int* valid = reinterpret_cast<int*>(smem + kPipeValidOffset);
  float* alpha_shared = reinterpret_cast<float*>(smem + kPipeAlphaOffset);
  int* bad = reinterpret_cast<int*>(smem + kPipeBadOffset);
  const CtaSpace space{reinterpret_cast<float*>(smem + kStageOffset),
                       reinterpret_cast<float*>(smem + kPipeStatOffset),
                       reinterpret_cast<float*>(smem + kPipeStatOffset) + kHeads, bad,
                       reinterpret_cast<float*>(smem + kPipeFactorOffset)};
  const PipelineBarriers barriers = pipeline_barriers(smem);
  // With kSharedConversion (two head groups) each CTA converts half of every tile for itself
  // and for its peer, the CTA of the other group walking the same slice: a stage is full once
  // this CTA's producer has arrived and the peer's half has landed, and empty once this CTA's
  // consumers and the peer's have let it go.
  const int peer = kThroughWorkspace ? 1 - group : split * plan.groups + (1 - group);
  if (tid == 0) {
    *bad = 0;
    init_pipeline_barriers(barriers, kSharedConversion);
  }
  if (kSharedConversion) {
    cluster.sync();  // the peer's barriers are initialized before this CTA arrives on them
  } else {
    __syncthreads();
  }

  const int64_t tiles = (p.list_length() + kTile - 1) / kTile;
  const int64_t first = split_first_tile(tiles, split, plan.splits);
  const int64_t count = split_first_tile(tiles, split + 1, plan.splits) - first;
  const uint32_t e_tiles = shared_address(smem + kPipeEOffset);
  // Tile i's phase of its stage's barriers: full completes once per tile of the stage; empty
  // once per tile that a later tile of the stage follows (tile i waits for tile i - 2's).
  auto full_parity = [](int64_t i) { return static_cast<uint32_t>((i >> 1) & 1); };
  auto empty_parity = [](int64_t i) { return static_cast<uint32_t>(((i >> 1) + 1) & 1); };
  auto stage_address = [&](int64_t i) { return e_tiles + static_cast<uint32_t>(i & 1) * kEBytes; };
  float o[128];
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};
  const bool q_async = q_vector && p.q.dtype != DType::kFloat32;

  if (warpgroup == 2) {
    // ---- producer -----------------------------------------------------------------------------
    lower_registers<kProducerRegistersCap>();
    const int producer_warp = (tid - kProducerThread0) / 32;
    const int quarter = lane / 8;
    // Entries pass * 32 + entry_in_pass of each tile.
    const int entry_in_pass = producer_warp * 8 + lane % 8;
    auto entry_index = [&](int64_t i, int pass) {
      return (first + i) * kTile + pass * 32 + entry_in_pass;
    };
    const hdk::detail::FastDivide pages[2] = {
        hdk::detail::FastDivide(static_cast<uint32_t>(p.cache.block_size)),
        hdk::detail::FastDivide(
            static_cast<uint32_t>(p.extra_cache.block_size > 0 ? p.extra_cache.block_size : 1))};
    // The launcher runs this kernel only where one of the pools has a slot (and none has 2^31).
    const PagedPool& dummy_pool = p.cache.num_slots() > 0 ? p.cache : p.extra_cache;
    const ProducerEntry dummy{dummy_pool.data,
                              dummy_pool.data + dummy_pool.block_size * kEntryDataBytes, false};
    // Entry `pass * 32 + entry_in_pass` of tile t, whose slot is `slot`.
    auto entry_of = [&](int64_t t, int pass, const LoadedSlot& slot) {
      return producer_entry(p, entry_index(t, pass), slot_value(slot), pages, dummy, bad);
    };
    EntryShare share;  // the bytes that come through registers (raw pass: the others)
    bool real[2];
    uint32_t nan_bits = 0;
    if constexpr (kSharedConversion) {
      // Pass `group` of every tile: converted into this CTA's stage, from where each warp's rows
      // and real-entry flags go to the peer's stage by bulk copies (cp.async.bulk, completing
      // bytes on the peer's full barrier). Two tiles' bytes are in flight behind the conversion
      // (below: one in registers, one in the raw pass).
      const int pass = group;
      const int entry = pass * 32 + entry_in_pass;
      const uint32_t valid_flags = shared_address(valid);
      // A CTA's shared memory is one range of the cluster's shared window, so the peer's copy
      // of any of this CTA's variables lies one distance away (one register, not three).
      const uint32_t to_peer = cluster_shared_address(e_tiles, peer) - e_tiles;
      // This warp's 8 rows in each of the 8 column blocks of a stage, and its 8 flags.
      const uint32_t warp_rows = static_cast<uint32_t>(pass * 32 + producer_warp * 8);
      // Even tiles come through registers (share), odd tiles through this thread's row of the
      // raw pass (copy_share_async), each requested two tiles before it is converted. An even
      // step locates the entries of both next tiles (t + 2 and t + 3) from slots loaded two
      // tiles earlier, so that an odd step uses no loaded register: the use of one would also
      // wait for the even tile's loads issued just before it (see copy_share_async).
      uint8_t* raw = smem + kPipeRawOffset + entry_in_pass * kRawEntryStride;
      LoadedSlot slot_ahead[2];         // at an even tile t, the slots of tiles t + 2 and t + 3
      ProducerEntry odd_ahead = dummy;  // from an even tile t on, tile t + 3's entry
      if (count > 0) {
        const LoadedSlot first_slots[2] = {load_slot_now(p, n, entry_index(0, pass)),
                                           load_slot_now(p, n, entry_index(1, pass))};
        slot_ahead[0] = load_slot_now(p, n, entry_index(2, pass));
        slot_ahead[1] = load_slot_now(p, n, entry_index(3, pass));
        // Tile 1 of a one-tile slice: the next slice's entries (or past the list), unused.
        const ProducerEntry first_entries[2] = {entry_of(0, pass, first_slots[0]),
                                                entry_of(1, pass, first_slots[1])};
        real[0] = first_entries[0].real;
        real[1] = first_entries[1].real;
        load_share<kWide>(first_entries[0], quarter, share);
        copy_share_async<kWide>(first_entries[1], quarter, raw);
        cp_async_commit();
      }
      // Tile t, whose stage is t % 2 (`slot`).
      auto step = [&](int64_t t, int slot) {
        ProducerEntry even_ahead = dummy;
        if (slot == 0) {
          even_ahead = entry_of(t + 2, pass, slot_ahead[0]);
          odd_ahead = entry_of(t + 3, pass, slot_ahead[1]);
          slot_ahead[0] = load_slot_now(p, n, entry_index(t + 4, pass));
          slot_ahead[1] = load_slot_now(p, n, entry_index(t + 5, pass));
        }
        if (t >= kPipelinedStages) mbarrier_wait(barriers.empty + slot, empty_parity(t));
        if (slot == 0) {
          nan_bits |= store_share(share, real[0], stage_address(t), entry, quarter);
        } else {
          cp_async_wait<0>();
          __syncwarp();  // quarter 0's copy of the entry's scale bytes has landed
          nan_bits |=
              store_share(read_share(raw, quarter), real[1], stage_address(t), entry, quarter);
        }
        if (quarter == 0) valid[slot * kTile + entry] = real[slot] ? 1 : 0;
        fence_shared_for_wgmma();  // for this CTA's wgmma and for the bulk copies
        __syncwarp();  // (and every quarter has read the raw scale bytes quarter 0 copies next)
        const uint32_t full = shared_address(barriers.full + slot);
        if (lane == 0) {
#pragma unroll
          for (int block = 0; block < 8; ++block) {
            const uint32_t offset = static_cast<uint32_t>(slot) * kEBytes +
                                    block * operand_block_bytes(kTile) + warp_rows * 128;
            bulk_copy_to_peer(e_tiles + offset + to_peer, e_tiles + offset, 8 * 128,
                              full + to_peer);
          }
          const uint32_t flags = (static_cast<uint32_t>(slot) * kTile + warp_rows) * 4;
          bulk_copy_to_peer(valid_flags + flags + to_peer, valid_flags + flags, 8 * 4,
                            full + to_peer);
        }
        // The copies have read this stage before it is refilled: that waits for the peer's
        // consumers, who wait for the copies to land.
        // Every producer thread expects its share of the peer's bytes: no thread is singled
        // out by a branch (a branch on the thread index here waited on a spilled register).
        mbarrier_arrive_expect_bytes(barriers.full + slot, kSharedBytesFromPeer / 128);
        if (t + 2 < count) {
          if (slot == 0) {
            real[0] = even_ahead.real;
            load_share<kWide>(even_ahead, quarter, share);
          } else {
            real[1] = odd_ahead.real;
            copy_share_async<kWide>(odd_ahead, quarter, raw);
            cp_async_commit();
          }
        }
      };
      for (int64_t t = 0; t < count; t += 2) {
        step(t, 0);
        if (t + 1 < count) step(t + 1, 1);
      }
    } else {
      // Pass 0 of a tile comes through registers (share), pass 1 through this thread's row
      // of the raw pass (copy_share_async), each requested once the previous tile's pass has
      // been converted, so that a tile's two waits are for bytes a tile old.
      uint8_t* raw = smem + kPipeRawOffset + entry_in_pass * kRawEntryStride;
      LoadedSlot slot_ahead[2];  // the slots of tile i + 1, loaded a tile early
      if (count > 0) {
        // The first two tiles' slots in one round trip, then the first tile's bytes.
        LoadedSlot first_slots[2];
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {
          first_slots[pass] = load_slot_now(p, n, entry_index(0, pass));
          slot_ahead[pass] = load_slot_now(p, n, entry_index(1, pass));
        }
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {
          const ProducerEntry entry = entry_of(0, pass, first_slots[pass]);
          real[pass] = entry.real;
          if (pass == 0) {
            load_share<kWide>(entry, quarter, share);
          } else {
            copy_share_async<kWide>(entry, quarter, raw);
            cp_async_commit();
          }
        }
      }
      for (int64_t i = 0; i < count; ++i) {
        const int stage = static_cast<int>(i & 1);
        // Tile i + 1's entries and tile i + 2's slots without a branch: past the slice they are
        // the next slice's (or past the list) and go unused; a slot of the row beyond its cache
        // marks the row bad in whichever CTA of its cluster finds it.
        ProducerEntry next[2];
#pragma unroll
        for (int pass = 0; pass < 2; ++pass) {
          next[pass] = entry_of(i + 1, pass, slot_ahead[pass]);
          slot_ahead[pass] = load_slot_now(p, n, entry_index(i + 2, pass));
        }
        if (i >= kPipelinedStages) mbarrier_wait(barriers.empty + stage, empty_parity(i));
        // The next tile's bytes are requested once this tile's pass is converted: pass 0's
        // while pass 1 converts, pass 1's after the stage is signalled full, so that the fence
        // and the signal do not wait behind copies just issued (on an H100, loading pass 1
        // before the signal was 4-5% slower on the long lists, when both passes were loads).
        auto convert = [&](int pass, const EntryShare& bytes) {
          const int entry = pass * 32 + entry_in_pass;
          nan_bits |= store_share(bytes, real[pass], stage_address(i), entry, quarter);
          if (quarter == 0) valid[stage * kTile + entry] = real[pass] ? 1 : 0;
        };
        const bool more = i + 1 < count;
        convert(0, share);
        if (more) {
          real[0] = next[0].real;
          load_share<kWide>(next[0], quarter, share);
        }
        cp_async_wait<0>();
        __syncwarp();  // quarter 0's copy of the entry's scale bytes has landed
        convert(1, read_share(raw, quarter));
        fence_shared_for_wgmma();
        mbarrier_arrive(barriers.full + stage);
        __syncwarp();  // every quarter has read the scale bytes that quarter 0 copies next
        if (more) {
          real[1] = next[1].real;
          copy_share_async<kWide>(next[1], quarter, raw);
          cp_async_commit();
        }
      }
    }
    // No copy outlives the producer's part: a one-tile slice of the shared form requested
    // tile 1's bytes, which nothing waits for.
    cp_async_wait<0>();
    if (nan_bits != 0) *bad = 1;
    // Taking registers back before warpgroup 0 has raised its own could leave it waiting for
    // them while the consumers wait for it: only once it has given them back.
    mbarrier_wait(barriers.registers_back, 0);
    raise_registers<kLaunchRegisters>();
  } else {
    // ---- consumers: the queries first ---------------------------------------------------------
    load_queries(p, n, head0, q_async, q_vector, smem, bad, tid);
    cp_async_commit();
    cp_async_wait<0>();
    // Checked now, not after the list: the last reads of Q by the threads are then far from the
    // O staging that overwrites it.
    if (q_async && !queries_finite(smem, tid)) *bad = 1;
    fence_shared_for_wgmma();
    mbarrier_arrive(barriers.queries_ready);  // warpgroup 0 waits for it; warpgroup 1 never reads Q
#pragma unroll
    for (int i = 0; i < 128; ++i)
      o[i] = 0.0f;
    const uint32_t p_tile = shared_address(smem + kPipePOffset);
    const int warp_rows = 16 * ((tid / 32) % 4) + lane / 4;  // rows warp_rows and + 8
    // A stage's bytes come from both CTAs' producers with kSharedConversion, and both must know
    // when it is free again.
    const uint32_t peer_empty =
        kSharedConversion ? cluster_shared_address(shared_address(barriers.empty), peer) : 0u;
    // The peer's arrival comes from one thread a warpgroup: after the warpgroup's wgmma_wait
    // none of its products reads the stage any more.
    auto release_stage = [&](int stage) {
      mbarrier_arrive(barriers.empty + stage);
      if (kSharedConversion && thread == 0) {
        mbarrier_arrive_remote(peer_empty + static_cast<uint32_t>(stage) * 8);
      }
    };
    if (warpgroup == 0) {
      raise_registers<kScoreRegistersCap>();
      mbarrier_wait(barriers.queries_ready, 0);
      const uint32_t q_tile = shared_address(smem + kPipeQOffset);
      const float score_scale = p.scale * kLog2e;
      for (int64_t i = 0; i < count; ++i) {
        const int stage = static_cast<int>(i & 1);
        const uint32_t e_tile = stage_address(i);
        const int* tile_valid = valid + stage * kTile;
        mbarrier_wait(barriers.full + stage, full_parity(i));
        float s[kScoreRegisters];
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < 32; ++k) {
          wgmma_m64n64k16(s, wgmma_descriptor(q_tile, scores_operand(k, kHeads)),
                          wgmma_descriptor(e_tile, scores_operand(k, kTile)), k > 0);
        }
        wgmma_commit();
        if (i > 0) {
          wgmma_wait<1>();  // the last tile's O product: its stage is free on this side
          if (i + 1 < count) release_stage(stage ^ 1);
        }
        wgmma_wait<0>();
        wgmma_fence_accumulators(s);
        wgmma_fence_accumulators(o);

        float alpha[2];
        constexpr int kSteps = kTile / 16;
        uint32_t weights[kSteps][4];
        softmax_tile(s, tile_valid, thread, score_scale, row_max, row_sum, o, alpha, weights);
        // P and the rescale factors for warpgroup 1, once it is done with the last tile's.
        if (i > 0) mbarrier_wait(barriers.p_free, static_cast<uint32_t>((i - 1) & 1));
#pragma unroll
        for (int k = 0; k < kSteps; ++k) {
#pragma unroll
          for (int reg = 0; reg < 4; ++reg) {
            const MatrixCoord at = wgmma_a_coord(thread, reg, 0);
            const int col = at.col + 16 * k;
            const uint32_t target =
                p_tile + operand_chunk_offset(at.row, col / 8, kHeads) + (col % 8) * 2;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(target), "r"(weights[k][reg])
                         : "memory");
          }
        }
        if (lane % 4 == 0) {
          alpha_shared[warp_rows] = alpha[0];
          alpha_shared[warp_rows + 8] = alpha[1];
        }
        fence_shared_for_wgmma();
        mbarrier_arrive(barriers.p_ready);
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kSteps; ++k) {
          wgmma_m64n256k16_a_registers(o, weights[k],
                                       wgmma_descriptor(e_tile, outputs_operand(0, k, kTile)));
        }
        wgmma_commit();
      }
      wgmma_wait<0>();
      wgmma_fence_accumulators(o);
      lower_registers<kLaunchRegisters>();
      mbarrier_arrive(barriers.registers_back);
    } else {
      lower_registers<kOutputRegistersCap>();
      for (int64_t i = 0; i < count; ++i) {
        const int stage = static_cast<int>(i & 1);
        const uint32_t e_tile = stage_address(i);
        mbarrier_wait(barriers.full + stage, full_parity(i));
        mbarrier_wait(barriers.p_ready, static_cast<uint32_t>(i & 1));
        const float alpha[2] = {alpha_shared[warp_rows], alpha_shared[warp_rows + 8]};
        if (__any_sync(kFullMask, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
          for (int r = 0; r < 128; ++r)
            o[r] *= alpha[(r / 2) % 2];
        }
        wgmma_fence();
#pragma unroll
        for (int k = 0; k < kTile / 16; ++k) {
          wgmma_m64n256k16(o, wgmma_descriptor(p_tile, scores_operand(k, kHeads)),
                           wgmma_descriptor(e_tile, outputs_operand(1, k, kTile)));
        }
        wgmma_commit();
        wgmma_wait<0>();
        wgmma_fence_accumulators(o);
        if (i + 1 < count) mbarrier_arrive(barriers.p_free);
        if (i + 2 < count) release_stage(stage);
      }
      mbarrier_wait(barriers.registers_back, 0);
      raise_registers<kLaunchRegisters>();
    }
  }
  // Every warpgroup is back at the launch's register count, so the three finish in one place
  // (one set of CTA and cluster barriers, reached by every thread from the same code).
  finish_row<kPipelinedThreads, kThroughWorkspace>(p, plan, space, n, tid,
                                                   warpgroup < 2 ? warpgroup : -1, warpgroup == 0,
                                                   o, row_max, row_sum, out_vector);
}

// ---- CUDA-core kernel -------------------------------------------------------------------------

// Lane `lane`'s 16 values of the entry at `slot`, exactly as the CPU decodes them.
__device__ void decode_entry_values(const PagedPool& pool, int64_t slot, int lane, float (&x)[16]) {
  const auto [page, offset] = pool.locate(slot);
  const uint8_t* data = page + offset * kEntryDataBytes;
  if (lane < 28) {
    const uint2 lo = reinterpret_cast<const uint2*>(data + 16 * lane)[0];
    const uint2 hi = reinterpret_cast<const uint2*>(data + 16 * lane)[1];
    const uint32_t words[4] = {lo.x, lo.y, hi.x, hi.y};
    const float scale = decode_ue8m0(
        page[pool.block_size * kEntryDataBytes + offset * kEntryScaleBytes + lane / 4]);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      x[i] = decode_e4m3(static_cast<uint8_t>(words[i / 4] >> (8 * (i % 4)))) * scale;
  } else {
    const uint2* rope = reinterpret_cast<const uint2*>(data + kNopeDim + 32 * (lane - 28));
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint2 v = rope[w];
      x[4 * w] = __uint_as_float(v.x << 16);
      x[4 * w + 1] = __uint_as_float(v.x & 0xffff0000u);
      x[4 * w + 2] = __uint_as_float(v.y << 16);
      x[4 * w + 3] = __uint_as_float(v.y & 0xffff0000u);
    }
  }
}

__global__ void __launch_bounds__(kThreads) sparse_decode_simple_kernel(SparseDecodeProblem p) {
  __shared__ int bad;
  const int64_t n = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) bad = 0;
  __syncthreads();
  const int64_t length = p.list_length();
  for (int64_t h = warp; h < p.num_heads; h += kWarps) {
    float q[16], acc[16];
    bool finite = true;
    const int64_t q_offset = n * p.q.row_stride + h * p.q.head_stride + 16 * lane;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      q[i] = p.q.dtype == DType::kFloat32
                 ? static_cast<const float*>(p.q.data)[q_offset + i]
                 : bf16_bits_value(static_cast<const uint16_t*>(p.q.data)[q_offset + i]);
      finite = finite && is_finite(q[i]);
      acc[i] = 0.0f;
    }
    if (!finite) bad = 1;
    float running_max = -INFINITY, sum = 0.0f;
    for (int64_t j = 0; j < length; ++j) {
      const int64_t slot = p.list_slot(n, j);
      const PagedPool& pool = p.list_pool(j);
      if (slot < 0) continue;
      if (slot >= pool.num_slots()) {
        bad = 1;
        continue;
      }
      float x[16];
      decode_entry_values(pool, slot, lane, x);
      float dot = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        dot = fmaf(q[i], x[i], dot);
#pragma unroll
      for (int mask = 16; mask >= 1; mask /= 2)
        dot += __shfl_xor_sync(kFullMask, dot, mask);
      const float s = dot * p.scale;
      if (s > running_max) {  // rescale what was summed against the old maximum
        const float factor = expf(running_max - s);
        sum *= factor;
#pragma unroll
        for (int i = 0; i < 16; ++i)
          acc[i] *= factor;
        running_max = s;
      }
      const float weight = expf(s - running_max);
      sum += weight;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        acc[i] = fmaf(weight, x[i], acc[i]);
    }
    const float sink = p.sink != nullptr ? p.sink[h * p.sink_stride] : -INFINITY;
    const float top = fmaxf(running_max, sink);
    float lse = -INFINITY;
    if (top == -INFINITY) {
#pragma unroll
      for (int i = 0; i < 16; ++i)
        acc[i] = 0.0f;
    } else {
      const float list_weight = expf(running_max - top);
      const float denominator = sum * list_weight + expf(sink - top);
      const float factor = list_weight / denominator;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        acc[i] *= factor;
      lse = top + logf(denominator);
    }
    if (!p.lse_includes_sink) lse = running_max == -INFINITY ? -INFINITY : running_max + logf(sum);
    // A NaN sink makes the row invalid even for an empty list, as in the CPU and the reference;
    // fmaxf above dropped it.
    bool nan = isnan(lse) || isnan(sink) || isnan(running_max);
#pragma unroll
    for (int i = 0; i < 16; ++i)
      nan = nan || isnan(acc[i]);
    if (nan) bad = 1;
    const int64_t out_offset = n * p.out_row_stride + h * p.out_head_stride + 16 * lane;
#pragma unroll
    for (int i = 0; i < 16; ++i)
      store_output(p, out_offset + i, acc[i]);
    if (lane == 0 && p.lse != nullptr) p.lse[n * p.lse_row_stride + h * p.lse_head_stride] = lse;
  }
  __syncthreads();  // every head is written and `bad` is final
  if (!bad) return;
  for (int64_t i = threadIdx.x; i < p.num_heads * kHeadDim; i += kThreads) {
    const int64_t h = i / kHeadDim;
    store_output(p, n * p.out_row_stride + h * p.out_head_stride + i % kHeadDim, 0.0f);
    if (i % kHeadDim == 0 && p.lse != nullptr) {
      p.lse[n * p.lse_row_stride + h * p.lse_head_stride] = NAN;
    }
  }
  if (threadIdx.x == 0) count_invalid(p.invalid_count, 1);
}

// ---- host side --------------------------------------------------------------------------------

bool aligned_16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// Whether the dispatcher (SparseDecodeKernel::kAuto) runs the pipelined kernel where it applies:
// on an H100 it is 1.2-1.7x the other from 3 tiles a CTA (bench/results/
// 2026-11-26-h100-sparse-pipelined), and since its handshakes moved to mbarriers it is
// racecheck-clean (docs/dsv4-attention.md, "The pipelined tensor-core kernel").
constexpr bool kPipelinedByDefault = true;

// The pipelined kernel's speed comes from its steady state; on a slice of one or two tiles the
// first tile's latency dominates, and there the other tensor-core kernel, whose 8 warps all
// convert that tile, measured 1-3% faster (H100, Flash CSA lists at N <= 8: 2 tiles a CTA;
// bench/results/2026-11-26-h100-sparse-pipelined). From 3 tiles on, the pipelined one is ahead;
// its plan splits no further (kSparsePipelinedCosts), so only lists shorter than 3 tiles, or a
// forced split count, leave it fewer.
constexpr int64_t kPipelinedMinTiles = kSparsePipelinedCosts.min_tiles_per_split;

using TensorCoreKernel = void (*)(SparseDecodeProblem, SparsePlan, bool, bool);

// What a tensor-core launch runs: which kernel, its shared memory and threads, and the plan.
struct TensorCoreLaunch {
  TensorCoreKernel kernel;
  bool pipelined;
  unsigned threads;
  int shared_bytes;
  SparsePlan plan;
};

// The instance of a tensor-core kernel for a call's pools, head groups and combine.
TensorCoreKernel tensor_core_kernel(bool pipelined, bool shared_conversion, bool wide,
                                    bool through_workspace) {
  if (!pipelined) {
    if (through_workspace) {
      return wide ? sparse_decode_mma_kernel<true, true> : sparse_decode_mma_kernel<false, true>;
    }
    return wide ? sparse_decode_mma_kernel<true, false> : sparse_decode_mma_kernel<false, false>;
  }
  if (through_workspace) {
    if (shared_conversion) {
      return wide ? sparse_decode_pipelined_kernel<true, true, true>
                  : sparse_decode_pipelined_kernel<false, true, true>;
    }
    return wide ? sparse_decode_pipelined_kernel<true, false, true>
                : sparse_decode_pipelined_kernel<false, false, true>;
  }
  if (shared_conversion) {
    return wide ? sparse_decode_pipelined_kernel<true, true, false>
                : sparse_decode_pipelined_kernel<false, true, false>;
  }
  return wide ? sparse_decode_pipelined_kernel<true, false, false>
              : sparse_decode_pipelined_kernel<false, false, false>;
}

// One of the two tensor-core kernels over the row clusters of plan_sparse_decode: `pipelined`
// false forces the other; true runs the pipelined one where the call allows it (the caller
// checked the pools) and, unless `forced`, where its slices are at least kPipelinedMinTiles
// long.
TensorCoreLaunch plan_tensor_core(const SparseDecodeProblem& p, bool pipelined, bool forced,
                                  int device) {
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  const bool wide = aligned_16(p.cache.data) && p.cache.page_stride % 16 == 0 &&
                    (p.num_extra_indices == 0 ||
                     (aligned_16(p.extra_cache.data) && p.extra_cache.page_stride % 16 == 0));
  // Two head groups (Hq 65..128) share the conversion of each tile in the pipelined kernel.
  const bool shared_conversion = sparse_head_groups(p.num_heads) == 2;
  auto launch_of = [&](bool use_pipelined) {
    TensorCoreLaunch launch{};
    launch.pipelined = use_pipelined;
    launch.threads = use_pipelined ? kPipelinedThreads : kThreads;
    launch.shared_bytes = use_pipelined ? kPipelinedSharedBytes : kSharedBytes;
    launch.kernel = tensor_core_kernel(use_pipelined, shared_conversion, wide, false);
    hdk::detail::allow_dynamic_shared_memory(launch.kernel, launch.shared_bytes, device,
                                             kOperation);
    // Every cluster size (above 8 CTAs: 0 where the device does not run clusters of that size).
    const hdk::detail::ResidentClusterCounts& resident = hdk::detail::resident_clusters(
        launch.kernel, launch.threads, static_cast<size_t>(launch.shared_bytes), device,
        kOperation);
    const SparseKernelCosts costs = use_pipelined ? kSparsePipelinedCosts : kSparseMmaCosts;
    launch.plan = plan_sparse_decode(p.num_rows, p.num_heads, p.list_length(), resident, costs);
    const SparseWorkspaceChoice through = workspace_override.load();
    if (p.workspace != nullptr && through != SparseWorkspaceChoice::kNever) {
      const SparsePlan split =
          plan_sparse_workspace(p.num_rows, p.num_heads, p.list_length(), sm_count, costs);
      const bool faster =
          sparse_plan_steps(split, p.num_rows, p.list_length(), resident, costs) <
          sparse_plan_steps(launch.plan, p.num_rows, p.list_length(), resident, costs);
      if (split.through_workspace && (faster || through == SparseWorkspaceChoice::kAlways)) {
        launch.plan = split;
      }
    }
    if (const int forced_splits = splits_override.load(); forced_splits > 0) {
      const int tiles = static_cast<int>(sparse_tiles(p.list_length()));
      const int most =
          launch.plan.through_workspace
              ? sparse_workspace_max_splits(p.num_rows, launch.plan.groups, tiles, sm_count)
              : sparse_max_splits(launch.plan.groups, tiles, resident.largest());
      launch.plan.splits = forced_splits < most ? forced_splits : most;
      launch.plan.through_workspace = launch.plan.through_workspace && launch.plan.splits > 1;
    }
    if (launch.plan.through_workspace) {
      launch.kernel = tensor_core_kernel(use_pipelined, shared_conversion, wide, true);
      hdk::detail::allow_dynamic_shared_memory(launch.kernel, launch.shared_bytes, device,
                                               kOperation);
    }
    return launch;
  };
  TensorCoreLaunch launch = launch_of(pipelined);
  const int64_t tiles_per_cta =
      (sparse_tiles(p.list_length()) + launch.plan.splits - 1) / launch.plan.splits;
  if (pipelined && !forced && tiles_per_cta < kPipelinedMinTiles) launch = launch_of(false);
  return launch;
}

void launch_tensor_core(const SparseDecodeProblem& p, const TensorCoreLaunch& launch, int sm_count,
                        cudaStream_t stream) {
  const int64_t element = p.q.dtype == DType::kFloat32 ? 4 : 2;
  const bool q_vector = aligned_16(p.q.data) && (p.q.row_stride * element) % 16 == 0 &&
                        (p.q.head_stride * element) % 16 == 0;
  const int64_t out_element = p.out_dtype == DType::kFloat32 ? 4 : 2;
  const bool out_vector = reinterpret_cast<uintptr_t>(p.out) % (4 * out_element) == 0 &&
                          p.out_row_stride % 4 == 0 && p.out_head_stride % 4 == 0;
  const unsigned cluster = static_cast<unsigned>(launch.plan.cluster());
  const unsigned ctas = static_cast<unsigned>(p.num_rows * launch.plan.row_ctas());
  hdk::detail::check_launch(
      hdk::detail::launch_in_clusters(launch.kernel, ctas, launch.threads, launch.shared_bytes,
                                      stream, cluster, p, launch.plan, q_vector, out_vector),
      kOperation, launch.pipelined ? "sparse_decode_pipelined_kernel" : "sparse_decode_mma_kernel");
  if (!launch.plan.through_workspace) return;
  const int slices = sparse_combine_slices(p.num_rows, launch.plan.groups, sm_count);
  const unsigned combine_ctas = static_cast<unsigned>(p.num_rows * launch.plan.groups * slices);
  if (dependent_launch.load()) {
    hdk::detail::check_launch(
        hdk::detail::launch_dependent(sparse_decode_combine_kernel, combine_ctas, kCombineThreads,
                                      0, stream, p, launch.plan, slices, out_vector),
        kOperation, "sparse_decode_combine_kernel");
    return;
  }
  sparse_decode_combine_kernel<<<combine_ctas, kCombineThreads, 0, stream>>>(p, launch.plan, slices,
                                                                             out_vector);
  hdk::detail::check_launch(cudaPeekAtLastError(), kOperation, "sparse_decode_combine_kernel");
}

// Which kernel serves a call, from the override and the problem: the CUDA-core one
// (tensor_core false), or a tensor-core one with the arguments of plan_tensor_core.
struct KernelChoice {
  bool tensor_core;
  bool pipelined;
  bool every_call;
};

KernelChoice choose_kernel(const SparseDecodeProblem& p) {
  const SparseDecodeKernel forced = kernel_override.load();
  const bool mma_fits = sparse_mma_supports(p.num_heads);
  const bool pipelined_asked = forced == SparseDecodeKernel::kTensorCorePipelined ||
                               forced == SparseDecodeKernel::kTensorCorePipelinedEveryCall ||
                               (forced == SparseDecodeKernel::kAuto && kPipelinedByDefault);
  const bool forced_tensor_core = forced == SparseDecodeKernel::kTensorCore || pipelined_asked;
  if (forced != SparseDecodeKernel::kAuto && forced_tensor_core && !mma_fits) {
    throw Error(std::string(kOperation) +
                ": the tensor-core kernel was forced, but it serves only "
                "head counts that are multiples of 16 up to 512, got Hq = " +
                std::to_string(p.num_heads));
  }
  // The pipelined kernel points the loads of entries that are not real at a pool's first
  // entry and divides slots in 32 bits: without a slot in any pool (nothing to attend to), or
  // with a pool of 2^31 slots or more (over a terabyte of entries), the other one runs.
  const bool extra_used = p.num_extra_indices > 0;
  const bool pool_with_slots =
      p.cache.num_slots() > 0 || (extra_used && p.extra_cache.num_slots() > 0);
  const bool narrow_slots =
      p.cache.num_slots() <= INT32_MAX && (!extra_used || p.extra_cache.num_slots() <= INT32_MAX);
  return KernelChoice{forced == SparseDecodeKernel::kAuto ? mma_fits : forced_tensor_core,
                      pipelined_asked && pool_with_slots && narrow_slots,
                      forced == SparseDecodeKernel::kTensorCorePipelinedEveryCall};
}

}  // namespace

void set_sparse_decode_kernel_override(SparseDecodeKernel kernel) {
  kernel_override.store(kernel);
}

void set_sparse_decode_splits_override(int splits) {
  splits_override.store(splits);
}

void set_sparse_decode_workspace_override(SparseWorkspaceChoice choice) {
  workspace_override.store(choice);
}

void set_sparse_decode_dependent_launch(bool enabled) {
  dependent_launch.store(enabled);
}

void sparse_decode_cuda(const SparseDecodeProblem& p, int device, CudaStream stream) {
  if (p.num_rows == 0) return;
  for (const auto& [pool, name, used] :
       {std::make_tuple(&p.cache, "cache", true),
        std::make_tuple(&p.extra_cache, "extra_cache", p.num_extra_indices > 0)}) {
    if (used && (reinterpret_cast<uintptr_t>(pool->data) % 8 != 0 || pool->page_stride % 8 != 0)) {
      throw Error(std::string(kOperation) + ": argument '" + name +
                  "' must be 8-byte aligned with a page stride that is a multiple of 8 bytes on "
                  "CUDA");
    }
  }
  const KernelChoice choice = choose_kernel(p);
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  if (p.workspace != nullptr) {
    const int64_t needed =
        sparse_workspace_bytes(p.num_rows, p.num_heads, p.list_length(), sm_count);
    if (p.workspace_bytes < needed) {
      throw Error(std::string(kOperation) + ": argument 'workspace' holds " +
                  std::to_string(p.workspace_bytes) + " bytes, but this call needs " +
                  std::to_string(needed) + " (sparse_decode_workspace_bytes(" +
                  std::to_string(p.num_rows) + ", " + std::to_string(p.num_heads) + ", " +
                  std::to_string(p.list_length()) + ", device))");
    }
  }
  if (choice.tensor_core) {
    launch_tensor_core(p, plan_tensor_core(p, choice.pipelined, choice.every_call, device),
                       sm_count, stream);
    return;
  }
  sparse_decode_simple_kernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(p);
  hdk::detail::check_launch(cudaPeekAtLastError(), kOperation, "sparse_decode_simple_kernel");
}

SparseLaunchReport sparse_decode_launch_report(const SparseDecodeProblem& p, int device) {
  SparseLaunchReport report;
  if (p.num_rows == 0) return report;
  const KernelChoice choice = choose_kernel(p);
  if (!choice.tensor_core) return report;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const TensorCoreLaunch launch = plan_tensor_core(p, choice.pipelined, choice.every_call, device);
  report.kernel = launch.pipelined ? "pipelined" : "mma";
  report.plan = launch.plan;
  return report;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
