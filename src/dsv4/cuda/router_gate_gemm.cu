// The router's gate GEMM on the decode path: logits[n, e] = hidden[n] · gate_weight[e], bf16
// inputs, fp32 accumulation on the tensor cores (mma.sync m16n8k16), for N up to 64 rows per grid
// row. The work is bound by reading gate_weight (2 MiB Flash, 5.25 MiB Pro) once, so the layout
// is chosen for that read:
//  - a cluster of kGateSplits CTAs owns 32 experts; its CTAs split D, so the grid has
//    E/32 * 8 CTAs (64 Flash, 96 Pro), each streaming a distinct 16-28 KiB slice of gate_weight;
//  - every thread issues all of its gate_weight loads (16 bytes each) before it waits for
//    anything, so the whole matrix is in flight at once;
//  - the CTA's slice of hidden (tokens x its D range) is staged in shared memory with cp.async
//    and read by the 8 warps (2 expert tiles x 4 D groups);
//  - partial logits are summed in a fixed order: the CTA's 4 D groups in shared memory, then the
//    cluster's 8 CTAs through distributed shared memory. No atomics, so results are
//    deterministic, and no global scratch beyond the [N, E] logits themselves.
// The k dimension of each MMA is a permutation of 32 consecutive d values chosen so that a
// thread's A fragment (gate_weight) and B fragment (hidden) are each one 16-byte load; the dot
// product does not depend on the order of its terms.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/cuda_helpers.h"
#include "dsv4/cuda/router_launch.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

namespace cg = cooperative_groups;

constexpr const char* kOperation = "hdk::dsv4::route";
constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 32;      // d values per pair of k16 MMA steps
constexpr int kMaxTokens = 64;  // rows per CTA: eight n8 tiles
constexpr int kTokenTile = 8;

struct GemmArgs : GateOperands {
  int64_t total_chunks;  // ceil(D / 32)
  int tokens_per_cta;    // multiple of 8, at most 64
  int row_elements;      // pitch of a staged hidden row, in bf16 elements
};

// A staged hidden row is (chunks per CTA) * 64 bytes, padded so its pitch is an odd multiple of
// 64 bytes: the 8 rows a warp reads in one n8 tile then fall on distinct bank groups.
int hidden_row_elements(int64_t total_chunks) {
  const int64_t slice_chunks = (total_chunks + kGateSplits - 1) / kGateSplits;
  return static_cast<int>(slice_chunks * kChunk + (slice_chunks % 2 == 0 ? kChunk : 0));
}

// A CTA's shape: kExpertTiles m16 tiles of experts, the 8 warps split between them and the
// kDGroups interleaved groups of D chunks.
template <int kExpertTiles>
struct CtaShape {
  static constexpr int kExpertsPerCta = 16 * kExpertTiles;
  static constexpr int kDGroups = kWarps / kExpertTiles;
  static constexpr int kRoundChunks = 4 * kExpertTiles;  // chunks a warp holds in registers
};

// Both shapes need the same bytes: the D-group partials are kWarps x 16 experts per token.
size_t shared_bytes(int tokens_per_cta, int row_elements) {
  return static_cast<size_t>(tokens_per_cta) * row_elements * 2 +  // hidden slice
         static_cast<size_t>(kWarps) * tokens_per_cta * 16 * 4 +   // D-group partials
         static_cast<size_t>(tokens_per_cta) * 32 * 4;             // CTA sums (up to 32 experts)
}

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes global -> shared without a register round trip; zero-filled when !valid (tails).
__device__ __forceinline__ void cp_async_16(void* shared, const void* global, bool valid) {
  const unsigned address = static_cast<unsigned>(__cvta_generic_to_shared(shared));
  const int source_bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(address), "l"(global),
               "r"(source_bytes));
}

template <int kExpertTiles>
__global__ void __launch_bounds__(kThreads, 1) gate_gemm_kernel(GemmArgs args) {
  constexpr int kExpertsPerCta = CtaShape<kExpertTiles>::kExpertsPerCta;
  constexpr int kDGroups = CtaShape<kExpertTiles>::kDGroups;
  constexpr int kRoundChunks = CtaShape<kExpertTiles>::kRoundChunks;
  // The epilogue may launch now: it waits (griddepcontrol.wait) for this grid to complete.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t expert_base = static_cast<int64_t>(blockIdx.x / kGateSplits) * kExpertsPerCta;
  const int64_t token_base = static_cast<int64_t>(blockIdx.y) * args.tokens_per_cta;
  const int64_t rows_left = args.N - token_base;
  const int tokens =
      static_cast<int>(rows_left < args.tokens_per_cta ? rows_left : args.tokens_per_cta);
  const int token_tiles = (tokens + kTokenTile - 1) / kTokenTile;
  const int64_t chunk_begin = rank * args.total_chunks / kGateSplits;
  const int64_t chunk_end = (rank + 1) * args.total_chunks / kGateSplits;

  extern __shared__ __align__(16) uint8_t shared[];
  uint16_t* hidden_tile = reinterpret_cast<uint16_t*>(shared);
  float* partial = reinterpret_cast<float*>(shared + static_cast<size_t>(args.tokens_per_cta) *
                                                         args.row_elements * 2);
  float* cta_logits = partial + kWarps * args.tokens_per_cta * 16;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int group = lane >> 2;  // MMA row/column group
  const int thread = lane & 3;  // position inside the group
  const int expert_tile = warp % kExpertTiles;
  const int d_group = warp / kExpertTiles;
  const int64_t expert_lo = expert_base + expert_tile * 16 + group;
  const int64_t expert_hi = expert_lo + 8;

  uint4 weight_lo[kRoundChunks];
  uint4 weight_hi[kRoundChunks];
  auto load_weights = [&](int64_t first_chunk) {
#pragma unroll
    for (int i = 0; i < kRoundChunks; ++i) {
      const int64_t chunk = first_chunk + static_cast<int64_t>(kDGroups) * i;
      const int64_t d = chunk * kChunk + 8 * thread;
      const bool in_range = chunk < chunk_end && d < args.D;
      // Unconditional loads (out-of-range ones read the row's first 16 bytes and are zeroed
      // after): a load under a branch waits for the previous one, which serialized the
      // DRAM latencies of a thread's loads.
      const int64_t column = in_range ? d : 0;
      const uint4 lo = __ldg(reinterpret_cast<const uint4*>(
          args.weight + (expert_lo < args.E ? expert_lo : args.E - 1) * args.weight_stride +
          column));
      const uint4 hi = __ldg(reinterpret_cast<const uint4*>(
          args.weight + (expert_hi < args.E ? expert_hi : args.E - 1) * args.weight_stride +
          column));
      const uint4 zero = make_uint4(0, 0, 0, 0);
      weight_lo[i] = in_range && expert_lo < args.E ? lo : zero;
      weight_hi[i] = in_range && expert_hi < args.E ? hi : zero;
    }
  };
  // gate_weight first: it comes from DRAM and is the long pole; hidden is small and in L2.
  load_weights(chunk_begin + d_group);

  const int granules_per_row = static_cast<int>(chunk_end - chunk_begin) * (kChunk / 8);
  const int staged = token_tiles * kTokenTile * granules_per_row;
  for (int q = threadIdx.x; q < staged; q += kThreads) {
    const int row = q / granules_per_row;
    const int granule = q - row * granules_per_row;
    const int64_t d = chunk_begin * kChunk + 8 * granule;
    const bool valid = row < tokens && d < args.D;
    const uint16_t* source =
        valid ? args.hidden + (token_base + row) * args.hidden_stride + d : args.hidden;
    cp_async_16(hidden_tile + row * args.row_elements + 8 * granule, source, valid);
  }
  asm volatile("cp.async.commit_group;\n" ::: "memory");
  asm volatile("cp.async.wait_all;\n" ::: "memory");
  __syncthreads();

  float acc[kMaxTokens / kTokenTile][4] = {};
  for (int64_t first = chunk_begin + d_group; first < chunk_end;
       first += static_cast<int64_t>(kDGroups) * kRoundChunks) {
#pragma unroll
    for (int i = 0; i < kRoundChunks; ++i) {
      const int64_t chunk = first + static_cast<int64_t>(kDGroups) * i;
      if (chunk < chunk_end) {
        const uint16_t* row =
            hidden_tile + group * args.row_elements + (chunk - chunk_begin) * kChunk + 8 * thread;
#pragma unroll
        for (int j = 0; j < kMaxTokens / kTokenTile; ++j) {
          if (j < token_tiles) {
            const uint4 h =
                *reinterpret_cast<const uint4*>(row + j * kTokenTile * args.row_elements);
            mma_bf16_16816(acc[j], weight_lo[i].x, weight_hi[i].x, weight_lo[i].y, weight_hi[i].y,
                           h.x, h.y);
            mma_bf16_16816(acc[j], weight_lo[i].z, weight_hi[i].z, weight_lo[i].w, weight_hi[i].w,
                           h.z, h.w);
          }
        }
      }
    }
    const int64_t next = first + static_cast<int64_t>(kDGroups) * kRoundChunks;
    if (next < chunk_end) load_weights(next);
  }

  // Accumulator (row = expert, column = token) -> partial[d_group][token][expert].
  const int tokens_per_cta = args.tokens_per_cta;
#pragma unroll
  for (int j = 0; j < kMaxTokens / kTokenTile; ++j) {
    if (j < token_tiles) {
      const int token = j * kTokenTile + 2 * thread;
      const int expert = expert_tile * 16 + group;
      float* base = partial + (d_group * tokens_per_cta + token) * kExpertsPerCta + expert;
      base[0] = acc[j][0];
      base[kExpertsPerCta] = acc[j][1];
      base[8] = acc[j][2];
      base[kExpertsPerCta + 8] = acc[j][3];
    }
  }
  __syncthreads();
  const int entries = token_tiles * kTokenTile * kExpertsPerCta;
  const int group_stride = tokens_per_cta * kExpertsPerCta;
  for (int i = threadIdx.x; i < entries; i += kThreads) {
    float sum = partial[i];
#pragma unroll
    for (int group = 1; group < kDGroups; ++group)
      sum += partial[group * group_stride + i];
    cta_logits[i] = sum;
  }
  cluster.sync();  // every CTA's sums are visible cluster-wide

  // CTA `rank` finishes one eighth of the cluster's (token, expert) entries.
  const int per_rank = entries / kGateSplits;
  for (int i = rank * per_rank + threadIdx.x; i < (rank + 1) * per_rank; i += kThreads) {
    float sum = 0.0f;
#pragma unroll
    for (int source = 0; source < kGateSplits; ++source) {
      sum += cluster.map_shared_rank(cta_logits, source)[i];
    }
    const int64_t n = token_base + i / kExpertsPerCta;
    const int64_t e = expert_base + i % kExpertsPerCta;
    if (n < args.N && e < args.E) args.logits[n * args.logits_stride + e] = sum;
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

// CTAs of `kernel` with `bytes` of dynamic shared memory that fit on one SM (cached: the
// occupancy calculator is a host computation, but not a free one).
template <typename Kernel>
int resident_ctas_per_sm(Kernel kernel, size_t bytes, int device) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t>, int> cache;
  const auto key = std::make_tuple(reinterpret_cast<const void*>(kernel), device, bytes);
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  hdk::detail::allow_dynamic_shared_memory(kernel, static_cast<int>(bytes), device, kOperation);
  int blocks = 0;
  hdk::detail::check_cuda(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, bytes), kOperation,
      "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  cache.emplace(key, blocks);
  return blocks;
}

int shared_memory_limit(int device) {
  return hdk::detail::cached_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin, device,
                                              kOperation);
}

}  // namespace

int64_t gate_gemm_max_hidden_size(int device) {
  const int64_t limit = shared_memory_limit(device);
  // With 8 rows per CTA: 16 bytes per staged element column plus the fixed partial buffers.
  const int64_t fixed = shared_bytes(kTokenTile, 0);
  const int64_t row_elements = (limit - fixed) / (kTokenTile * 2);
  const int64_t slice_chunks = (row_elements - kChunk) / kChunk;
  return slice_chunks * kGateSplits * kChunk;
}

void launch_gate_gemm(const RouterProblem& p, int device, cudaStream_t stream) {
  GemmArgs args;
  static_cast<GateOperands&>(args) = gate_operands(p);
  args.total_chunks = (p.hidden_size + kChunk - 1) / kChunk;
  args.row_elements = hidden_row_elements(args.total_chunks);
  int tokens = static_cast<int>(std::min<int64_t>(kMaxTokens, (p.num_tokens + 7) / 8 * 8));
  const int limit = shared_memory_limit(device);
  while (tokens > kTokenTile &&
         shared_bytes(tokens, args.row_elements) > static_cast<size_t>(limit))
    tokens /= 2;
  const size_t bytes = shared_bytes(tokens, args.row_elements);
  if (bytes > static_cast<size_t>(limit)) {
    throw Error(std::string(kOperation) + ": the CUDA gate GEMM supports D up to " +
                std::to_string(gate_gemm_max_hidden_size(device)) +
                ", got D = " + std::to_string(p.hidden_size));
  }
  args.tokens_per_cta = tokens;
  // Experts per CTA: 16 when the grid of one-tile CTAs is resident all at once (Flash: 128
  // CTAs streaming 16 KiB each; Pro for N <= 16: 192 CTAs, two per SM), else 32 (Pro at N = 64,
  // where 115 KiB of staged hidden per CTA allows one per SM: 96 CTAs rather than two waves).
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  const int64_t one_tile_ctas = (p.num_experts + 15) / 16 * kGateSplits;
  const int expert_tiles =
      one_tile_ctas <= static_cast<int64_t>(sm_count) *
                           resident_ctas_per_sm(gate_gemm_kernel<1>, bytes, device)
          ? 1
          : 2;
  const int experts_per_cta = 16 * expert_tiles;
  auto kernel = expert_tiles == 1 ? gate_gemm_kernel<1> : gate_gemm_kernel<2>;
  hdk::detail::allow_dynamic_shared_memory(kernel, static_cast<int>(bytes), device, kOperation);

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(
      static_cast<unsigned>((p.num_experts + experts_per_cta - 1) / experts_per_cta * kGateSplits),
      static_cast<unsigned>((p.num_tokens + tokens - 1) / tokens), 1);
  config.blockDim = dim3(kThreads, 1, 1);
  config.dynamicSmemBytes = bytes;
  config.stream = stream;
  cudaLaunchAttribute attributes[1];
  attributes[0].id = cudaLaunchAttributeClusterDimension;
  attributes[0].val.clusterDim.x = kGateSplits;
  attributes[0].val.clusterDim.y = 1;
  attributes[0].val.clusterDim.z = 1;
  config.attrs = attributes;
  config.numAttrs = 1;
  hdk::detail::check_launch(cudaLaunchKernelEx(&config, kernel, args), kOperation,
                            "launching the gate GEMM kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
