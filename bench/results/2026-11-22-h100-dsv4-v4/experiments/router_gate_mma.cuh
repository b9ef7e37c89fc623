// Experiment record (2026-11-22, 4th session), not built: the header the staged gate kernel in
// this folder was compiled against. See ../README.md.
// What the two tensor-core gate kernels (router_gate_gemm.cu, router_gate_gemm_staged.cu) share:
// the bf16 MMA, and the deterministic end of the product, where a cluster whose CTAs split D
// sums its partial logits in a fixed order and writes them.
#pragma once

#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "dsv4/cuda/router_launch.h"

namespace hdk {
namespace dsv4 {
namespace detail {

constexpr int kMmaExperts = 16;  // MMA m16: experts of one tile
constexpr int kMmaTokens = 8;    // MMA n8: rows of hidden of one tile
constexpr int kMmaTileEntries = kMmaExperts * kMmaTokens;
constexpr int kChunk = 32;  // d values per pair of k16 MMA steps

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_chunk(float (&c)[4], const uint4& lo, const uint4& hi,
                                          const uint4& b) {
  mma_bf16_16816(c, lo.x, hi.x, lo.y, hi.y, b.x, b.y);
  mma_bf16_16816(c, lo.z, hi.z, lo.w, hi.w, b.z, b.w);
}

__device__ __forceinline__ void store_accumulator_tile(float* tile, const float (&acc)[4],
                                                       int lane) {
  const int group = lane >> 2;
  const int thread = lane & 3;
  *reinterpret_cast<float2*>(tile + group * kMmaTokens + 2 * thread) = make_float2(acc[0], acc[1]);
  *reinterpret_cast<float2*>(tile + (group + 8) * kMmaTokens + 2 * thread) =
      make_float2(acc[2], acc[3]);
}

// Sums kDGroups partials per entry in order, pushes entry i to CTA i / kSegment of the cluster,
// and after one cluster barrier each CTA adds its kSplits rows in rank order and stores them.
template <int kSplits, int kDGroups, int kEntries, int kTokenTiles, int kThreads>
__device__ __forceinline__ void finish_cluster_sums(const float* partial,
                                                    float (*received)[kEntries / kSplits],
                                                    const GateOperands& args, int64_t expert_base,
                                                    int64_t token_base) {
  constexpr int kSegment = kEntries / kSplits;
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
  for (int i = threadIdx.x; i < kEntries; i += kThreads) {
    float sum = partial[i];
#pragma unroll
    for (int g = 1; g < kDGroups; ++g)
      sum += partial[g * kEntries + i];
    float* target = cluster.map_shared_rank(&received[rank][0], i / kSegment);
    target[i % kSegment] = sum;
  }
  cluster.sync();
  for (int t = threadIdx.x; t < kSegment; t += kThreads) {
    float sum = received[0][t];
#pragma unroll
    for (int source = 1; source < kSplits; ++source)
      sum += received[source][t];
    const int entry = rank * kSegment + t;
    const int expert_tile = entry / (kTokenTiles * kMmaTileEntries);
    const int token_tile = (entry / kMmaTileEntries) % kTokenTiles;
    const int expert = (entry / kMmaTokens) % kMmaExperts;
    const int64_t n = token_base + token_tile * kMmaTokens + entry % kMmaTokens;
    const int64_t e = expert_base + expert_tile * kMmaExperts + expert;
    if (n < args.N && e < args.E) args.logits[n * args.logits_stride + e] = sum;
  }
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
