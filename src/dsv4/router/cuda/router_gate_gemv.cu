// The router's gate product for the smallest batches (N <= kGemvMaxRows): logits[n, e] =
// hidden[n] · gate_weight[e] with bf16 inputs and fp32 accumulation on the CUDA cores.
// Each CTA owns a few whole experts (E / SM count, rounded up: 2 for Flash, 3 for Pro on an
// H100) and all of D, so gate_weight is still streamed once over every SM, but no CTA needs
// another's partial sums: no cluster launch, no cluster barriers, no distributed shared memory,
// which together were about a third of the tensor-core kernel's (router_gate_gemm.cu) time at
// N = 1. The price is that every CTA reads all N rows of hidden (8-14 KiB each, from L2), which
// is why larger N goes to the tensor-core kernel.
#include <cuda_runtime.h>

#include "core/cuda_helpers.h"
#include "dsv4/router/cuda/router_launch.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr const char* kOperation = "hdk::dsv4::route";
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxExpertsPerCta = 4;
constexpr int kRound = 4;  // 16-byte chunks of D per thread in flight at once

struct GemvArgs : GateOperands {
  int experts_per_cta;
};

__device__ __forceinline__ float bf16_low(uint32_t pair) {
  return __uint_as_float(pair << 16);
}
__device__ __forceinline__ float bf16_high(uint32_t pair) {
  return __uint_as_float(pair & 0xffff0000u);
}

// Dot product of 8 bf16 pairs (one 16-byte chunk of each), accumulated into sum.
__device__ __forceinline__ float dot8(const uint4& a, const uint4& b, float sum) {
  sum = fmaf(bf16_low(a.x), bf16_low(b.x), sum);
  sum = fmaf(bf16_high(a.x), bf16_high(b.x), sum);
  sum = fmaf(bf16_low(a.y), bf16_low(b.y), sum);
  sum = fmaf(bf16_high(a.y), bf16_high(b.y), sum);
  sum = fmaf(bf16_low(a.z), bf16_low(b.z), sum);
  sum = fmaf(bf16_high(a.z), bf16_high(b.z), sum);
  sum = fmaf(bf16_low(a.w), bf16_low(b.w), sum);
  sum = fmaf(bf16_high(a.w), bf16_high(b.w), sum);
  return sum;
}

template <int kRows>
__global__ void __launch_bounds__(kThreads) gate_gemv_kernel(GemvArgs args) {
  // The epilogue may launch now: it waits (griddepcontrol.wait) for this grid to complete.
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  __shared__ float warp_sums[kWarps][kMaxExpertsPerCta * kRows];
  const int tid = threadIdx.x;
  const int warp = tid >> 5;
  const int lane = tid & 31;
  const int64_t first_expert = static_cast<int64_t>(blockIdx.x) * args.experts_per_cta;
  const int64_t chunks = args.D / 8;

  float acc[kMaxExpertsPerCta][kRows] = {};
  for (int64_t first = tid; first < chunks; first += static_cast<int64_t>(kThreads) * kRound) {
    // Every load of the round is issued before any is used; out-of-range ones read a valid
    // address and are dropped (a load under a branch would wait for the previous one).
    uint4 weight[kMaxExpertsPerCta][kRound];
    uint4 hidden[kRows][kRound];
#pragma unroll
    for (int r = 0; r < kRound; ++r) {
      const int64_t chunk = first + static_cast<int64_t>(r) * kThreads;
      const int64_t d = (chunk < chunks ? chunk : 0) * 8;
#pragma unroll
      for (int x = 0; x < kMaxExpertsPerCta; ++x) {
        int64_t e = first_expert + x;
        e = x < args.experts_per_cta && e < args.E ? e : first_expert;
        weight[x][r] =
            __ldg(reinterpret_cast<const uint4*>(args.weight + e * args.weight_stride + d));
      }
#pragma unroll
      for (int n = 0; n < kRows; ++n) {
        const int64_t row = n < args.N ? n : 0;
        hidden[n][r] =
            __ldg(reinterpret_cast<const uint4*>(args.hidden + row * args.hidden_stride + d));
      }
    }
#pragma unroll
    for (int r = 0; r < kRound; ++r) {
      if (first + static_cast<int64_t>(r) * kThreads < chunks) {
#pragma unroll
        for (int x = 0; x < kMaxExpertsPerCta; ++x) {
#pragma unroll
          for (int n = 0; n < kRows; ++n)
            acc[x][n] = dot8(weight[x][r], hidden[n][r], acc[x][n]);
        }
      }
    }
  }

  // Fixed-order sums (deterministic): the warp's lanes by a butterfly, then the 8 warps.
#pragma unroll
  for (int x = 0; x < kMaxExpertsPerCta; ++x) {
#pragma unroll
    for (int n = 0; n < kRows; ++n) {
      float value = acc[x][n];
#pragma unroll
      for (int offset = 16; offset > 0; offset >>= 1)
        value += __shfl_xor_sync(0xffffffffu, value, offset);
      if (lane == 0) warp_sums[warp][x * kRows + n] = value;
    }
  }
  __syncthreads();
  if (tid < kMaxExpertsPerCta * kRows) {
    const int x = tid / kRows;
    const int n = tid % kRows;
    const int64_t e = first_expert + x;
    if (x < args.experts_per_cta && e < args.E && n < args.N) {
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w)
        sum += warp_sums[w][tid];
      args.logits[n * args.logits_stride + e] = sum;
    }
  }
}

}  // namespace

bool gate_gemv_applies(const RouterProblem& p, int device) {
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  return p.num_tokens <= kGemvMaxRows &&
         p.num_experts <= static_cast<int64_t>(sm_count) * kMaxExpertsPerCta;
}

void launch_gate_gemv(const RouterProblem& p, int device, cudaStream_t stream) {
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  GemvArgs args;
  static_cast<GateOperands&>(args) = gate_operands(p);
  args.experts_per_cta = static_cast<int>((p.num_experts + sm_count - 1) / sm_count);
  const unsigned ctas =
      static_cast<unsigned>((p.num_experts + args.experts_per_cta - 1) / args.experts_per_cta);
  const auto kernel = p.num_tokens == 1 ? gate_gemv_kernel<1> : gate_gemv_kernel<kGemvMaxRows>;
  kernel<<<ctas, kThreads, 0, stream>>>(args);
  hdk::detail::check_launch(cudaGetLastError(), kOperation, "launching the gate GEMV kernel");
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
