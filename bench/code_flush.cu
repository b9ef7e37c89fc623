// The instruction-cache flush of bench/code_flush.h.
#include "code_flush.h"

#include <cuda_runtime.h>

namespace hdk {
namespace bench {
namespace {

// Two chains of 8192 fused multiply-adds with distinct immediates (one unrolled copy each, 12288
// FFMA in all after the compiler keeps one loop of the second): instructions no other kernel
// shares, fetched once per SM.
__device__ float code_flush_sink;

__global__ void code_flush_kernel(float seed) {
  float x = seed + static_cast<float>(threadIdx.x);
#pragma unroll 8192
  for (int i = 0; i < 8192; ++i)
    x = fmaf(x, 1.0f + static_cast<float>(i) * 1e-8f, static_cast<float>(i));
#pragma unroll 8192
  for (int i = 0; i < 8192; ++i)
    x = fmaf(x, 1.0f - static_cast<float>(i) * 3e-8f, static_cast<float>(2 * i + 1));
  if (x == 12345.678f) code_flush_sink = x;  // never true for these chains; keeps them
}

}  // namespace

void launch_code_flush(cudaStream_t stream) {
  static const int blocks = [] {
    int device = 0, sms = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    return 4 * sms;
  }();
  code_flush_kernel<<<blocks, 32, 0, stream>>>(1.0f);
}

}  // namespace bench
}  // namespace hdk

extern "C" int hdk_bench_code_flush(void* stream) {
  hdk::bench::launch_code_flush(static_cast<cudaStream_t>(stream));
  return static_cast<int>(cudaGetLastError());
}
