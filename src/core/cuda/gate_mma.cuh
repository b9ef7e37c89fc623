// What both tensor-core gate GEMMs (router_gate_gemm.cu, router_gate_split.cu) compute with: the
// bf16 MMA and the helpers for loads that are issued unconditionally. In both kernels the k
// dimension of each MMA is a permutation of 32 consecutive d values chosen so that a thread's A
// fragment (gate_weight) and B fragment (hidden) are each one 16-byte load: thread t of a quad
// holds d = 8t .. 8t + 7 of the chunk, its first k16 step takes d 8t .. 8t + 3 and its second
// 8t + 4 .. 8t + 7. The dot product does not depend on the order of its terms.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace hdk {
namespace dsv4 {
namespace detail {

// c += a · b for one m16n8k16 tile, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Both halves of a chunk's A fragment (rows lo and hi) against one B fragment: the chunk's two
// k16 steps.
__device__ __forceinline__ void mma_chunk(float (&c)[4], const uint4& lo, const uint4& hi,
                                          const uint4& b) {
  mma_bf16_16816(c, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
  mma_bf16_16816(c, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
}

__device__ __forceinline__ int64_t at_most(int64_t value, int64_t limit) {
  return value < limit ? value : limit;
}

// A load under a branch is issued only after the previous one has been used; the kernels load
// from a clamped address unconditionally and drop the value afterwards with this.
__device__ __forceinline__ uint4 zero_unless(bool keep, const uint4& value) {
  return keep ? value : make_uint4(0, 0, 0, 0);
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
