// CUDA entry of the DeepSeek-V4 router: capability checks, then the fused gate GEMM (when hidden
// and gate_weight are given; router_gate_gemm.cu) and the per-row epilogue kernel below, which
// does everything after the logits: softplus, sqrt, bias, top-k, gather, renormalize, scale.
#include "dsv4/router/cuda/router_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <string>

#include "core/argument_checks.h"
#include "core/cuda_helpers.h"
#include "dsv4/router/cuda/router_launch.h"
#include "dsv4/router/router_math.h"
#include "topk/topk_key.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::ArgumentChecks;
using hdk::detail::column_of;
using hdk::detail::ordered_key;
using hdk::detail::ranked_entry;

constexpr const char* kOperation = "hdk::dsv4::route";
constexpr int kEpilogueWarps = 4;
constexpr int64_t kMaxExperts = 16384;  // the epilogue keeps a row's scores in shared memory
constexpr int kMaxRowExperts = 512;     // the one-thread-per-expert kernel (DeepSeek-V4: 256, 384)

// A warp per row in every epilogue kernel. The work is tiny (E scores, k winners) so its time is
// the length of the warp's dependent instruction chain, not throughput: the first version, which
// rescanned shared memory for each winner, issued ~3,000 dependent instructions per row and took
// 12-15 us on an H100 whatever N was.

// Where the epilogue finds a row's logits: the caller's logits (fp32 or bf16), or the fused gate's
// workspace, whose `slabs` slabs of partial sums (one per slice of D) it adds in slab order and
// writes back to slab 0 as the logits.
struct LogitSource {
  const void* logits;  // the caller's logits; nullptr after the fused gate
  DType dtype;
  float* workspace;  // the fused gate's [slabs, N, E] partial sums; nullptr with given logits
  int64_t row_stride;
  int64_t slab_stride;
  int slabs;
};

__device__ __forceinline__ float load_logit(const LogitSource& source, int64_t n, int64_t e) {
  const int64_t offset = n * source.row_stride + e;
  if (source.workspace == nullptr) {
    return source.dtype == DType::kBFloat16
               ? __bfloat162float(static_cast<const __nv_bfloat16*>(source.logits)[offset])
               : static_cast<const float*>(source.logits)[offset];
  }
  float* first = source.workspace + offset;
  if (source.slabs == 1) return *first;
  // Every load is issued before the first add (a load under a branch would wait for the
  // previous one); slabs past the used ones reread the last and are dropped.
  float parts[kWorkspaceMaxSlabs];
#pragma unroll
  for (int s = 0; s < kWorkspaceMaxSlabs; ++s)
    parts[s] = first[(s < source.slabs ? s : source.slabs - 1) * source.slab_stride];
  float sum = parts[0];
#pragma unroll
  for (int s = 1; s < kWorkspaceMaxSlabs; ++s)
    if (s < source.slabs) sum += parts[s];
  *first = sum;
  return sum;
}

// Hash routing: the row's slots from tid2eid. Returns false (for every lane) when the token id
// or a used table entry is out of range.
__device__ bool hash_slots(const RouterProblem& p, int64_t n, int lane, int32_t* slots) {
  const int64_t token = p.token_id(n);
  bool bad = token < 0 || token >= p.vocab_size;
  if (!bad) {
    for (int64_t j = lane; j < p.top_k; j += 32) {
      const int32_t e = p.table_entry(token, j);
      bad |= e < 0 || e >= p.num_experts;
      slots[j] = e;
    }
  }
  const bool ok = !__any_sync(0xffffffffu, bad);
  __syncwarp();
  return ok;
}

// Every lane adds the same values in slot order: the CPU backend's fp32 sum.
__device__ float slot_sum(const RouterProblem& p, const float* scores, const int32_t* slots) {
  float sum = 0.0f;
  for (int64_t j = 0; j < p.top_k; ++j)
    sum += scores[slots[j]];
  return sum;
}

// Writes the row's ids and weights (or -1 / 0 and a count for an invalid row).
__device__ void write_row(const RouterProblem& p, int64_t n, int lane, const float* scores,
                          const int32_t* slots, float sum, bool invalid) {
  int32_t* ids = p.topk_ids + n * p.topk_ids_row_stride;
  float* weights = p.topk_weights + n * p.topk_weights_row_stride;
  for (int64_t j = lane; j < p.top_k; j += 32) {
    if (invalid) {
      ids[j] = -1;
      weights[j] = 0.0f;
    } else {
      ids[j] = slots[j];
      weights[j] = scores[slots[j]] / sum * p.route_scale;
    }
  }
  if (invalid && lane == 0 && p.invalid_count != nullptr) {
    if (p.invalid_count_dtype == DType::kInt64) {
      atomicAdd(static_cast<unsigned long long*>(p.invalid_count), 1ull);
    } else {
      atomicAdd(static_cast<int*>(p.invalid_count), 1);
    }
  }
}

// The end of every epilogue, run by one warp: hash routing's slots and sum (dense routing
// brings its own), the check that the sum gives finite weights, and the row's outputs.
__device__ void finish_row(const RouterProblem& p, int64_t n, int lane, const float* scores,
                           int32_t* slots, float sum, bool invalid) {
  if (!invalid && p.mode == RoutingMode::kHash) {
    invalid = !hash_slots(p, n, lane, slots);
    if (!invalid) sum = slot_sum(p, scores, slots);
  }
  if (!invalid) invalid = !weights_formable(sum);
  __syncwarp();
  write_row(p, n, lane, scores, slots, sum, invalid);
}

// The winner among the 32 lanes' entries (0 = none): the largest key, then among equal keys
// the largest low word (the lower expert). Two single-instruction reductions instead of a
// five-step 64-bit shuffle tree.
__device__ __forceinline__ uint64_t warp_top(uint64_t entry) {
  const uint32_t key = static_cast<uint32_t>(entry >> 32);
  const uint32_t low = static_cast<uint32_t>(entry);
  const uint32_t top_key = __reduce_max_sync(0xffffffffu, key);
  const uint32_t top_low = __reduce_max_sync(0xffffffffu, key == top_key ? low : 0u);
  return (static_cast<uint64_t>(top_key) << 32) | top_low;
}

// One CTA per row, one thread per expert (E <= kMaxRowExperts). The work per row is tiny, so
// the time is the length of the dependent chain; spreading the row over E threads makes it
// one score per thread (a warp per row scoring 8-12 experts per lane was ~1,600 serialized
// instructions, 3 us). Then:
//  1. each warp takes its best min(top_k, 32) entries in order (warp_top, the winner's lane
//     drops out) into a list in shared memory;
//  2. warp 0 merges the sorted lists: lane l holds the head of list l, and each winner is the
//     warp_top of the heads; the winning lane advances (its next entry is already loaded).
__global__ void __launch_bounds__(kMaxRowExperts)
    router_epilogue_row_kernel(RouterProblem p, LogitSource source, int list_length) {
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int warps = blockDim.x >> 5;
  const int64_t n = blockIdx.x;
  const int64_t E = p.num_experts;
  const bool dense = p.mode == RoutingMode::kDense;
  const bool expert = tid < E;
  // The bias is not produced by the gate GEMM: load it before waiting for that grid.
  const float bias = p.bias != nullptr && expert ? p.bias[tid * p.bias_stride] : 0.0f;
  // After the gate GEMM this kernel is launched early (programmatic dependent launch); wait for
  // the GEMM's logits. Without a programmatic dependency this returns at once.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");

  extern __shared__ __align__(16) uint8_t row_shared[];
  uint64_t* lists = reinterpret_cast<uint64_t*>(row_shared);  // [warps][list_length]
  float* scores = reinterpret_cast<float*>(lists + static_cast<int64_t>(warps) * list_length);
  int32_t* slots = reinterpret_cast<int32_t*>(scores + E);

  uint64_t entry = 0;  // below every real entry: a NaN-free key is at least 0x007fffff
  bool nan = false;
  if (expert) {
    const float x = load_logit(source, n, tid);
    const float s = router_score(x);
    scores[tid] = s;
    const float key = s + bias;  // + 0.0f without a bias: s unchanged, -0 ties +0
    nan = isnan(x) || isnan(key);
    entry = ranked_entry(ordered_key(key), static_cast<uint32_t>(tid));
  }
  bool invalid = __syncthreads_or(nan) != 0;
  if (dense && !invalid) {
    for (int j = 0; j < list_length; ++j) {
      const uint64_t top = warp_top(entry);
      if (entry == top) entry = 0;
      if (lane == 0) lists[warp * list_length + j] = top;
    }
  }
  __syncthreads();
  if (warp != 0) return;

  float sum = 0.0f;  // dense: the selected scores' sum, in slot order
  if (dense && !invalid) {
    const uint64_t* list = lists + lane * list_length;
    int next = 2;
    uint64_t head = lane < warps ? list[0] : 0;
    uint64_t second = lane < warps && list_length > 1 ? list[1] : 0;
    for (int64_t j = 0; j < p.top_k; ++j) {
      const uint64_t top = warp_top(head);
      if (head == top && lane < warps) {
        head = second;
        second = next < list_length ? list[next] : 0;
        ++next;
      }
      const uint32_t e = column_of(top);
      sum += scores[e];
      if (lane == 0) slots[j] = static_cast<int32_t>(e);
    }
  }
  finish_row(p, n, lane, scores, slots, sum, invalid);
}

__device__ __forceinline__ uint64_t warp_max(uint64_t value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  return value;
}

__device__ __forceinline__ uint64_t selection_entry(const RouterProblem& p, const float* scores,
                                                    int64_t e) {
  const float key = p.bias != nullptr ? scores[e] + p.bias[e * p.bias_stride] : scores[e];
  return ranked_entry(ordered_key(key), static_cast<uint32_t>(e));
}

// Any E up to kMaxExperts (the row kernel above covers E <= 512, DeepSeek-V4's 256 and 384). The
// row's scores live in shared memory; each lane keeps the best entry among its experts and the warp
// takes the maximum top_k times. Entries are unique and leave in descending order, so the lane
// that lost its best finds the next one as the largest entry below the one just taken.
__global__ void __launch_bounds__(kEpilogueWarps * 32)
    router_epilogue_kernel(RouterProblem p, LogitSource source, int words_per_warp) {
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (n >= p.num_tokens) return;
  const int64_t E = p.num_experts;

  extern __shared__ float epilogue_shared[];
  float* scores = epilogue_shared + static_cast<int64_t>(warp) * words_per_warp;
  int32_t* slots = reinterpret_cast<int32_t*>(scores + E);

  const bool dense = p.mode == RoutingMode::kDense;
  bool nan = false;
  for (int64_t e = lane; e < E; e += 32) {
    const float x = load_logit(source, n, e);
    scores[e] = router_score(x);
    nan |= isnan(x);
  }
  __syncwarp();
  uint64_t best = 0;
  for (int64_t e = lane; dense && e < E; e += 32) {
    const uint64_t entry = selection_entry(p, scores, e);
    nan |= static_cast<uint32_t>(entry >> 32) == 0;  // a NaN key
    best = entry > best ? entry : best;
  }
  bool invalid = __any_sync(0xffffffffu, nan);
  __syncwarp();

  float sum = 0.0f;  // dense: the selected scores' sum, in slot order
  if (dense && !invalid) {
    uint64_t ceiling = ~0ull;
    for (int64_t j = 0; j < p.top_k; ++j) {
      const uint64_t winner = warp_max(best);
      const int64_t e = column_of(winner);
      if ((e & 31) == lane) {
        ceiling = winner;
        best = 0;
        for (int64_t f = lane; f < E; f += 32) {
          const uint64_t entry = selection_entry(p, scores, f);
          if (entry < ceiling && entry > best) best = entry;
        }
      }
      sum += scores[e];
      if (lane == 0) slots[j] = static_cast<int32_t>(e);
    }
  }
  finish_row(p, n, lane, scores, slots, sum, invalid);
}

void check_capabilities(const RouterProblem& p) {
  const ArgumentChecks check(kOperation);
  if (p.num_tokens > INT_MAX) {
    check.fail("the CUDA backend supports N up to " + std::to_string(INT_MAX) +
               " rows (one CTA per row), got N = " + std::to_string(p.num_tokens));
  }
  if (p.num_experts > kMaxExperts) {
    check.fail("the CUDA backend supports E up to " + std::to_string(kMaxExperts) +
               ", got E = " + std::to_string(p.num_experts) + "; CPU tensors accept any E");
  }
  if (!p.fused_gate) return;
  if (p.hidden_size % 8 != 0) {
    check.fail(
        "the CUDA fused gate needs D (dim 1 of 'hidden') to be a multiple of 8 (16-byte "
        "loads), got D = " +
        std::to_string(p.hidden_size));
  }
  auto aligned = [](const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; };
  if (!aligned(p.hidden) || (p.num_tokens > 1 && p.hidden_row_stride % 8 != 0)) {
    check.fail(
        "argument 'hidden' must be 16-byte aligned with a row stride that is a multiple of "
        "8 elements for the CUDA backend, got row stride " +
        std::to_string(p.hidden_row_stride));
  }
  if (!aligned(p.gate_weight) || (p.num_experts > 1 && p.gate_weight_row_stride % 8 != 0)) {
    check.fail(
        "argument 'gate_weight' must be 16-byte aligned with a row stride that is a "
        "multiple of 8 elements for the CUDA backend, got row stride " +
        std::to_string(p.gate_weight_row_stride));
  }
}

}  // namespace

void route_cuda(const RouterProblem& p, int device, CudaStream stream) {
  check_capabilities(p);
  if (p.num_tokens == 0) return;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);

  LogitSource source{p.logits, p.logits_dtype, nullptr, p.logits_row_stride, 0, 1};
  if (p.fused_gate) {
    source = LogitSource{nullptr,
                         DType::kFloat32,
                         p.logits_workspace,
                         p.logits_workspace_row_stride,
                         p.logits_workspace_slab_stride,
                         1};
    if (gate_gemv_applies(p, device)) {
      launch_gate_gemv(p, device, cuda_stream);
    } else if (p.num_tokens <= kClusterGateMaxRows) {
      launch_gate_gemm(p, cuda_stream);
    } else {
      source.slabs = launch_gate_split(p, device, cuda_stream);
    }
  }

  cudaLaunchConfig_t config = {};
  config.stream = cuda_stream;
  cudaLaunchAttribute attributes[1];
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = p.fused_gate && hdk::detail::dependent_launch_enabled() ? 1 : 0;

  if (p.num_experts <= kMaxRowExperts) {
    const int warps = static_cast<int>((p.num_experts + 31) / 32);
    const bool dense = p.mode == RoutingMode::kDense;
    const int list_length = dense ? static_cast<int>(std::min<int64_t>(p.top_k, 32)) : 0;
    config.gridDim = dim3(static_cast<unsigned>(p.num_tokens), 1, 1);
    config.blockDim = dim3(static_cast<unsigned>(warps * 32), 1, 1);
    config.dynamicSmemBytes = static_cast<size_t>(warps) * list_length * 8 +
                              static_cast<size_t>(p.num_experts + p.top_k) * 4;
    hdk::detail::check_launch(
        cudaLaunchKernelEx(&config, router_epilogue_row_kernel, p, source, list_length), kOperation,
        "launching the router epilogue kernel");
    return;
  }

  // Per warp: the row's E scores and its top_k slots, padded to 16 bytes.
  const int words_per_warp = static_cast<int>((p.num_experts + p.top_k + 3) / 4 * 4);
  const int limit = hdk::detail::cached_device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                                         device, kOperation);
  int warps = kEpilogueWarps;
  while (warps > 1 && warps * words_per_warp * 4 > limit)
    warps /= 2;
  const int bytes = warps * words_per_warp * 4;
  if (bytes > 48 * 1024) {
    hdk::detail::allow_dynamic_shared_memory(router_epilogue_kernel, bytes, device, kOperation);
  }
  config.gridDim = dim3(static_cast<unsigned>((p.num_tokens + warps - 1) / warps), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(warps * 32), 1, 1);
  config.dynamicSmemBytes = static_cast<size_t>(bytes);
  hdk::detail::check_launch(
      cudaLaunchKernelEx(&config, router_epilogue_kernel, p, source, words_per_warp), kOperation,
      "launching the router epilogue kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
