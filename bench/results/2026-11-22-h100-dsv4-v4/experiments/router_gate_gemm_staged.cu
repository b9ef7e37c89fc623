// Experiment record (2026-11-22, 4th session), not built: the staged gate kernel as measured
// in its "cp.async lean" form (see ../README.md). It needed router_gate_mma.cuh (this folder),
// kStagedMinRows and try_launch_gate_gemm_staged in router_launch.h, and a dispatch in
// router_cuda.cu (HDK_ROUTER_GATE=registers to bypass it). The "bulk copy" variant replaced
// stage_rows with one cp.async.bulk per row counted on an mbarrier, and padded rows instead of
// swizzling them.
// The router's gate GEMM for 17 or more rows: logits[n, e] = hidden[n] · gate_weight[e], bf16
// inputs, fp32 accumulation on the tensor cores, up to 64 rows per grid row.
// The register-fed kernel (router_gate_gemm.cu) gives each CTA 16 experts, so the 24 expert
// groups of Pro each pull all of hidden's slice from L2 (22 MB at N = 64 against 5.5 MB of
// gate_weight), and a warp's registers hold only part of its loads, so the CTA walks through up
// to four dependent memory round trips. This kernel trades those for shared memory:
//  - a cluster of 16 CTAs (non-portable size) splits D, and each CTA owns 16-64 experts (E / 16
//    per group of 16 SMs, rounded up to whole m16 tiles: 32 Flash, 48 Pro), so the grid is
//    about one CTA per SM (128 for both presets) and hidden is pulled a third as often;
//  - the CTA copies its whole slice, gate_weight and hidden rows alike, into shared memory with
//    cp.async (no registers held) before anything waits: one round trip, then MMAs fed from
//    shared memory (a row swizzle keeps each 16-byte fragment load free of bank conflicts);
//  - the staging space then holds the warps' partial sums, and the cluster finishes them in a
//    fixed order through distributed shared memory (router_gate_mma.cuh): deterministic.
// It applies when the slice fits in 112 KiB (two CTAs per SM, so a 16-CTA cluster needs 8 SMs
// of a GPC) and the device can run such a cluster; otherwise the register-fed kernel runs.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "core/cuda_helpers.h"
#include "dsv4/cuda/router_gate_mma.cuh"
#include "dsv4/cuda/router_launch.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr const char* kOperation = "hdk::dsv4::route";
constexpr int kSplits = 16;  // CTAs per cluster, splitting D
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxExpertTiles = 4;
constexpr int kMaxTokenTiles = 8;          // 64 rows per grid row
constexpr int kSharedBudget = 112 * 1024;  // per CTA, static included: two CTAs per SM
constexpr int kMaxDevices = 64;

struct StagedArgs : GateOperands {
  int64_t total_chunks;  // ceil(D / 32)
  int pitch;             // 16-byte units per staged row: the longest slice's chunks times 4
  int swizzle;           // XORed into the unit index of odd rows (see the kernel)
};

template <int kExpertTiles, int kTokenTiles>
struct StagedShape {
  // As in the register-fed kernel: a warp covers at most 4 row tiles; the rest of the warps
  // split the slice's chunks (D groups), whose partial sums meet in shared memory.
  static constexpr int kWarpTiles = kTokenTiles < 4 ? kTokenTiles : 4;
  static constexpr int kTokenSplits = kTokenTiles / kWarpTiles;
  static constexpr int kDGroups = kWarps / kTokenSplits;
  static constexpr int kWeightRows = kExpertTiles * kMmaExperts;
  static constexpr int kHiddenRows = kTokenTiles * kMmaTokens;
  static constexpr int kEntries = kExpertTiles * kTokenTiles * kMmaTileEntries;
  static constexpr int kPartialBytes = kDGroups * kEntries * 4;
  static constexpr int kReceivedBytes = kEntries * 4;  // static shared memory
};

// 16 bytes global -> shared without passing through registers; `valid == false` writes zeros
// and reads nothing.
__device__ __forceinline__ void copy_16_bytes_async(uint32_t shared_address, const void* global,
                                                    bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address), "l"(global),
               "r"(valid ? 16 : 0)
               : "memory");
}

// Copies rows first_index .. first_index + kRows - 1 of `matrix`, columns d_begin .. d_begin +
// 8 * units - 1, to kRows staged rows at `destination`: warp w takes rows w, w + 8, ..., its
// lanes the 16-byte units. Rows at or past `count` and units at or past `d_units` (past D) are
// zero-filled. The caller guarantees first_index < count. Odd rows swap the two 64-byte halves
// of each 128 bytes when the pitch is a multiple of 128 bytes (`swizzle` = 4 units), so that the
// 8 lanes of a quarter warp, which read 64 bytes from each of two adjacent rows, hit distinct
// banks. Kept lean: the issue of these copies, not their latency, was the kernel's longest
// phase in Nsight Compute when the index arithmetic was 64-bit per copy.
template <int kRows>
__device__ __forceinline__ void stage_rows(uint32_t destination, const uint16_t* matrix,
                                           int64_t stride, int64_t first_index, int64_t count,
                                           int64_t d_begin, int units, int d_units, int pitch,
                                           int swizzle, int warp, int lane) {
  static_assert(kRows % kWarps == 0, "each warp stages the same number of rows");
#pragma unroll
  for (int r = 0; r < kRows / kWarps; ++r) {
    const int row = warp + r * kWarps;
    const bool row_valid = first_index + row < count;
    const uint16_t* source =
        matrix + (row_valid ? first_index + row : first_index) * stride + d_begin;
    const int valid_units = row_valid ? d_units : 0;
    const uint32_t row_address = destination + 16u * static_cast<uint32_t>(row * pitch);
    for (int unit = lane; unit < units; unit += 32) {
      const bool valid = unit < valid_units;
      copy_16_bytes_async(row_address + 16u * static_cast<uint32_t>(unit ^ swizzle),
                          source + (valid ? 8 * unit : 0), valid);
    }
  }
}

template <int kExpertTiles, int kTokenTiles>
__global__ void __launch_bounds__(kThreads, 2) gate_gemm_staged_kernel(StagedArgs args) {
  using Shape = StagedShape<kExpertTiles, kTokenTiles>;
  constexpr int kWarpTiles = Shape::kWarpTiles;
  constexpr int kDGroups = Shape::kDGroups;
  constexpr int kWeightRows = Shape::kWeightRows;
  constexpr int kEntries = Shape::kEntries;
  // [kWeightRows + kHiddenRows][pitch] 16-byte units; after the MMAs, [kDGroups][kEntries] sums.
  extern __shared__ uint4 staged[];
  __shared__ float received[kSplits][kEntries / kSplits];

  // The epilogue may launch now: it waits (griddepcontrol.wait) for this grid to complete.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  // A CTA may store into a peer's shared memory only once the peer runs: announce this CTA now
  // and wait for the others just before the first remote store (finish_cluster_sums).
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");

  const int rank = static_cast<int>(cooperative_groups::this_cluster().block_rank());
  const int64_t expert_base = static_cast<int64_t>(blockIdx.x / kSplits) * kWeightRows;
  const int64_t token_base = static_cast<int64_t>(blockIdx.y) * Shape::kHiddenRows;
  const int64_t chunk_begin = rank * args.total_chunks / kSplits;
  const int chunks = static_cast<int>((rank + 1) * args.total_chunks / kSplits - chunk_begin);
  const int64_t d_begin = chunk_begin * kChunk;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;

  // Stage the slice: every copy is issued before any is waited for.
  const uint32_t staged_address = static_cast<uint32_t>(__cvta_generic_to_shared(staged));
  const int units = chunks * (kChunk / 8);
  const int64_t units_within_d = (args.D - d_begin) / 8;  // negative for an empty last slice
  const int d_units = units_within_d < units ? static_cast<int>(units_within_d) : units;
  const int swizzle = (warp & 1) ? args.swizzle : 0;  // a warp's rows share its parity
  stage_rows<kWeightRows>(staged_address, args.weight, args.weight_stride, expert_base, args.E,
                          d_begin, units, d_units, args.pitch, swizzle, warp, lane);
  stage_rows<Shape::kHiddenRows>(staged_address + 16u * kWeightRows * args.pitch, args.hidden,
                                 args.hidden_stride, token_base, args.N, d_begin, units, d_units,
                                 args.pitch, swizzle, warp, lane);
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
  __syncthreads();

  const int group = lane >> 2;  // MMA row/column group
  const int thread = lane & 3;  // position inside the group
  const int d_group = warp % kDGroups;
  const int first_tile = (warp / kDGroups) * kWarpTiles;
  // Every row this thread reads has the parity of `group` (tiles start at multiples of 8).
  const int fragment_swizzle = (group & 1) ? args.swizzle : 0;
  const uint4* weight_rows = staged + group * args.pitch;
  const uint4* hidden_rows = staged + (kWeightRows + first_tile * kMmaTokens + group) * args.pitch;
  const int tile_rows = 8 * args.pitch;  // units between row r and row r + 8

  float acc[kExpertTiles][kWarpTiles][4] = {};
#pragma unroll 2
  for (int chunk = d_group; chunk < chunks; chunk += kDGroups) {
    const int unit = (chunk * (kChunk / 8) + thread) ^ fragment_swizzle;
    uint4 b[kWarpTiles];
#pragma unroll
    for (int j = 0; j < kWarpTiles; ++j)
      b[j] = hidden_rows[j * tile_rows + unit];
#pragma unroll
    for (int x = 0; x < kExpertTiles; ++x) {
      const uint4 lo = weight_rows[2 * x * tile_rows + unit];
      const uint4 hi = weight_rows[(2 * x + 1) * tile_rows + unit];
#pragma unroll
      for (int j = 0; j < kWarpTiles; ++j)
        mma_chunk(acc[x][j], lo, hi, b[j]);
    }
  }
  __syncthreads();  // the staged slice is dead: its space takes the partial sums

  float* partial = reinterpret_cast<float*>(staged);
#pragma unroll
  for (int x = 0; x < kExpertTiles; ++x) {
#pragma unroll
    for (int j = 0; j < kWarpTiles; ++j) {
      const int tile = x * kTokenTiles + first_tile + j;
      store_accumulator_tile(partial + d_group * kEntries + tile * kMmaTileEntries, acc[x][j],
                             lane);
    }
  }
  __syncthreads();
  finish_cluster_sums<kSplits, kDGroups, kEntries, kTokenTiles, kThreads>(partial, received, args,
                                                                          expert_base, token_base);
}

// Whether a cluster of this variant, at the full shared memory budget, can run on `device`;
// asked once per device (the attributes it sets are host-side, legal during graph capture).
template <int kExpertTiles, int kTokenTiles>
bool variant_runs_on(int device) {
  static std::atomic<int> known[kMaxDevices] = {};  // 0 unknown, 1 runs, -1 does not
  if (device < 0 || device >= kMaxDevices) return false;
  const int state = known[device].load(std::memory_order_relaxed);
  if (state != 0) return state > 0;
  const auto kernel = gate_gemm_staged_kernel<kExpertTiles, kTokenTiles>;
  const int dynamic_bytes = kSharedBudget - StagedShape<kExpertTiles, kTokenTiles>::kReceivedBytes;
  bool runs = cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
                  cudaSuccess &&
              cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                   dynamic_bytes) == cudaSuccess;
  if (runs) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(kSplits, 1, 1);
    config.blockDim = dim3(kThreads, 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(dynamic_bytes);
    cudaLaunchAttribute attributes[1];
    attributes[0].id = cudaLaunchAttributeClusterDimension;
    attributes[0].val.clusterDim.x = kSplits;
    attributes[0].val.clusterDim.y = 1;
    attributes[0].val.clusterDim.z = 1;
    config.attrs = attributes;
    config.numAttrs = 1;
    int clusters = 0;
    runs =
        cudaOccupancyMaxActiveClusters(&clusters, kernel, &config) == cudaSuccess && clusters > 0;
  }
  if (!runs) cudaGetLastError();  // a refused attribute or query is an answer, not an error
  known[device].store(runs ? 1 : -1, std::memory_order_relaxed);
  return runs;
}

template <int kExpertTiles, int kTokenTiles>
bool launch(const StagedArgs& args, int device, cudaStream_t stream) {
  using Shape = StagedShape<kExpertTiles, kTokenTiles>;
  const int64_t staged_bytes =
      static_cast<int64_t>(Shape::kWeightRows + Shape::kHiddenRows) * args.pitch * 16;
  const int64_t dynamic_bytes = std::max<int64_t>(staged_bytes, Shape::kPartialBytes);
  if (dynamic_bytes + Shape::kReceivedBytes > kSharedBudget) return false;
  if (!variant_runs_on<kExpertTiles, kTokenTiles>(device)) return false;

  cudaLaunchConfig_t config = {};
  config.gridDim =
      dim3(static_cast<unsigned>((args.E + Shape::kWeightRows - 1) / Shape::kWeightRows * kSplits),
           static_cast<unsigned>((args.N + Shape::kHiddenRows - 1) / Shape::kHiddenRows), 1);
  config.blockDim = dim3(kThreads, 1, 1);
  config.dynamicSmemBytes = static_cast<size_t>(dynamic_bytes);
  config.stream = stream;
  cudaLaunchAttribute attributes[1];
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kSplits;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  config.attrs = attributes;
  config.numAttrs = 1;
  hdk::detail::check_launch(
      cudaLaunchKernelEx(&config, gate_gemm_staged_kernel<kExpertTiles, kTokenTiles>, args),
      kOperation, "launching the staged gate GEMM kernel");
  return true;
}

template <int kTokenTiles>
bool launch_with_token_tiles(const StagedArgs& args, int expert_tiles, int device,
                             cudaStream_t stream) {
  // Fewer expert tiles need less shared memory: step down until the slice fits.
  return (expert_tiles >= 4 && launch<4, kTokenTiles>(args, device, stream)) ||
         (expert_tiles >= 3 && launch<3, kTokenTiles>(args, device, stream)) ||
         (expert_tiles >= 2 && launch<2, kTokenTiles>(args, device, stream)) ||
         launch<1, kTokenTiles>(args, device, stream);
}

}  // namespace

bool try_launch_gate_gemm_staged(const RouterProblem& p, int device, cudaStream_t stream) {
  if (p.num_tokens < kStagedMinRows) return false;
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  StagedArgs args;
  static_cast<GateOperands&>(args) = gate_operands(p);
  args.total_chunks = (p.hidden_size + kChunk - 1) / kChunk;
  const int64_t slice_chunks = (args.total_chunks + kSplits - 1) / kSplits;
  args.pitch = static_cast<int>(slice_chunks * (kChunk / 8));
  args.swizzle = args.pitch % 8 == 0 ? 4 : 0;
  // Enough experts per CTA that one group of 16 CTAs per 16 SMs covers E in one wave.
  const int64_t expert_tiles_total = (p.num_experts + kMmaExperts - 1) / kMmaExperts;
  const int64_t groups = std::max(1, sm_count / kSplits);
  const int expert_tiles = static_cast<int>(
      std::min<int64_t>((expert_tiles_total + groups - 1) / groups, kMaxExpertTiles));
  if (p.num_tokens <= 4 * kMmaTokens)
    return launch_with_token_tiles<4>(args, expert_tiles, device, stream);
  return launch_with_token_tiles<kMaxTokenTiles>(args, expert_tiles, device, stream);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
