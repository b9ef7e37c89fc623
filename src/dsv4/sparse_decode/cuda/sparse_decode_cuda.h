// The CUDA backend of hdk::dsv4::sparse_decode (compiled only with HDK_WITH_CUDA): enqueues on
// `stream` without allocating or synchronizing. A query row naming a slot at or beyond the cache
// is not computed: it gets o = 0 and lse = NaN and counts as invalid (the caller may check the
// indices on the host first; see SparseDecodeParams::check_indices). Kernel design:
// docs/dsv4-attention.md.
#pragma once

#include "dsv4/attention/attention_problem.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/cuda_stream.h"

namespace hdk {
namespace dsv4 {
namespace detail {

void sparse_decode_cuda(const SparseDecodeProblem& problem, int device, CudaStream stream);

// Which kernel serves a call: the dispatcher's choice (kAuto: for Hq a multiple of 16 up to 512
// what kTensorCorePipelined picks, else the CUDA-core kernel), or one forced. kTensorCore: the
// tensor-core kernel without warp specialization; kTensorCorePipelined: the warp-specialized one
// where a CTA's slice of the list is long enough (and the pools allow it), the other elsewhere;
// kTensorCorePipelinedEveryCall: the warp-specialized one on every call it can serve (the tests). A
// test and benchmark aid affecting every later call in the process; forcing a tensor-core kernel
// for a head count it cannot serve is an hdk::Error at the call.
enum class SparseDecodeKernel {
  kAuto,
  kTensorCore,
  kTensorCorePipelined,
  kTensorCorePipelinedEveryCall,
  kCudaCore
};
void set_sparse_decode_kernel_override(SparseDecodeKernel kernel);

// Tuning aid for the tensor-core kernel, affecting every later call in the process: the list
// splits of each row's cluster (0 = the launch plan's), at most what the cluster limit and one
// tile per split allow.
void set_sparse_decode_splits_override(int splits);

// Tuning aid, affecting every later call in the process: whether a call with a workspace splits
// its rows through it where the plan finds that faster (kAuto), never, or wherever it can split
// (kAlways). With the splits override, the count applies to the plan chosen here.
enum class SparseWorkspaceChoice { kAuto, kNever, kAlways };
void set_sparse_decode_workspace_override(SparseWorkspaceChoice choice);

// What sparse_decode_cuda would launch for `problem` under the current overrides, for the
// benchmark's tables: kernel "simple" (CUDA cores; plan groups 0), "mma" or "pipelined", and
// the tensor-core kernels' row cluster.
struct SparseLaunchReport {
  const char* kernel = "simple";
  SparsePlan plan{0, 0};
};
SparseLaunchReport sparse_decode_launch_report(const SparseDecodeProblem& problem, int device);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
