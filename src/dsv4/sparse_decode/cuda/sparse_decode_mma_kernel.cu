// sparse_decode's tensor-core kernel: one thread-block cluster per query row. Its CTAs are
// `groups` head groups of 64 heads times `splits` slices of the list (plan_sparse_decode); through
// the workspace groups of 32 or 16 heads where SMs are left over (plan_sparse_fewest_tiles). A CTA
// walks its slice in tiles of 64 entries: bulk copies (or cp.async, for a pool aligned to 8 bytes
// only) bring the next tile's stored bytes into shared memory while the current tile, dequantized
// once to bf16, feeds S = Q E^T and O += P E through Hopper's warpgroup MMA (wgmma.cuh). Two
// warpgroups: warpgroup h computes S over dims 256 h .. + 255 (the two halves are summed through
// shared memory, so both hold the whole 64 x 64 S and run the same softmax) and owns O's columns
// 256 h .. + 255, with P passed from the score accumulators to the output product in registers. The
// splits' partial results meet in shared memory across the cluster (no global workspace), where the
// sink is added once and the row's validity agreed on (finish_row), or in the caller's workspace
// for the combine kernel. Design, the work split and what was verified where:
// docs/dsv4-attention.md ("sparse_decode on CUDA").
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/dependent_launch.cuh"
#include "core/cuda/mbarrier.cuh"
#include "core/cuda/shared_address.cuh"
#include "core/cuda/wgmma.cuh"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "dsv4/kv_cache/kv_formats.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_device.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_entry_share.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_finish.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_kernels.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"
#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::cp_async_8;
using hdk::detail::cp_async_commit;
using hdk::detail::cp_async_wait;

// A CTA's shared memory, from a 1024-byte boundary (wgmma's swizzle atom). After the list, the
// CTA's unnormalized O ([64][kStageStride] fp32) overlays q, e and raw, which are no longer read.
// The raw tile, and E where it is converted, are addressed as smem + offsetof(...): through the
// members (shared.raw[e]) NVVM folds the constant offset later and the generated code changes.
struct MmaSharedMemory {
  uint8_t q[kQBytes];                            // 64 heads x 512 bf16, an operand tile
  uint8_t e[kEBytes];                            // the tile's 64 entries x 512 bf16, another
  uint8_t raw[kTile][kRawEntryStride];           // the next tile as stored (data, scale bytes)
  float exchange[2][kScoreRegisters * 128];      // each warpgroup's partial S
  int valid[2][kTile];                           // which entries of two tiles are real
  float stat_m[kHeads];                          // row maxima (log2 units)
  float stat_l[kHeads];                          // row sums
  float sink[kHeads];                            // the heads' sinks (load_sink)
  int bad;                                       // the CTA's invalid-row flag
  int unused[3];                                 // pads the flag to 16 bytes
  float factors[kSparseMaxWideCluster][kHeads];  // each split's weight in the combined row
  uint64_t raw_full;                             // a 16-byte aligned pool's tile has landed
};
// The dynamic shared memory is aligned up to the swizzle atom inside the kernel.
constexpr int kSharedBytes = static_cast<int>(sizeof(MmaSharedMemory)) + kSwizzleAtomBytes;
static_assert(kHeads * kStageStride * 4 <= static_cast<int>(offsetof(MmaSharedMemory, exchange)),
              "O staging overlaps");
static_assert(kSharedBytes <= 227 * 1024, "shared memory beyond an SM's");
static_assert(offsetof(MmaSharedMemory, raw) % 16 == 0 && kRawEntryStride % 16 == 0 &&
                  kRawEntryStride >= kEntryDataBytes + kEntryScaleBytes &&
                  offsetof(MmaSharedMemory, e) % kSwizzleAtomBytes == 0,
              "a raw entry holds its data and scale bytes at 16-byte alignment");

// Where an entry's stored bytes are: its 576 data bytes and 8 scale bytes, or nothing (data ==
// nullptr) for a skipped entry and a slot beyond its cache (which also marks the CTA bad).
struct EntrySource {
  const uint8_t* data = nullptr;
  const uint8_t* scales = nullptr;
};

constexpr int kEntriesPerWarp = kTile / kSparseWarps;

// Where list entry j's stored bytes are, for its slot (load_slot_now): nothing for a skipped entry
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

// bf16 queries copied as stored (copy_queries_async) before the list: half of them ahead of the
// first tile, the rest behind it.
constexpr int kEarlyQueryJobs = kQueryJobs / 2;

// Whether the queries behind a tile's scores are finite, told by the scores themselves (a pass
// over Q in shared memory after the list took 0.8 us of a one-tile CTA, H200). A NaN or infinite
// query value makes its head's score with every entry NaN or infinite (x inf is inf or NaN, and
// the zero rows of entries that are not real give NaN), while finite queries leave a whole row
// of 64 scores non-finite only where they are infinite scores, which make the row invalid anyway
// (docs/dsv4-attention.md, "Invalid rows"). A head's row lies in a quad (wgmma_d_coord):
// accumulators 4k, 4k + 1 of one row, 4k + 2, 4k + 3 of the row eight further. Every thread of
// the warp calls it.
__device__ __forceinline__ bool query_rows_finite(const float (&s)[kScoreRegisters]) {
  bool row_nonfinite[2] = {true, true};
#pragma unroll
  for (int i = 0; i < kScoreRegisters; ++i)
    row_nonfinite[(i / 2) % 2] = row_nonfinite[(i / 2) % 2] && !isfinite(s[i]);
  const uint32_t quad_shift = threadIdx.x % 32 & ~3u;
  bool bad_row = false;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const uint32_t rows = __ballot_sync(kFullMask, row_nonfinite[r]);  // every lane, every r
    bad_row = bad_row || (rows >> quad_shift & 0xfu) == 0xfu;
  }
  return !__any_sync(kFullMask, bad_row);
}

// The list entry whose slot lane l of warp w loads for tile `tile`: entry w + 8 (l % 8), lanes 8..
// repeating lanes 0..7, so the warp's eight slots cost one round trip.
__device__ __forceinline__ int64_t tile_entry(int64_t tile, int warp, int lane) {
  return tile * kTile + warp + kSparseWarps * (lane % kEntriesPerWarp);
}

__device__ __forceinline__ const uint8_t* shuffle_pointer(const uint8_t* pointer, int lane) {
  const uint64_t bits = reinterpret_cast<uint64_t>(pointer);
  const uint32_t lo = __shfl_sync(kFullMask, static_cast<uint32_t>(bits), lane);
  const uint32_t hi = __shfl_sync(kFullMask, static_cast<uint32_t>(bits >> 32), lane);
  return reinterpret_cast<const uint8_t*>((static_cast<uint64_t>(hi) << 32) | lo);
}

// Enqueues the stored bytes of the warp's eight entries of a tile (located by locate_entry)
// into the raw tile (entry e's row of kRawEntryStride bytes: its data, then its scale bytes) and
// records which are real (valid[e]). A 16-byte aligned pool (kWide): lane i < 8 holds entry
// warp + 8 i and requests its 576 data bytes by one bulk copy, completing on raw_full (the warp's
// lane 0 expects them), and its scale word by cp.async. Otherwise the warp's lanes share each
// entry's 72 eight-byte data chunks and its scale word, by cp.async.
template <bool kWide>
__device__ void issue_tile(const EntrySource& mine, uint8_t* smem, int* valid, int warp, int lane) {
  uint8_t* raw = smem + offsetof(MmaSharedMemory, raw);
  constexpr uint32_t kDataBytes = static_cast<uint32_t>(kEntryDataBytes);
  if constexpr (kWide) {
    uint64_t* raw_full = reinterpret_cast<uint64_t*>(smem + offsetof(MmaSharedMemory, raw_full));
    const int e = warp + kSparseWarps * (lane % kEntriesPerWarp);
    const bool real = lane < kEntriesPerWarp && mine.data != nullptr;
    const uint32_t real_lanes = __ballot_sync(kFullMask, real);
    if (lane == 0) {
      hdk::detail::mbarrier_arrive_expect_bytes(raw_full, __popc(real_lanes) * kDataBytes);
    }
    if (real) {
      uint8_t* target = raw + e * kRawEntryStride;
      hdk::detail::bulk_copy_from_global(shared_address(target), mine.data, kDataBytes,
                                         shared_address(raw_full));
      cp_async_8(target + kDataBytes, mine.scales);
    }
    if (lane < kEntriesPerWarp) valid[e] = real ? 1 : 0;
  } else {
    constexpr int kDataChunks = static_cast<int>(kDataBytes / 8);
    constexpr int kPasses = (kDataChunks + 1 + 31) / 32;  // the data chunks, then the scales
#pragma unroll 1
    for (int i = 0; i < kEntriesPerWarp; ++i) {
      const int e = warp + kSparseWarps * i;
      const uint8_t* data = shuffle_pointer(mine.data, i);
      const uint8_t* scales = shuffle_pointer(mine.scales, i);
      if (lane == 0) valid[e] = data != nullptr ? 1 : 0;
      if (data == nullptr) continue;
      uint8_t* target = raw + e * kRawEntryStride;
#pragma unroll
      for (int pass = 0; pass < kPasses; ++pass) {
        const int c = lane + 32 * pass;
        if (c < kDataChunks) {
          cp_async_8(target + c * 8, data + c * 8);
        } else if (c == kDataChunks) {
          cp_async_8(target + kDataBytes, scales);
        }
      }
    }
  }
}

// The raw tile to bf16 rows of E (zero rows for entries that are not real), as the pipelined
// kernel's producer converts a stage: lane l of warp w converts quarter l / 8 of entry
// 8 w + l % 8 (read_share, store_share). All of a thread's shared loads go out before its first
// conversion, a load phase reads 8 rows 20 banks apart (kRawEntryStride), and an entry's scale
// bytes are read once: about 500 instructions a thread, where 16 steps of 8 values, each waiting
// for its flag, codes and scale byte, took about 810 (one-tile CTAs 1.04-1.07x, two tiles
// 1.07-1.09x, H200). Returns whether a real entry held an FP8 NaN code or a NaN scale.
__device__ bool convert_tile(uint8_t* smem, const int* valid, int warp, int lane) {
  static_assert(kEntriesPerWarp * 4 == 32, "a warp's lanes are its entries' four quarters");
  const int entry = kEntriesPerWarp * warp + lane % kEntriesPerWarp;
  const int quarter = lane / kEntriesPerWarp;
  const uint8_t* raw = smem + offsetof(MmaSharedMemory, raw) + entry * kRawEntryStride;
  const uint32_t e_tile = shared_address(smem + offsetof(MmaSharedMemory, e));
  return store_share<ShareScaling::kTwo>(read_share(raw, quarter), valid[entry] != 0, e_tile, entry,
                                         quarter) != 0;
}

// kGroupHeads: the heads of the CTA's group (SparsePlan::group_heads; 32 and 16 only through the
// workspace), the rest of its 64 query rows zero.
template <bool kWide, SparsePartials kPartials, int kGroupHeads>
__global__ void __launch_bounds__(kSparseThreads, 1)
    sparse_decode_mma_kernel(SparseDecodeProblem p, SparsePlan plan, bool q_vector,
                             bool out_vector) {
  constexpr bool kThroughWorkspace = kPartials != SparsePartials::kInCluster;
  hdk::detail::begin_dependent_kernel();
  extern __shared__ __align__(128) uint8_t shared_bytes[];
  // wgmma swizzles by shared-address bits, so the operand tiles start on a 1024-byte boundary.
  uint8_t* smem =
      shared_bytes +
      (kSwizzleAtomBytes - shared_address(shared_bytes) % kSwizzleAtomBytes) % kSwizzleAtomBytes;
  cg::cluster_group cluster = cg::this_cluster();
  const CtaRole role = cta_role<kThroughWorkspace>(plan);
  const int64_t n = role.n;
  const int group = role.group, split = role.split;
  const int64_t head0 = int64_t{group} * kGroupHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int half = warp / 4;     // the warpgroup: its half of S's dims and of O's columns
  const int thread = tid % 128;  // in the warpgroup (wgmma_d_coord)

  MmaSharedMemory& shared = *reinterpret_cast<MmaSharedMemory*>(smem);
  int* valid = shared.valid[0];
  float* stat_m = shared.stat_m;
  float* stat_l = shared.stat_l;
  int* bad = &shared.bad;
  float* factors = shared.factors[0];

  if (tid == 0) {
    *bad = 0;
    if (kWide) hdk::detail::mbarrier_init(&shared.raw_full, kSparseWarps);
  }
  __syncthreads();

  const int64_t tiles = (p.list_length() + kTile - 1) / kTile;
  const int64_t first = split_first_tile(tiles, split, plan.splits);
  const int64_t last = split_first_tile(tiles, split + 1, plan.splits);
  const bool q_async = q_vector && p.q.dtype != DType::kFloat32;
  // A CTA's requests went out at about 30 bytes a nanosecond (cp.async or bulk copies alike,
  // H200), so 64 KiB of queries and 37 KiB of entries took 3 us to land. The first tile's slots
  // go out first; half the queries fill their round trip; then the tile, then the other half.
  LoadedSlot next_slot;
  if (first < last) next_slot = load_slot_now(p, n, tile_entry(first, warp, lane));
  const float sink = load_sink<kGroupHeads>(p, head0, tid);
  if (q_async) {
    copy_queries_async<kGroupHeads>(p, n, head0, shared.q, tid, 0, kEarlyQueryJobs);
  } else {
    load_queries<kGroupHeads>(p, n, head0, false, q_vector, shared.q, bad, tid);
  }
  cp_async_commit();
  if (first < last) {
    const int64_t j = tile_entry(first, warp, lane);
    issue_tile<kWide>(locate_entry(p, j, slot_value(next_slot), bad), smem,
                      valid + (first & 1) * kTile, warp, lane);
  }
  cp_async_commit();
  if (q_async) {
    copy_queries_async<kGroupHeads>(p, n, head0, shared.q, tid, kEarlyQueryJobs, kQueryJobs);
  }
  cp_async_commit();
  if (tid < kHeads) shared.sink[tid] = sink;  // read back by the same thread in finish_row

  const uint32_t q_tile = shared_address(shared.q);
  const uint32_t e_tile = shared_address(shared.e);
  float* exchange = shared.exchange[0];
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
    // The next tile's slots, requested while this tile lands and the last O product runs.
    if (t + 1 < last) next_slot = load_slot_now(p, n, tile_entry(t + 1, warp, lane));
    if (t == first) {
      cp_async_wait<1>();  // the later queries may still be in flight
    } else {
      cp_async_wait<0>();
    }
    if (kWide) hdk::detail::mbarrier_wait(&shared.raw_full, static_cast<uint32_t>(t - first) & 1);
    wgmma_wait<0>();  // the last tile's O = P E no longer reads E
    __syncthreads();  // the raw tile has landed in every thread's view; E is free
    if (convert_tile(smem, tile_valid, warp, lane)) *bad = 1;
    if (t == first) cp_async_wait<0>();  // the queries
    fence_shared_for_wgmma();
    __syncthreads();  // E is complete (and Q, on the first tile); the raw buffer is free
    if (t + 1 < last) {
      const int64_t j = tile_entry(t + 1, warp, lane);
      issue_tile<kWide>(locate_entry(p, j, slot_value(next_slot), bad), smem,
                        valid + ((t + 1) & 1) * kTile, warp, lane);
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

    if (t == first && q_async && half == 0 && !query_rows_finite(s)) *bad = 1;
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
  // A CTA without entries has no scores to tell: its copy of the queries is checked instead.
  if (q_async && first >= last && !queries_finite(shared.q, tid)) *bad = 1;
  const CtaSpace space{
      reinterpret_cast<float*>(shared.q), stat_m, stat_l, shared.sink, bad, factors};
  finish_row<kSparseThreads, kPartials, kGroupHeads, true>(p, plan, space, n, tid, half, half == 0,
                                                           o, row_max, row_sum, out_vector, false);
}

// The workspace instances of one record type, by group size (nullptr: none for that size).
template <SparsePartials kPartials>
TensorCoreKernel mma_workspace_instance(bool wide, int group_heads) {
  switch (group_heads) {
    case kHeads / 4:
      return wide ? sparse_decode_mma_kernel<true, kPartials, kHeads / 4>
                  : sparse_decode_mma_kernel<false, kPartials, kHeads / 4>;
    case kHeads / 2:
      return wide ? sparse_decode_mma_kernel<true, kPartials, kHeads / 2>
                  : sparse_decode_mma_kernel<false, kPartials, kHeads / 2>;
    case kHeads:
      return wide ? sparse_decode_mma_kernel<true, kPartials, kHeads>
                  : sparse_decode_mma_kernel<false, kPartials, kHeads>;
    default:
      return nullptr;
  }
}

}  // namespace

TensorCoreKernel sparse_decode_mma_instance(bool wide, SparsePartials partials, int group_heads) {
  TensorCoreKernel kernel = nullptr;
  switch (partials) {
    case SparsePartials::kInCluster:
      if (group_heads == kHeads) {
        kernel = wide ? sparse_decode_mma_kernel<true, SparsePartials::kInCluster, kHeads>
                      : sparse_decode_mma_kernel<false, SparsePartials::kInCluster, kHeads>;
      }
      break;
    case SparsePartials::kFp32Records:
      kernel = mma_workspace_instance<SparsePartials::kFp32Records>(wide, group_heads);
      break;
    case SparsePartials::kBf16Records:
      kernel = mma_workspace_instance<SparsePartials::kBf16Records>(wide, group_heads);
      break;
  }
  if (kernel != nullptr) return kernel;
  throw Error("hdk::dsv4::sparse_decode: no tensor-core instance for groups of " +
              std::to_string(group_heads) + " heads " +
              (partials != SparsePartials::kInCluster
                   ? "through the workspace (the plan makes 64, 32 or 16)"
                   : "in a cluster (the plan makes 64 there)"));
}

int sparse_decode_mma_shared_bytes() {
  return kSharedBytes;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
