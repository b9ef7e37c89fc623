// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) for the read kernels: the shapes the read
// kernels use, bf16 (and for the indexer E4M3) operands with fp32 accumulators, and the fences
// around them. The shared-memory operands are 128-byte swizzled tiles described by 64-bit matrix
// descriptors (PTX ISA, "Matrix Descriptor Format"); where each element lies in them, and which
// thread holds which accumulator, is in sparse_decode_layout.h, where the CPU tests check it.
//
// A warpgroup is 4 consecutive warps (128 threads) and every wgmma instruction is issued by all
// of them together. The instructions run asynchronously: registers they write may be read, and
// shared memory they read may be rewritten, only after wgmma_wait for their commit group.
#pragma once

#include <cstdint>

#include "core/cuda/async_copy.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_layout.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Descriptor of an operand at shared-space address `address` (1024-byte aligned atoms, 128-byte
// swizzle): start address, leading and stride byte offsets, each in 16-byte units.
__device__ __forceinline__ uint64_t wgmma_descriptor(uint32_t address, WgmmaOperand operand) {
  const uint32_t start = address + static_cast<uint32_t>(operand.start);
  return static_cast<uint64_t>((start & 0x3ffffu) >> 4) |
         static_cast<uint64_t>((static_cast<uint32_t>(operand.leading) & 0x3ffffu) >> 4) << 16 |
         static_cast<uint64_t>((static_cast<uint32_t>(operand.stride) & 0x3ffffu) >> 4) << 32 |
         uint64_t{1} << 62;  // 128-byte swizzle
}

// The descriptor of an operand `bytes` (a multiple of 16) past the one `descriptor` describes,
// with the same offsets: one add where wgmma_descriptor takes about five instructions (valid while
// the start stays in the 18-bit address field, which every shared-memory address does).
__device__ __forceinline__ uint64_t wgmma_descriptor_advance(uint64_t descriptor, int bytes) {
  return descriptor + static_cast<uint64_t>(bytes >> 4);
}

// Orders this thread's register writes (accumulators, A fragments) before the next wgmma.
__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

// Waits until at most `kPending` commit groups of this warpgroup are still running.
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending) : "memory");
}

// Makes this thread's ordinary shared-memory writes (st.shared, cp.async) visible to the async
// proxy that wgmma reads shared memory through; a barrier after it covers the other threads.
__device__ __forceinline__ void fence_shared_for_wgmma() {
  hdk::detail::fence_shared_for_async_proxy();
}

// Keeps the compiler from moving reads of accumulators above the wgmma_wait that makes them
// valid (to the compiler they are ready when the wgmma statement that writes them ends).
template <int kCount>
__device__ __forceinline__ void wgmma_fence_accumulators(float (&d)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i)
    asm volatile("" : "+f"(d[i])::"memory");
}

#define HDK_WGMMA_ACC8(d, i)                                                                  \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
      "+f"(d[i + 6]), "+f"(d[i + 7])

// The 128 accumulators of an m64n256 product: operands %0 .. %127 and their constraints.
#define HDK_WGMMA_D128                                                             \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "         \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "    \
  "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, "    \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, "    \
  "%61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, "    \
  "%76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, "    \
  "%91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, "    \
  "%105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, " \
  "%118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define HDK_WGMMA_ACC128(d)                                                                       \
  HDK_WGMMA_ACC8(d, 0), HDK_WGMMA_ACC8(d, 8), HDK_WGMMA_ACC8(d, 16), HDK_WGMMA_ACC8(d, 24),       \
      HDK_WGMMA_ACC8(d, 32), HDK_WGMMA_ACC8(d, 40), HDK_WGMMA_ACC8(d, 48), HDK_WGMMA_ACC8(d, 56), \
      HDK_WGMMA_ACC8(d, 64), HDK_WGMMA_ACC8(d, 72), HDK_WGMMA_ACC8(d, 80), HDK_WGMMA_ACC8(d, 88), \
      HDK_WGMMA_ACC8(d, 96), HDK_WGMMA_ACC8(d, 104), HDK_WGMMA_ACC8(d, 112),                      \
      HDK_WGMMA_ACC8(d, 120)

// d (64 x 64) = a b (+ d when `accumulate`): A 64 x 16 and B 16 x 64 both K-major in shared
// memory.
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], uint64_t a, uint64_t b,
                                                bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : HDK_WGMMA_ACC8(d, 0), HDK_WGMMA_ACC8(d, 8), HDK_WGMMA_ACC8(d, 16), HDK_WGMMA_ACC8(d, 24)
      : "l"(a), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d (64 x 256) += a b: A 64 x 16 bf16 in registers (wgmma_a_coord), B 16 x 256 N-major in shared
// memory.
__device__ __forceinline__ void wgmma_m64n256k16_a_registers(float (&d)[128],
                                                             const uint32_t (&a)[4], uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" HDK_WGMMA_D128
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 1;\n}\n"
      : HDK_WGMMA_ACC128(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// d (64 x 256) += a b: A 64 x 16 K-major and B 16 x 256 N-major, both in shared memory.
__device__ __forceinline__ void wgmma_m64n256k16(float (&d)[128], uint64_t a, uint64_t b) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" HDK_WGMMA_D128
      "}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : HDK_WGMMA_ACC128(d)
      : "l"(a), "l"(b));
}

// d (64 x 64) = a b (+ d when `accumulate`): A 64 x 16 bf16 in registers (wgmma_a_coord), B
// 16 x 64 K-major in shared memory.
__device__ __forceinline__ void wgmma_m64n64k16_a_registers(float (&d)[32], const uint32_t (&a)[4],
                                                            uint64_t b, bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : HDK_WGMMA_ACC8(d, 0), HDK_WGMMA_ACC8(d, 8), HDK_WGMMA_ACC8(d, 16), HDK_WGMMA_ACC8(d, 24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

// d (64 x 64) = a b (+ d when `accumulate`), FP8: A 64 x 32 E4M3 in registers (four codes a
// register, dsv4/index_topk/index_fp8_layout.h), B 32 x 64 E4M3 K-major in shared memory (8-bit
// operands are K-major only, so the instruction takes no transpose flags).
__device__ __forceinline__ void wgmma_m64n64k32_e4m3_a_registers(float (&d)[32],
                                                                 const uint32_t (&a)[4], uint64_t b,
                                                                 bool accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1;\n}\n"
      : HDK_WGMMA_ACC8(d, 0), HDK_WGMMA_ACC8(d, 8), HDK_WGMMA_ACC8(d, 16), HDK_WGMMA_ACC8(d, 24)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(static_cast<int>(accumulate)));
}

#undef HDK_WGMMA_ACC128
#undef HDK_WGMMA_D128
#undef HDK_WGMMA_ACC8

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
