// The kernels of sparse_decode's CUDA backend, one translation unit each
// (sparse_decode_{mma,pipelined,combine,simple}_kernel.cu), and what their launches need besides
// the plan. The host dispatch (sparse_decode_cuda.cu) picks the kernel, its instance and
// its plan (sparse_decode_plan.h). Design: docs/dsv4-attention.md ("sparse_decode on CUDA").
#pragma once

#include <cuda_runtime.h>

#include "dsv4/attention/attention_problem.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Threads of a CTA: two warpgroups for the tensor-core kernel (also the CUDA-core kernel's eight
// warps, one head at a time each), three for the pipelined one (a producer and two consumers).
constexpr int kSparseThreads = 256;
constexpr int kSparseWarps = kSparseThreads / 32;
constexpr int kSparsePipelinedThreads = 384;
// The combine kernel's (kSparseCombineThreads) are set where its plan counts their jobs
// (sparse_decode_plan.h).

// A tensor-core kernel's instance. Their templates stay in their own translation units (nvcc 13
// makes a kernel template's stub local to the unit that defines it), which hand out the instances:
using TensorCoreKernel = void (*)(SparseDecodeProblem p, SparsePlan plan, bool q_vector,
                                  bool out_vector);

// Tensor-core kernel (sparse_decode_mma_kernel.cu): a CTA per head group and list split, 8 warps
// converting a tile and then multiplying it. `wide`: the pools allow 16-byte copies;
// `partials`: whether the splits meet in the row's cluster or in the caller's workspace, and
// there in which records; `group_heads`: the plan's heads a group (64, or 32 or 16 through the
// workspace; any other is an hdk::Error).
TensorCoreKernel sparse_decode_mma_instance(bool wide, SparsePartials partials, int group_heads);

// Warp-specialized tensor-core kernel (sparse_decode_pipelined_kernel.cu): a producer warpgroup
// converts the next tile while two consumer warpgroups multiply this one. `shared_conversion`:
// two head groups, whose CTAs convert half of each tile for both.
TensorCoreKernel sparse_decode_pipelined_instance(bool wide, bool shared_conversion,
                                                  SparsePartials partials);

// Combine of the splits a tensor-core kernel left in the workspace
// (sparse_decode_combine_kernel.cu): a CTA per column slice of a row's head group, an instance for
// each size of group (SparsePlan::group_heads: 64, 32 or 16; any other is an hdk::Error) and
// record type (`bf16_records`: bf16 outputs, whose records finish_row writes in bf16).
using CombineKernel = void (*)(SparseDecodeProblem p, SparsePlan plan, int slices, bool out_vector);
CombineKernel sparse_decode_combine_instance(int group_heads, bool bf16_records);

// CUDA-core kernel (sparse_decode_simple_kernel.cu): a CTA per query row, any head count.
__global__ void sparse_decode_simple_kernel(SparseDecodeProblem p);

// The dynamic shared memory of a CTA of each tensor-core kernel (its layout, aligned up to the
// swizzle atom inside the kernel).
int sparse_decode_mma_shared_bytes();
int sparse_decode_pipelined_shared_bytes();

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
