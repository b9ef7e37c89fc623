// The router's gate GEMM for 5-16 rows (router_launch.h says which kernel takes which N):
// logits[n, e] = hidden[n] · gate_weight[e], bf16 inputs, fp32 accumulation on the tensor cores
// (mma.sync m16n8k16), up to 16 rows per grid row. The work is bound by reading gate_weight
// (2 MiB Flash, 5.25 MiB Pro) once and by latency, so the layout keeps the chain from the first
// load to the last store short:
//  - a cluster of kGateSplits CTAs owns 16 experts and its CTAs split D, so the grid has
//    E/16 * 8 CTAs (128 Flash, 192 Pro), each streaming a distinct 16-28 KiB slice of
//    gate_weight;
//  - every warp issues all loads of a round (gate_weight from DRAM, hidden from L2, 16 bytes
//    each, straight into MMA fragments) before it uses any of them: no shared-memory staging
//    and no block barrier before the first MMA. Each hidden element feeds exactly one warp, so
//    staging would buy no reuse;
//  - partial logits are summed in a fixed order, so results are deterministic: the CTA's warps
//    through shared memory, then the cluster's 8 CTAs, each CTA pushing the slice another CTA
//    finishes into that CTA's shared memory. One blocking cluster barrier; the earlier one (that
//    every peer runs before the first remote store) is hidden behind the loads.
// The k permutation that makes each MMA fragment one 16-byte load: gate_mma.cuh.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "core/cuda/cluster_barrier.cuh"
#include "core/cuda/gate_mma.cuh"
#include "core/cuda_helpers.h"
#include "dsv4/router/cuda/router_launch.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

namespace cg = cooperative_groups;

constexpr const char* kOperation = "hdk::dsv4::route";
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 32;         // d values per pair of k16 MMA steps
constexpr int kTokenTile = 8;      // MMA n8
constexpr int kMaxTokenTiles = 2;  // 16 rows per grid row
constexpr int kExperts = 16;       // MMA m16: experts per CTA

struct GemmArgs : GateOperands {
  int64_t total_chunks;  // ceil(D / 32)
};

// A CTA's work: one m16 tile of experts by kTokenTiles n8 tiles of rows, over its slice of D.
// Each of its 8 warps takes every row tile and every 8th group of D chunks. At most 2 row tiles:
// for 17-64 rows the split kernel is 0.1-1.8 us faster than this one with 4 or 8.
template <int kTokenTiles>
struct CtaShape {
  static_assert(kTokenTiles <= kMaxTokenTiles, "1 or 2 row tiles");
  static constexpr int kWarpTiles = kTokenTiles;
  static constexpr int kDGroups = kWarps;
  static constexpr int kWeightChunks = 4;  // gate_weight chunks in registers per round
  static constexpr int kHiddenChunks = 4;  // hidden chunks per sub-round
  static constexpr int kEntries = kTokenTiles * kTokenTile * kExperts;  // CTA partial logits
  static constexpr int kSegment = kEntries / kGateSplits;  // the part one cluster CTA finishes
};

__device__ __forceinline__ uint4 load_16_bytes(const uint16_t* address) {
  return __ldg(reinterpret_cast<const uint4*>(address));
}

template <int kTokenTiles>
__global__ void __launch_bounds__(kThreads, 2) gate_gemm_kernel(GemmArgs args) {
  using Shape = CtaShape<kTokenTiles>;
  constexpr int kWarpTiles = Shape::kWarpTiles;
  constexpr int kDGroups = Shape::kDGroups;
  constexpr int kWeightChunks = Shape::kWeightChunks;
  constexpr int kHiddenChunks = Shape::kHiddenChunks;
  constexpr int kEntries = Shape::kEntries;
  constexpr int kSegment = Shape::kSegment;
  __shared__ __align__(16) float partial[kDGroups][kTokenTiles][kExperts][kTokenTile];
  __shared__ float received[kGateSplits][kSegment];

  // The epilogue may launch now: it waits (griddepcontrol.wait) for this grid to complete.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  // A CTA may store into a peer's shared memory only once the peer runs: announce this CTA now
  // and wait for the others just before the first remote store, long after the loads.
  hdk::detail::cluster_arrive_relaxed();

  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t expert_base = static_cast<int64_t>(blockIdx.x / kGateSplits) * kExperts;
  const int64_t token_base = static_cast<int64_t>(blockIdx.y) * kTokenTiles * kTokenTile;
  const int64_t chunk_begin = rank * args.total_chunks / kGateSplits;
  const int64_t chunk_end = (rank + 1) * args.total_chunks / kGateSplits;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // MMA row/column group
  const int thread = lane & 3;  // position inside the group
  const int d_group = warp % kDGroups;

  // Clamped addresses (loads are unconditional: a load under a branch waits for the previous
  // one); what lies outside the matrices is zeroed after the load. This thread's A rows are
  // experts group (lo) and group + 8 (hi) of the tile.
  const uint16_t* weight_rows[2];
  bool expert_valid[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t expert = expert_base + h * 8 + group;
    expert_valid[h] = expert < args.E;
    weight_rows[h] = args.weight + at_most(expert, args.E - 1) * args.weight_stride;
  }
  const uint16_t* hidden_rows[kWarpTiles];
#pragma unroll
  for (int j = 0; j < kWarpTiles; ++j) {
    const int64_t row = token_base + j * kTokenTile + group;
    hidden_rows[j] = args.hidden + at_most(row, args.N - 1) * args.hidden_stride;
  }

  float acc[kWarpTiles][4] = {};
  for (int64_t first = chunk_begin + d_group; first < chunk_end;
       first += static_cast<int64_t>(kDGroups) * kWeightChunks) {
    uint4 a[kWeightChunks][2];
#pragma unroll
    for (int i = 0; i < kWeightChunks; ++i) {
      const int64_t chunk = first + static_cast<int64_t>(kDGroups) * i;
      const int64_t d = chunk * kChunk + 8 * thread;
      const bool in_range = chunk < chunk_end && d < args.D;
      const int64_t column = in_range ? d : 0;
#pragma unroll
      for (int h = 0; h < 2; ++h)
        a[i][h] = zero_unless(in_range && expert_valid[h], load_16_bytes(weight_rows[h] + column));
    }
#pragma unroll
    for (int sub = 0; sub < kWeightChunks; sub += kHiddenChunks) {
      // Warp-uniform: a sub-round wholly past this CTA's slice issues no loads.
      if (first + static_cast<int64_t>(kDGroups) * sub >= chunk_end) break;
      uint4 b[kHiddenChunks][kWarpTiles];
#pragma unroll
      for (int i = 0; i < kHiddenChunks; ++i) {
        const int64_t chunk = first + static_cast<int64_t>(kDGroups) * (sub + i);
        const int64_t d = chunk * kChunk + 8 * thread;
        const bool in_range = chunk < chunk_end && d < args.D;
        const int64_t column = in_range ? d : 0;
#pragma unroll
        for (int j = 0; j < kWarpTiles; ++j)
          b[i][j] = zero_unless(in_range, load_16_bytes(hidden_rows[j] + column));
      }
#pragma unroll
      for (int i = 0; i < kHiddenChunks; ++i) {
        // Warp-uniform: skips the MMAs of chunks past this CTA's slice.
        if (first + static_cast<int64_t>(kDGroups) * (sub + i) >= chunk_end) break;
        const uint4& lo = a[sub + i][0];
        const uint4& hi = a[sub + i][1];
#pragma unroll
        for (int j = 0; j < kWarpTiles; ++j) {
          mma_chunk(acc[j], lo, hi, b[i][j]);
        }
      }
    }
  }

  // Accumulator (row = expert, column = token) -> partial[d_group][tile][expert][token].
#pragma unroll
  for (int j = 0; j < kWarpTiles; ++j) {
    float* tile = &partial[d_group][j][0][0];
    *reinterpret_cast<float2*>(tile + group * kTokenTile + 2 * thread) =
        make_float2(acc[j][0], acc[j][1]);
    *reinterpret_cast<float2*>(tile + (group + 8) * kTokenTile + 2 * thread) =
        make_float2(acc[j][2], acc[j][3]);
  }
  __syncthreads();
  hdk::detail::cluster_wait();  // every peer runs now

  // Sum the D groups in order; entry i goes to CTA i / kSegment, which finishes it.
  const float* flat = &partial[0][0][0][0];
  for (int i = threadIdx.x; i < kEntries; i += kThreads) {
    float sum = flat[i];
#pragma unroll
    for (int g = 1; g < kDGroups; ++g)
      sum += flat[g * kEntries + i];
    float* target = cluster.map_shared_rank(&received[rank][0], i / kSegment);
    target[i % kSegment] = sum;
  }
  cluster.sync();  // release the remote stores; acquire the peers' stores into `received`

  // This CTA's segment: the cluster's 8 partial sums in rank order.
  for (int t = threadIdx.x; t < kSegment; t += kThreads) {
    float sum = received[0][t];
#pragma unroll
    for (int source = 1; source < kGateSplits; ++source)
      sum += received[source][t];
    const int entry = rank * kSegment + t;  // [tile][expert][token in tile]
    const int tile = entry / (kExperts * kTokenTile);
    const int expert = (entry / kTokenTile) % kExperts;
    const int64_t n = token_base + tile * kTokenTile + entry % kTokenTile;
    const int64_t e = expert_base + expert;
    if (n < args.N && e < args.E) args.logits[n * args.logits_stride + e] = sum;
  }
}

template <int kTokenTiles>
void launch(const GemmArgs& args, cudaStream_t stream) {
  constexpr int kRows = kTokenTiles * kTokenTile;
  const hdk::detail::ClusterLaunch launch(
      dim3(static_cast<unsigned>((args.E + kExperts - 1) / kExperts * kGateSplits),
           static_cast<unsigned>((args.N + kRows - 1) / kRows), 1),
      kThreads, 0, stream, kGateSplits);
  hdk::detail::check_launch(cudaLaunchKernelEx(&launch.config, gate_gemm_kernel<kTokenTiles>, args),
                            kOperation, "launching the gate GEMM kernel");
}

}  // namespace

void launch_gate_gemm(const RouterProblem& p, cudaStream_t stream) {
  GemmArgs args;
  static_cast<GateOperands&>(args) = gate_operands(p);
  args.total_chunks = (p.hidden_size + kChunk - 1) / kChunk;
  // Fewest n8 tiles that hold the rows; more than 16 rows would run as further grid rows.
  const int64_t tiles = (std::min<int64_t>(p.num_tokens, kMaxTokenTiles * kTokenTile) + 7) / 8;
  if (tiles <= 1) {
    launch<1>(args, stream);
  } else {
    launch<2>(args, stream);
  }
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
