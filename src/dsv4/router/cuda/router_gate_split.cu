// The router's gate GEMM for 17+ rows (router_launch.h says which kernel takes which N): logits =
// hidden · gate_weightᵀ, bf16 inputs, fp32 accumulation on the tensor cores (mma.sync
// m16n8k16), split over D between CTAs that never wait for each other. What the cluster-based
// kernel (router_gate_gemm.cu, now 5-16 rows) taught at these sizes (bench/results, v3 to v5):
//  - a cluster launch and its barriers cost 1.5-2 us on their own, so here each CTA owns a
//    slice of D and writes its partial logits to its own slab of the caller's workspace; the
//    epilogue sums the slabs in slab order (deterministic; no atomics);
//  - with 16 experts per CTA every CTA pulled its rows of hidden from L2 for only 16 experts
//    (22 MB at Pro, N = 64, four times gate_weight); here a CTA owns 32 or 48 experts;
//  - registers cannot hold a CTA's whole slice, and a warp that refills them walks through one
//    memory round trip per refill. Here gate_weight goes straight into registers (each element
//    feeds one warp) while the CTA's rows of hidden (which feed every expert tile) arrive in
//    shared memory, all in flight at once (kLaneCopies says how).
// The k permutation that makes each MMA fragment one 16-byte load: gate_mma.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "core/cuda/async_copy.cuh"
#include "core/cuda/gate_mma.cuh"
#include "core/cuda/mbarrier.cuh"
#include "core/cuda/shared_address.cuh"
#include "core/cuda_helpers.h"
#include "dsv4/router/cuda/router_launch.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::bulk_copy_from_global;
using hdk::detail::cp_async_16;
using hdk::detail::cp_async_arrive;
using hdk::detail::fence_shared_for_async_proxy;
using hdk::detail::mbarrier_arrive_expect_bytes;
using hdk::detail::mbarrier_init;
using hdk::detail::mbarrier_wait;
using hdk::detail::shared_address;

constexpr const char* kOperation = "hdk::dsv4::route";
constexpr int kChunk = 32;         // d values per pair of k16 MMA steps (64 bytes of a row)
constexpr int kTokenTile = 8;      // MMA n8
constexpr int kMaxTokenTiles = 8;  // 64 rows per grid row
constexpr int kRowsPerBlock = kMaxTokenTiles * kTokenTile;
static_assert(kRowsPerBlock == kWorkspaceRowBlock,
              "route_workspace_slabs counts this kernel's grid rows");
constexpr int kDWarps = 4;        // warps that split a CTA's slice of D per expert tile
constexpr int kWeightChunks = 4;  // gate_weight chunks a warp holds in registers per round
// Shared memory for one pass over the slice; a slice longer than that takes several passes.
constexpr int kSharedBudget = 200 * 1024;

struct SplitArgs : GateOperands {
  int64_t slab_stride;   // floats between the workspace's slabs
  int64_t total_chunks;  // ceil(D / 32)
  int slabs;             // D slices, one slab each
  int pass_chunks;       // chunks of D per pass through shared memory
  int row_pitch;         // bytes per row of hidden in shared memory
  bool vector_stores;    // the workspace takes 16-byte stores (aligned base, strides % 4 == 0)
};

// Arrives on the barrier announcing `bytes` of copies, then starts one bulk copy of them.
__device__ __forceinline__ void copy_row(void* destination, const void* source, uint32_t bytes,
                                         uint64_t* barrier) {
  mbarrier_arrive_expect_bytes(barrier, bytes);
  bulk_copy_from_global(shared_address(destination), source, bytes, shared_address(barrier));
}

// One CTA: kExpertTiles m16 tiles of experts by kTokenTiles n8 tiles of rows, over one slice of
// D. Warp w takes expert tile w % kExpertTiles and every kDWarps-th chunk of each pass starting
// at w / kExpertTiles, so the kDWarps warps of an expert tile sweep a pass together.
template <int kExpertTiles, int kTokenTiles>
__global__ void __launch_bounds__(kExpertTiles* kDWarps * 32, 1) gate_split_kernel(SplitArgs args) {
  constexpr int kExperts = kExpertTiles * 16;
  constexpr int kRows = kTokenTiles * kTokenTile;
  constexpr int kThreads = kExpertTiles * kDWarps * 32;
  constexpr int kReducePitch = kExperts + 4;  // floats; conflict-free accumulator stores
  // How the rows of hidden reach shared memory, as measured on an H100
  // (git show 0712de7:bench/results/2026-11-22-h100-dsv4-v7). With 48 experts per CTA (Pro: 57 KB
  // of hidden per CTA at 64 rows), one bulk copy per row queues the rows in the copy engine: the
  // last landed 4.6 us after the CTA started, against 2.5 us with 16-byte cp.async copies spread
  // over the 12 warps, which made 32-64 rows 0.2-0.4 us faster. With 32 experts (8 warps, Flash)
  // the same copies delayed the gate_weight loads behind them and made 17-64 rows 0.3-0.5 us
  // slower.
  constexpr bool kLaneCopies = kExpertTiles == 3;
  extern __shared__ __align__(128) uint8_t split_shared[];
  __shared__ __align__(8) uint64_t rows_arrived;

  // No griddepcontrol.launch_dependents: the epilogue launches when this grid completes. An early
  // trigger (at the start, or after the main loop) made N = 32..64 1.5-2.6 us slower on an H100
  // (git show 0712de7:bench/results/2026-11-22-h100-dsv4-v5): the epilogue's CTAs then wait on the
  // SMs this grid uses.
  const int slab = static_cast<int>(blockIdx.x % args.slabs);
  const int64_t expert_base = static_cast<int64_t>(blockIdx.x / args.slabs) * kExperts;
  const int64_t token_base = static_cast<int64_t>(blockIdx.y) * kRowsPerBlock;
  const int64_t chunk_begin = slab * args.total_chunks / args.slabs;
  const int64_t chunk_end = (slab + 1) * args.total_chunks / args.slabs;
  const int64_t d_end = at_most(chunk_end * kChunk, args.D);
  const int valid_rows = static_cast<int>(at_most(kRows, args.N - token_base));

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // MMA row/column group
  const int thread = lane & 3;  // position inside the group
  const int expert_tile = warp % kExpertTiles;
  const int d_warp = warp / kExpertTiles;

  if (threadIdx.x == 0) mbarrier_init(&rows_arrived, kLaneCopies ? kThreads : valid_rows);
  __syncthreads();

  // This thread's A rows: experts group and group + 8 of its tile, clamped (an expert past E
  // only produces outputs that are never stored).
  const uint16_t* weight_rows[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t expert = expert_base + expert_tile * 16 + h * 8 + group;
    weight_rows[h] = args.weight + at_most(expert, args.E - 1) * args.weight_stride;
  }
  const uint8_t* hidden_shared = split_shared + group * args.row_pitch + 16 * thread;

  // The pass's rows of hidden, issued before any gate_weight load (cp.async copies issued after
  // them landed 2.2 us later, and Pro at 64 rows took 0.5 us longer). Rows past N are not
  // copied: they feed only output columns that are never stored.
  auto copy_rows = [&](int64_t pass_begin, int64_t pass_end) {
    const int64_t d = pass_begin * kChunk;
    const int64_t d_stop = at_most(pass_end * kChunk, d_end);
    if (kLaneCopies) {
      // Warp w copies rows w, w + warps, ..., 16 bytes per lane and step; this thread's
      // arrival comes when its copies have landed.
      const int row_vectors = static_cast<int>((d_stop - d) / 8);
      for (int row = warp; row < valid_rows; row += kThreads / 32) {
        const uint16_t* source = args.hidden + (token_base + row) * args.hidden_stride + d;
        const uint32_t destination = shared_address(split_shared + row * args.row_pitch);
        for (int v = lane; v < row_vectors; v += 32)
          cp_async_16(destination + 16 * v, source + 8 * v);
      }
      cp_async_arrive(&rows_arrived);
    } else if (threadIdx.x < valid_rows) {
      // The previous pass's rows were read through the generic proxy; order those reads
      // before the bulk copies (async proxy) overwrite them.
      fence_shared_for_async_proxy();
      copy_row(split_shared + threadIdx.x * args.row_pitch,
               args.hidden + (token_base + threadIdx.x) * args.hidden_stride + d,
               static_cast<uint32_t>((d_stop - d) * 2), &rows_arrived);
    }
  };

  float acc[kTokenTiles][4] = {};
  uint32_t parity = 0;
  for (int64_t pass_begin = chunk_begin; pass_begin < chunk_end;
       pass_begin += args.pass_chunks, parity ^= 1u) {
    const int64_t pass_end = at_most(pass_begin + args.pass_chunks, chunk_end);
    copy_rows(pass_begin, pass_end);
    bool waited = false;
    for (int64_t first = pass_begin + d_warp; first < pass_end;
         first += static_cast<int64_t>(kDWarps) * kWeightChunks) {
      // Every gate_weight load of the round is issued before the wait for hidden and before any
      // use; a column past the slice reads column 0 and is zeroed (with its hidden fragment).
      uint4 a[kWeightChunks][2];
      bool in_range[kWeightChunks];
#pragma unroll
      for (int i = 0; i < kWeightChunks; ++i) {
        const int64_t chunk = first + static_cast<int64_t>(kDWarps) * i;
        const int64_t d = chunk * kChunk + 8 * thread;
        in_range[i] = chunk < pass_end && d < d_end;
        const int64_t column = in_range[i] ? d : 0;
#pragma unroll
        for (int h = 0; h < 2; ++h)
          a[i][h] = __ldg(reinterpret_cast<const uint4*>(weight_rows[h] + column));
      }
      if (!waited) {
        mbarrier_wait(&rows_arrived, parity);
        waited = true;
      }
#pragma unroll
      for (int i = 0; i < kWeightChunks; ++i) {
        const int64_t chunk = first + static_cast<int64_t>(kDWarps) * i;
        if (chunk >= pass_end) break;  // warp-uniform
        const uint4 lo = zero_unless(in_range[i], a[i][0]);
        const uint4 hi = zero_unless(in_range[i], a[i][1]);
        const uint8_t* column = hidden_shared + (chunk - pass_begin) * (kChunk * 2);
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const uint4 b = zero_unless(in_range[i], *reinterpret_cast<const uint4*>(
                                                       column + j * kTokenTile * args.row_pitch));
          mma_chunk(acc[j], lo, hi, b);
        }
      }
    }
    if (!waited) mbarrier_wait(&rows_arrived, parity);  // keeps every thread's phase in step
    // Every warp is done with this pass's rows before the next pass (or the sums) reuses them.
    __syncthreads();
  }

  // The kDWarps partial sums of each (row, expert), added in d order through shared memory.
  float* sums = reinterpret_cast<float*>(split_shared);  // [kDWarps][kRows][kReducePitch]
  {
    float* mine = sums + d_warp * kRows * kReducePitch + expert_tile * 16 + group;
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      float* row = mine + (j * kTokenTile + 2 * thread) * kReducePitch;
      row[0] = acc[j][0];
      row[kReducePitch] = acc[j][1];
      row[8] = acc[j][2];
      row[kReducePitch + 8] = acc[j][3];
    }
  }
  __syncthreads();
  // Four experts per thread and step: 16-byte shared loads, and 16-byte global stores where the
  // workspace allows them (one expert per step, this took 1.0 us of a Pro CTA's 7.2 us at 64
  // rows on an H100).
  float* slab_base = args.logits + slab * args.slab_stride;
  constexpr int kQuadsPerRow = kExperts / 4;
#pragma unroll
  for (int q = threadIdx.x; q < kRows * kQuadsPerRow; q += kThreads) {
    const int row = q / kQuadsPerRow;
    const int expert = q % kQuadsPerRow * 4;
    float4 sum = *reinterpret_cast<const float4*>(sums + row * kReducePitch + expert);
#pragma unroll
    for (int w = 1; w < kDWarps; ++w) {
      const float4 part =
          *reinterpret_cast<const float4*>(sums + (w * kRows + row) * kReducePitch + expert);
      sum.x += part.x;
      sum.y += part.y;
      sum.z += part.z;
      sum.w += part.w;
    }
    const int64_t n = token_base + row;
    const int64_t e = expert_base + expert;
    if (n >= args.N) continue;
    float* out = slab_base + n * args.logits_stride + e;
    if (args.vector_stores && e + 3 < args.E) {
      *reinterpret_cast<float4*>(out) = sum;
    } else {
      const float values[4] = {sum.x, sum.y, sum.z, sum.w};
#pragma unroll
      for (int k = 0; k < 4; ++k)
        if (e + k < args.E) out[k] = values[k];
    }
  }
}

template <int kExpertTiles, int kTokenTiles>
void launch(const SplitArgs& args, const dim3& grid, int shared_bytes, int device,
            cudaStream_t stream) {
  const auto kernel = gate_split_kernel<kExpertTiles, kTokenTiles>;
  hdk::detail::allow_dynamic_shared_memory(kernel, shared_bytes, device, kOperation);
  kernel<<<grid, kExpertTiles * kDWarps * 32, shared_bytes, stream>>>(args);
  hdk::detail::check_launch(cudaGetLastError(), kOperation, "launching the split gate GEMM kernel");
}

template <int kExpertTiles>
void launch_rows(int token_tiles, const SplitArgs& args, const dim3& grid, int shared_bytes,
                 int device, cudaStream_t stream) {
  if (token_tiles == 4) {
    launch<kExpertTiles, 4>(args, grid, shared_bytes, device, stream);
  } else {
    launch<kExpertTiles, 8>(args, grid, shared_bytes, device, stream);
  }
}

}  // namespace

int launch_gate_split(const RouterProblem& p, int device, cudaStream_t stream) {
  const int64_t sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  SplitArgs args;
  static_cast<GateOperands&>(args) = gate_operands(p);
  args.slab_stride = p.logits_workspace_slab_stride;
  args.total_chunks = (p.hidden_size + kChunk - 1) / kChunk;
  args.vector_stores = reinterpret_cast<uintptr_t>(p.logits_workspace) % 16 == 0 &&
                       p.logits_workspace_row_stride % 4 == 0 &&
                       p.logits_workspace_slab_stride % 4 == 0;
  const int64_t row_blocks = (p.num_tokens + kRowsPerBlock - 1) / kRowsPerBlock;
  // 32 experts per CTA while that still fills the SMs with the most slices (Flash: 8 groups x
  // 16); 48 otherwise (Pro: 8 x 16 instead of 12 x 11), so each CTA's rows of hidden serve more
  // experts.
  const int expert_tiles =
      (p.num_experts + 31) / 32 * kWorkspaceMaxSlabs * row_blocks <= sm_count ? 2 : 3;
  const int64_t experts = expert_tiles * 16;
  const int64_t groups = (p.num_experts + experts - 1) / experts;
  // As many D slices as fill the SMs once, within the workspace's slabs and D's chunks.
  const int64_t slabs =
      std::min<int64_t>({std::max<int64_t>(1, sm_count / (groups * row_blocks)),
                         p.logits_workspace_slabs, kWorkspaceMaxSlabs, args.total_chunks});
  args.slabs = static_cast<int>(slabs);
  const int64_t rows = std::min<int64_t>(p.num_tokens, kRowsPerBlock);
  // 17+ rows (kClusterGateMaxRows): 4 or 8 n8 tiles; fewer would serve no dispatched N.
  const int token_tiles = rows <= 32 ? 4 : 8;
  const int padded_rows = token_tiles * kTokenTile;
  // Rows pitched at 64 mod 128 bytes: a warp's 16-byte fragment loads (8 rows x 64 bytes) hit
  // every bank once per quarter warp.
  const int64_t slice_chunks = (args.total_chunks + slabs - 1) / slabs;
  const int max_pass_chunks = (kSharedBudget / padded_rows - 64) / (kChunk * 2) / 2 * 2;
  args.pass_chunks = static_cast<int>(std::min<int64_t>(slice_chunks, max_pass_chunks));
  args.row_pitch = (args.pass_chunks * kChunk * 2 + 127) / 128 * 128 + 64;
  const int reduce_bytes = kDWarps * padded_rows * static_cast<int>(experts + 4) * 4;
  const int shared_bytes = std::max(padded_rows * args.row_pitch, reduce_bytes);
  const dim3 grid(static_cast<unsigned>(groups * slabs), static_cast<unsigned>(row_blocks), 1);
  if (expert_tiles == 2) {
    launch_rows<2>(token_tiles, args, grid, shared_bytes, device, stream);
  } else {
    launch_rows<3>(token_tiles, args, grid, shared_bytes, device, stream);
  }
  return args.slabs;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
