// CUDA entry of the DeepSeek-V4 router: capability checks, then the fused gate GEMM (when hidden
// and gate_weight are given; router_gate_gemm.cu) and the per-row epilogue kernel below, which
// does everything after the logits: softplus, sqrt, bias, top-k, gather, renormalize, scale.
#include "dsv4/cuda/router_cuda.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <string>

#include "core/argument_checks.h"
#include "core/cuda_helpers.h"
#include "dsv4/cuda/router_launch.h"
#include "dsv4/router_math.h"
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
// Up to 32 x 16 = 512 experts (DeepSeek-V4 has 256 / 384) each lane keeps its ranked entries in
// registers, so picking the next winner is an unrolled register scan. The general path rescans
// shared memory and reloads the bias instead: measured on an H100, that made one row's
// epilogue 14 us (3,000 dependent instructions of a single warp).
constexpr int kEntriesInRegisters = 16;
constexpr int64_t kMaxExperts = 16384;  // the epilogue keeps a row's scores in shared memory

__device__ __forceinline__ uint64_t warp_max(uint64_t value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  return value;
}

__device__ __forceinline__ float selection_key(const RouterProblem& p, const float* scores,
                                               int64_t e) {
  return p.bias != nullptr ? scores[e] + p.bias[e * p.bias_stride] : scores[e];
}

// One warp per row. The row's scores s live in shared memory; in dense mode each lane keeps the
// best ranked entry among its experts (e = lane, lane + 32, ...) and the warp takes the maximum
// top_k times. Entries are unique and leave in descending order, so the lane that lost its best
// finds the next one as the largest entry below the one just taken: no "taken" flags.
__global__ void __launch_bounds__(kEpilogueWarps * 32)
    router_epilogue_kernel(RouterProblem p, const void* logits, DType logits_dtype,
                           int64_t logits_row_stride, int words_per_warp) {
  // After the gate GEMM this kernel is launched early (programmatic dependent launch); wait for
  // the GEMM's logits. Without a programmatic dependency this returns at once.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  const int warps = blockDim.x >> 5;
  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t n = static_cast<int64_t>(blockIdx.x) * warps + warp;
  if (n >= p.num_tokens) return;
  const int64_t E = p.num_experts;
  const int64_t K = p.top_k;

  extern __shared__ float epilogue_shared[];
  float* scores = epilogue_shared + static_cast<int64_t>(warp) * words_per_warp;
  int32_t* slots = reinterpret_cast<int32_t*>(scores + E);

  const bool dense = p.mode == RoutingMode::kDense;
  const bool in_registers = E <= 32 * kEntriesInRegisters;
  bool nan = false;
  uint64_t best = 0;
  // Scores one expert into shared memory and returns its ranked selection entry (0 in hash
  // mode); flags NaN logits and keys.
  auto score = [&](int64_t e) -> uint64_t {
    const int64_t offset = n * logits_row_stride + e;
    const float x = logits_dtype == DType::kBFloat16
                        ? __bfloat162float(static_cast<const __nv_bfloat16*>(logits)[offset])
                        : static_cast<const float*>(logits)[offset];
    const float s = router_score(x);
    scores[e] = s;
    nan |= isnan(x);
    if (!dense) return 0;
    const float key = p.bias != nullptr ? s + p.bias[e * p.bias_stride] : s;
    nan |= isnan(key);
    return ranked_entry(ordered_key(key), static_cast<uint32_t>(e));
  };
  uint64_t entries[kEntriesInRegisters];
#pragma unroll
  for (int i = 0; i < kEntriesInRegisters; ++i) {
    const int64_t e = lane + 32 * i;
    entries[i] = in_registers && e < E ? score(e) : 0;
    best = entries[i] > best ? entries[i] : best;
  }
  for (int64_t e = lane; !in_registers && e < E; e += 32) {
    const uint64_t entry = score(e);
    best = entry > best ? entry : best;
  }
  bool invalid = __any_sync(0xffffffffu, nan);
  __syncwarp();

  float sum = 0.0f;
  if (!invalid) {
    if (dense) {
      uint64_t ceiling = ~0ull;
      for (int64_t j = 0; j < K; ++j) {
        const uint64_t winner = warp_max(best);
        const int64_t e = column_of(winner);
        if ((e & 31) == lane) {
          ceiling = winner;
          best = 0;
          if (in_registers) {
#pragma unroll
            for (int i = 0; i < kEntriesInRegisters; ++i) {
              if (entries[i] < ceiling && entries[i] > best) best = entries[i];
            }
          } else {
            for (int64_t f = lane; f < E; f += 32) {
              const uint64_t entry =
                  ranked_entry(ordered_key(selection_key(p, scores, f)), static_cast<uint32_t>(f));
              if (entry < ceiling && entry > best) best = entry;
            }
          }
        }
        // Every lane adds the same values in slot order: the CPU backend's fp32 sum.
        sum += scores[e];
        if (lane == 0) slots[j] = static_cast<int32_t>(e);
      }
    } else {
      const int64_t token = p.token_id(n);
      bool bad = token < 0 || token >= p.vocab_size;
      if (!bad) {
        for (int64_t j = lane; j < K; j += 32) {
          const int32_t e = p.table_entry(token, j);
          bad |= e < 0 || e >= E;
          slots[j] = e;
        }
      }
      invalid = __any_sync(0xffffffffu, bad);
      __syncwarp();
      if (!invalid) {
        for (int64_t j = 0; j < K; ++j)
          sum += scores[slots[j]];
      }
    }
    if (!invalid) invalid = !weights_formable(sum);
  }
  __syncwarp();

  int32_t* ids = p.topk_ids + n * p.topk_ids_row_stride;
  float* weights = p.topk_weights + n * p.topk_weights_row_stride;
  for (int64_t j = lane; j < K; j += 32) {
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

bool programmatic_launch_enabled() {
  // HDK_NO_PDL=1 launches the epilogue after the GEMM the ordinary way (a debugging aid).
  static const bool enabled = [] {
    const char* value = std::getenv("HDK_NO_PDL");
    return value == nullptr || value[0] == '\0' || value[0] == '0';
  }();
  return enabled;
}

void check_capabilities(const RouterProblem& p, int device) {
  const ArgumentChecks check(kOperation);
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
  const int64_t max_hidden = gate_gemm_max_hidden_size(device);
  if (p.hidden_size > max_hidden) {
    check.fail("the CUDA fused gate supports D up to " + std::to_string(max_hidden) +
               " (dim 1 of 'hidden'), got " + std::to_string(p.hidden_size));
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
  check_capabilities(p, device);
  if (p.num_tokens == 0) return;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const auto cuda_stream = reinterpret_cast<cudaStream_t>(stream);

  const void* logits = p.logits;
  DType logits_dtype = p.logits_dtype;
  int64_t logits_row_stride = p.logits_row_stride;
  if (p.fused_gate) {
    launch_gate_gemm(p, device, cuda_stream);
    logits = p.logits_workspace;
    logits_dtype = DType::kFloat32;
    logits_row_stride = p.logits_workspace_row_stride;
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

  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>((p.num_tokens + warps - 1) / warps), 1, 1);
  config.blockDim = dim3(static_cast<unsigned>(warps * 32), 1, 1);
  config.dynamicSmemBytes = static_cast<size_t>(bytes);
  config.stream = cuda_stream;
  cudaLaunchAttribute attributes[1];
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attributes;
  config.numAttrs = p.fused_gate && programmatic_launch_enabled() ? 1 : 0;
  hdk::detail::check_launch(cudaLaunchKernelEx(&config, router_epilogue_kernel, p, logits,
                                               logits_dtype, logits_row_stride, words_per_warp),
                            kOperation, "launching the router epilogue kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
