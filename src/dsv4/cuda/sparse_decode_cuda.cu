// CUDA kernels of sparse_decode. The design, the work split and what was verified where:
// docs/dsv4-attention.md ("CUDA kernels").
//
// Tensor-core kernel: one thread-block cluster per query row. Its CTAs are `groups` head groups
// of 64 heads times `splits` slices of the list (plan_sparse_decode). A CTA walks its slice in
// tiles of 64 entries: cp.async brings the next tile's stored bytes into shared memory while the
// current tile, dequantized once to bf16, feeds S = Q E^T and O += P E through mma.sync m16n8k16
// (8 warps: warp w owns head tile w % 4 and, for S, entries 32 (w / 4) .. + 32 of the tile, for O,
// columns 256 (w / 4) .. + 256). The splits' partial results meet in shared memory across the
// cluster (no global workspace), where the sink is added once and the row's validity agreed on.
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

#include "core/cuda_helpers.h"
#include "dsv4/cuda/count_invalid.cuh"
#include "dsv4/cuda/sparse_decode_cuda.h"
#include "dsv4/cuda/sparse_decode_layout.h"
#include "dsv4/kv_formats.h"
#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

namespace cg = cooperative_groups;

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

// ---- shared memory of the tensor-core kernel (byte offsets) ---------------------------------
constexpr int kQOffset = 0;                                         // [64 heads][512] bf16
constexpr int kEOffset = kQOffset + kHeads * kHeadDim * 2;          // [64 entries][512] bf16
constexpr int kRawOffset = kEOffset + kTile * kHeadDim * 2;         // [64][576] stored bytes
constexpr int kScaleOffset = kRawOffset + kTile * kEntryDataBytes;  // [64][8] scale bytes
constexpr int kPOffset = kScaleOffset + kTile * kEntryScaleBytes;   // [64 heads][64] bf16
constexpr int kMaxOffset = kPOffset + kHeads * kTile * 2;           // [2 halves][64] fp32
constexpr int kSumOffset = kMaxOffset + 2 * kHeads * 4;             // [2 halves][64] fp32
constexpr int kValidOffset = kSumOffset + 2 * kHeads * 4;           // [2 buffers][64] int
constexpr int kStatOffset = kValidOffset + 2 * kTile * 4;           // m[64], l[64] fp32
constexpr int kBadOffset = kStatOffset + 2 * kHeads * 4;            // int (+ pad)
constexpr int kFactorOffset = kBadOffset + 16;                      // [8 splits][64] fp32
constexpr int kSharedBytes = kFactorOffset + kSparseMaxCluster * kHeads * 4;
// After the list, the CTA's unnormalized O ([64][kStageStride] fp32) overlays Q, E and the raw
// tile, which are no longer read.
constexpr int kStageOffset = 0;
static_assert(kStageOffset + kHeads * kStageStride * 4 <= kPOffset, "O staging overlaps P");
static_assert(kSharedBytes <= 227 * 1024, "shared memory beyond an SM's");
static_assert(kEntryDataBytes % 16 == 0 && kRawOffset % 16 == 0 && kPOffset % 16 == 0, "align");

// ---- PTX wrappers ---------------------------------------------------------------------------

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void cp_async_16(void* target, const void* source) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(shared_address(target)),
               "l"(source)
               : "memory");
}

__device__ __forceinline__ void cp_async_8(void* target, const void* source) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(shared_address(target)),
               "l"(source)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row_address) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row_address)));
}

// c += a b for one m16n8k16 tile (bf16 in, fp32 accumulators).
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                          uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Exact products of bf16 pairs (one factor is a power of two, so nothing rounds).
__device__ __forceinline__ uint32_t mul_bf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// Two fp32 values to bf16x2, round to nearest even (x in the low half).
__device__ __forceinline__ uint32_t pack_bf16x2(float x, float y) {
  uint32_t d;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(d) : "f"(y), "f"(x));
  return d;
}

__device__ __forceinline__ float bf16_value(uint16_t bits) {
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

__device__ __forceinline__ void store_output(const SparseDecodeProblem& p, int64_t offset,
                                             float value) {
  if (p.out_dtype == DType::kFloat32) {
    static_cast<float*>(p.out)[offset] = value;
  } else {
    static_cast<uint16_t*>(p.out)[offset] = static_cast<uint16_t>(pack_bf16x2(value, 0.0f));
  }
}

// ---- tensor-core kernel: pieces ---------------------------------------------------------------

// Address of (row, logical chunk) in a swizzled bf16 tile of `chunks_per_row` chunks per row.
__device__ __forceinline__ uint8_t* tile_address(uint8_t* tile, MatrixCoord at,
                                                 int chunks_per_row) {
  return tile + (at.row * chunks_per_row + swizzled_chunk(at.row, at.col)) * 16;
}

// Enqueues the stored bytes of tile `tile` of row n's list (indices over cache, then
// extra_indices over extra_cache) into the raw buffer and records which of its entries are real
// (valid[e]); a slot beyond its cache marks the CTA bad. Warp w copies entries
// w, w + 8, ...; its lanes share the entry's 36 (or 72) data chunks and the scale word.
template <bool kWide>
__device__ void issue_tile(const SparseDecodeProblem& p, int64_t n, int64_t tile, uint8_t* smem,
                           int* valid, int* bad, int warp, int lane) {
  uint8_t* raw = smem + kRawOffset;
  uint8_t* raw_scales = smem + kScaleOffset;
  const int64_t length = p.list_length();
  for (int e = warp; e < kTile; e += kWarps) {
    const int64_t j = tile * kTile + e;
    const int64_t slot = j < length ? p.list_slot(n, j) : -1;
    const PagedPool& pool = p.list_pool(j);
    const bool real = slot >= 0 && slot < pool.num_slots();
    if (lane == 0) {
      valid[e] = real ? 1 : 0;
      if (slot >= pool.num_slots()) *bad = 1;
    }
    if (!real) continue;
    const int64_t offset = slot % pool.block_size;
    const uint8_t* page = pool.page(slot);
    const uint8_t* data = page + offset * kEntryDataBytes;
    const uint8_t* scales = page + pool.block_size * kEntryDataBytes + offset * kEntryScaleBytes;
    uint8_t* target = raw + e * kEntryDataBytes;
    constexpr int kChunk = kWide ? 16 : 8;
    constexpr int kDataChunks = static_cast<int>(kEntryDataBytes) / kChunk;
    for (int c = lane; c <= kDataChunks; c += 32) {
      if (c == kDataChunks) {
        cp_async_8(raw_scales + e * kEntryScaleBytes, scales);
      } else if (kWide) {
        cp_async_16(target + c * kChunk, data + c * kChunk);
      } else {
        cp_async_8(target + c * kChunk, data + c * kChunk);
      }
    }
  }
}

// Eight stored FP8 codes times 2^(scale - 127) as eight bf16 (exact), NaN codes and a NaN scale
// giving NaN.
__device__ __forceinline__ uint4 dequantize_8(uint2 codes, uint32_t scale_byte) {
  if (scale_byte == kScaleNaN || any_e4m3_nan(codes.x) || any_e4m3_nan(codes.y)) {
    const uint32_t words[2] = {codes.x, codes.y};
    uint32_t out[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = words[i / 2] >> (16 * (i % 2));
      const float scale = decode_ue8m0(static_cast<uint8_t>(scale_byte));
      const float lo = decode_e4m3(static_cast<uint8_t>(w & 0xffu)) * scale;
      const float hi = decode_e4m3(static_cast<uint8_t>((w >> 8) & 0xffu)) * scale;
      out[i] = (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
    }
    return make_uint4(out[0], out[1], out[2], out[3]);
  }
  const uint32_t up = kBf16TwoTo120 | (kBf16TwoTo120 << 16);
  const uint32_t scale = ue8m0_as_bf16(scale_byte) * 0x10001u;
  auto convert = [&](uint32_t pair_word) {
    return mul_bf16x2(mul_bf16x2(e4m3_pair_as_scaled_bf16(pair_word), up), scale);
  };
  return make_uint4(convert(codes.x), convert(codes.x >> 16), convert(codes.y),
                    convert(codes.y >> 16));
}

// The raw tile to bf16 rows of E (zero rows for entries that are not real): thread jobs are
// (entry, 16-byte output chunk); chunks 0..55 are FP8 values (group = chunk / 8), 56..63 the RoPE
// values copied as stored.
__device__ void dequantize_tile(uint8_t* smem, const int* valid, int tid) {
  const uint8_t* raw = smem + kRawOffset;
  const uint8_t* raw_scales = smem + kScaleOffset;
  uint8_t* e_tile = smem + kEOffset;
  constexpr int kNopeChunks = static_cast<int>(kNopeDim / 8);
  for (int job = tid; job < kTile * kChunksPerRow; job += kThreads) {
    const int e = job / kChunksPerRow, c = job % kChunksPerRow;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (valid[e]) {
      const uint8_t* entry = raw + e * kEntryDataBytes;
      if (c < kNopeChunks) {
        const uint2 codes = *reinterpret_cast<const uint2*>(entry + 8 * c);
        value = dequantize_8(codes, raw_scales[e * kEntryScaleBytes + c / 8]);
      } else {
        value = *reinterpret_cast<const uint4*>(entry + kNopeDim + 16 * (c - kNopeChunks));
      }
    }
    *reinterpret_cast<uint4*>(tile_address(e_tile, MatrixCoord{e, c}, kChunksPerRow)) = value;
  }
}

// The CTA's 64 query heads as bf16 rows (zero rows beyond Hq); a NaN or infinity marks it bad.
__device__ void load_queries(const SparseDecodeProblem& p, int64_t n, int64_t head0, bool q_vector,
                             uint8_t* smem, int* bad, int tid) {
  uint8_t* q_tile = smem + kQOffset;
  bool finite = true;
  for (int job = tid; job < kHeads * kChunksPerRow; job += kThreads) {
    const int h = job / kChunksPerRow, c = job % kChunksPerRow;
    const int64_t head = head0 + h;
    uint32_t words[4] = {0, 0, 0, 0};
    if (head < p.num_heads) {
      const int64_t offset = n * p.q.row_stride + head * p.q.head_stride + 8 * c;
      if (p.q.dtype == DType::kFloat32) {
        float x[8];
        const float* source = static_cast<const float*>(p.q.data) + offset;
        if (q_vector) {
          const float4 v0 = reinterpret_cast<const float4*>(source)[0];
          const float4 v1 = reinterpret_cast<const float4*>(source)[1];
          x[0] = v0.x, x[1] = v0.y, x[2] = v0.z, x[3] = v0.w;
          x[4] = v1.x, x[5] = v1.y, x[6] = v1.z, x[7] = v1.w;
        } else {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            x[i] = source[i];
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          finite = finite && is_finite(x[2 * i]) && is_finite(x[2 * i + 1]);
          words[i] = pack_bf16x2(x[2 * i], x[2 * i + 1]);
        }
      } else {
        const uint16_t* source = static_cast<const uint16_t*>(p.q.data) + offset;
        if (q_vector) {
          const uint4 v = *reinterpret_cast<const uint4*>(source);
          words[0] = v.x, words[1] = v.y, words[2] = v.z, words[3] = v.w;
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i)
            words[i] = source[2 * i] | (static_cast<uint32_t>(source[2 * i + 1]) << 16);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          finite =
              finite && (words[i] & 0x7f80u) != 0x7f80u && (words[i] & 0x7f800000u) != 0x7f800000u;
        }
      }
    }
    *reinterpret_cast<uint4*>(tile_address(q_tile, MatrixCoord{h, c}, kChunksPerRow)) =
        make_uint4(words[0], words[1], words[2], words[3]);
  }
  if (!finite) *bad = 1;
}

// ---- tensor-core kernel -----------------------------------------------------------------------

template <bool kWide>
__global__ void __launch_bounds__(kThreads, 1)
    sparse_decode_mma_kernel(SparseDecodeProblem p, SparsePlan plan, bool q_vector) {
  extern __shared__ __align__(128) uint8_t smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t n = blockIdx.x / plan.cluster();
  const int group = rank % plan.groups, split = rank / plan.groups;
  const int64_t head0 = int64_t{group} * kHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int head_tile = warp % 4, half = warp / 4;
  const int quad_row = lane / 4;  // rows quad_row and quad_row + 8 of the head tile (C layout)

  uint8_t* q_tile = smem + kQOffset;
  uint8_t* e_tile = smem + kEOffset;
  uint8_t* p_tile = smem + kPOffset;
  float* tile_max = reinterpret_cast<float*>(smem + kMaxOffset);
  float* tile_sum = reinterpret_cast<float*>(smem + kSumOffset);
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
  if (first < last)
    issue_tile<kWide>(p, n, first, smem, valid + (first & 1) * kTile, bad, warp, lane);
  cp_async_commit();
  load_queries(p, n, head0, q_vector, smem, bad, tid);

  // Scores are kept in log2 units: s * scale * log2(e), so exp2 gives the softmax weights.
  const float score_scale = p.scale * kLog2e;
  float row_max[2] = {-INFINITY, -INFINITY};
  float row_sum[2] = {0.0f, 0.0f};  // this lane's share; summed over the quad at the end
  float o[32][4];
#pragma unroll
  for (int j = 0; j < 32; ++j)
    o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;

  for (int64_t t = first; t < last; ++t) {
    const int* tile_valid = valid + (t & 1) * kTile;
    cp_async_wait_all();
    __syncthreads();  // the raw tile has landed; E and P are no longer read
    dequantize_tile(smem, tile_valid, tid);
    __syncthreads();  // E is complete; the raw buffer is free
    if (t + 1 < last) {
      issue_tile<kWide>(p, n, t + 1, smem, valid + ((t + 1) & 1) * kTile, bad, warp, lane);
    }
    cp_async_commit();

    // S = Q E^T for heads 16 head_tile.., entries 32 half.. : four n-tiles of 8 entries.
    float s[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
      s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll 4
    for (int k_step = 0; k_step < kChunksPerRow / 2; ++k_step) {
      uint32_t a[4];
      ldmatrix_x4(
          a, tile_address(q_tile, ldmatrix_a_address(lane, 16 * head_tile, k_step), kChunksPerRow));
#pragma unroll
      for (int pair = 0; pair < 2; ++pair) {
        uint32_t b[4];
        ldmatrix_x4(b, tile_address(e_tile, ldmatrix_b_address(lane, 32 * half + 16 * pair, k_step),
                                    kChunksPerRow));
        mma_16816(s[2 * pair], a, b[0], b[1]);
        mma_16816(s[2 * pair + 1], a, b[2], b[3]);
      }
    }

    // Online softmax: the tile's row maximum over both halves (through shared memory), then the
    // weights, the rescaled sums and accumulators. Entries that are not real score -inf; fmaxf
    // skips NaN scores, whose weights turn the sums NaN (caught at the end).
    float local_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const MatrixCoord at = mma_c_coord(lane, i);
        const int entry = 32 * half + 8 * j + at.col;
        s[j][i] = tile_valid[entry] ? s[j][i] * score_scale : -INFINITY;
        local_max[i / 2] = fmaxf(local_max[i / 2], s[j][i]);
      }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int mask = 1; mask <= 2; mask *= 2)
        local_max[r] = fmaxf(local_max[r], __shfl_xor_sync(kFullMask, local_max[r], mask));
      if (lane % 4 == 0) tile_max[half * kHeads + 16 * head_tile + quad_row + 8 * r] = local_max[r];
    }
    __syncthreads();
    float base[2], alpha[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * head_tile + quad_row + 8 * r;
      const float new_max = fmaxf(row_max[r], fmaxf(tile_max[row], tile_max[kHeads + row]));
      base[r] = new_max == -INFINITY ? 0.0f : new_max;
      alpha[r] = exp2f(row_max[r] - base[r]);
      row_max[r] = new_max;
      row_sum[r] *= alpha[r];
    }
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      o[j][0] *= alpha[0], o[j][1] *= alpha[0];
      o[j][2] *= alpha[1], o[j][3] *= alpha[1];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      float w[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w[i] = exp2f(s[j][i] - base[i / 2]);
        row_sum[i / 2] += w[i];
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const MatrixCoord at = mma_c_coord(lane, 2 * r);
        const int row = 16 * head_tile + at.row, col = 32 * half + 8 * j + at.col;
        uint8_t* chunk = tile_address(p_tile, MatrixCoord{row, col / 8}, kTile / 8);
        *reinterpret_cast<uint32_t*>(chunk + 2 * (col % 8)) = pack_bf16x2(w[2 * r], w[2 * r + 1]);
      }
    }
    __syncthreads();  // P is complete

    // O += P E for heads 16 head_tile.., columns 256 half.. : 32 n-tiles of 8 columns.
#pragma unroll
    for (int k_step = 0; k_step < kTile / 16; ++k_step) {
      uint32_t a[4];
      ldmatrix_x4(
          a, tile_address(p_tile, ldmatrix_a_address(lane, 16 * head_tile, k_step), kTile / 8));
#pragma unroll
      for (int pair = 0; pair < 16; ++pair) {
        uint32_t b[4];
        ldmatrix_x4_trans(
            b, tile_address(e_tile, ldmatrix_bt_address(lane, 16 * k_step, 256 * half + 16 * pair),
                            kChunksPerRow));
        mma_16816(o[2 * pair], a, b[0], b[1]);
        mma_16816(o[2 * pair + 1], a, b[2], b[3]);
      }
    }
  }
  cp_async_wait_all();

  // ---- this CTA's partial result: (row max, row sum, unnormalized O) per head ---------------
  bool nan = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int mask = 1; mask <= 2; mask *= 2)
      row_sum[r] += __shfl_xor_sync(kFullMask, row_sum[r], mask);
    if (lane % 4 == 0) tile_sum[half * kHeads + 16 * head_tile + quad_row + 8 * r] = row_sum[r];
    nan = nan || isnan(row_sum[r]);
  }
#pragma unroll
  for (int j = 0; j < 32; ++j) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
      nan = nan || isnan(o[j][i]);
  }
  if (tid < kHeads && p.sink != nullptr && head0 + tid < p.num_heads) {
    const float sink = p.sink[(head0 + tid) * p.sink_stride];
    nan = nan || isnan(sink) || sink == INFINITY;  // the CPU's NaN results for such a sink
  }
  if (nan) *bad = 1;
  __syncthreads();  // Q, E and the raw tile are free for the staging; tile_sum is complete
  float* stage = reinterpret_cast<float*>(smem + kStageOffset);
#pragma unroll
  for (int j = 0; j < 32; ++j) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const MatrixCoord at = mma_c_coord(lane, 2 * r);
      const int row = 16 * head_tile + at.row, col = 256 * half + 8 * j + at.col;
      *reinterpret_cast<float2*>(stage + row * kStageStride + col) =
          make_float2(o[j][2 * r], o[j][2 * r + 1]);
    }
  }
  if (half == 0 && lane % 4 == 0) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = 16 * head_tile + quad_row + 8 * r;
      stat_m[row] = row_max[r];
      stat_l[row] = tile_sum[row] + tile_sum[kHeads + row];
    }
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

  const int columns = static_cast<int>(kHeadDim) / plan.splits;
  const int column0 = split * columns;
  for (int job = tid; job < kHeads * columns / 4; job += kThreads) {
    const int h = job / (columns / 4);
    const int col = column0 + 4 * (job % (columns / 4));
    const int64_t head = head0 + h;
    if (head >= p.num_heads) continue;
    float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (!row_bad) {
      for (int s = 0; s < plan.splits; ++s) {
        const float f = factors[s * kHeads + h];
        const float4 v = *reinterpret_cast<const float4*>(
            cluster.map_shared_rank(stage, s * plan.groups + group) + h * kStageStride + col);
        sum.x += f * v.x, sum.y += f * v.y, sum.z += f * v.z, sum.w += f * v.w;
      }
    }
    const int64_t offset = n * p.out_row_stride + head * p.out_head_stride + col;
    store_output(p, offset, sum.x);
    store_output(p, offset + 1, sum.y);
    store_output(p, offset + 2, sum.z);
    store_output(p, offset + 3, sum.w);
  }
  if (rank == 0 && tid == 0 && row_bad) count_invalid(p.invalid_count, 1);
  cluster.sync();  // no CTA leaves while a peer may still read its shared memory
}

// ---- CUDA-core kernel -------------------------------------------------------------------------

// Lane `lane`'s 16 values of the entry at `slot`, exactly as the CPU decodes them.
__device__ void decode_entry_values(const PagedPool& pool, int64_t slot, int lane, float (&x)[16]) {
  const int64_t offset = slot % pool.block_size;
  const uint8_t* page = pool.page(slot);
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
                 : bf16_value(static_cast<const uint16_t*>(p.q.data)[q_offset + i]);
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

void launch_mma(const SparseDecodeProblem& p, int device, cudaStream_t stream) {
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  const SparsePlan plan = plan_sparse_decode(p.num_rows, p.num_heads, p.list_length(), sm_count);
  const bool wide = aligned_16(p.cache.data) && p.cache.page_stride % 16 == 0 &&
                    (p.num_extra_indices == 0 ||
                     (aligned_16(p.extra_cache.data) && p.extra_cache.page_stride % 16 == 0));
  const int64_t element = p.q.dtype == DType::kFloat32 ? 4 : 2;
  const bool q_vector = aligned_16(p.q.data) && (p.q.row_stride * element) % 16 == 0 &&
                        (p.q.head_stride * element) % 16 == 0;
  auto kernel = wide ? sparse_decode_mma_kernel<true> : sparse_decode_mma_kernel<false>;
  hdk::detail::allow_dynamic_shared_memory(kernel, kSharedBytes, device, kOperation);
  hdk::detail::check_launch(
      hdk::detail::launch_in_clusters(kernel, static_cast<unsigned>(p.num_rows * plan.cluster()),
                                      kThreads, kSharedBytes, stream,
                                      static_cast<unsigned>(plan.cluster()), p, plan, q_vector),
      kOperation, "sparse_decode_mma_kernel");
}

}  // namespace

void set_sparse_decode_kernel_override(SparseDecodeKernel kernel) {
  kernel_override.store(kernel);
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
  const SparseDecodeKernel forced = kernel_override.load();
  const bool mma_fits = sparse_mma_supports(p.num_heads);
  if (forced == SparseDecodeKernel::kTensorCore && !mma_fits) {
    throw Error(std::string(kOperation) +
                ": the tensor-core kernel was forced, but it serves only "
                "head counts that are multiples of 16 up to 512, got Hq = " +
                std::to_string(p.num_heads));
  }
  const bool use_mma =
      forced == SparseDecodeKernel::kAuto ? mma_fits : forced == SparseDecodeKernel::kTensorCore;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  if (use_mma) {
    launch_mma(p, device, stream);
    return;
  }
  sparse_decode_simple_kernel<<<static_cast<unsigned>(p.num_rows), kThreads, 0, stream>>>(p);
  hdk::detail::check_launch(cudaPeekAtLastError(), kOperation, "sparse_decode_simple_kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
