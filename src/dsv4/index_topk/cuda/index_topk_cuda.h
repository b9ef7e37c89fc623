// The CUDA backend of hdk::dsv4::index_topk (compiled only with HDK_WITH_CUDA). One launch: a
// cluster of CTAs per row scores its entries into shared memory and selects the top-k there; or,
// with the caller's workspace and few rows, two: CTAs over every SM score the rows into the
// workspace, then a cluster per row (one CTA for a short row) selects from there
// (docs/dsv4-attention.md, "index_topk through the workspace"). No allocation, no synchronization.
// Rows whose num_entries or used block ids are out of range are not checked on the host: the
// kernels give them only padding and count them in invalid_count.
#pragma once

#include <cstdint>

#include "dsv4/attention/attention_problem.h"
#include "dsv4/index_topk/index_launch_plan.h"
#include "hdk/cuda_stream.h"

namespace hdk {
namespace dsv4 {
namespace detail {

void index_topk_cuda(const IndexerProblem& problem, int device, CudaStream stream);

// What index_topk_cuda launches for a call (for the benchmark's table): scoring CTAs per row
// through the workspace (0: the one-launch kernel), CTAs per row of the cluster that selects, and
// whether the workspace's select runs its one-CTA kernel instead (cluster_size is then 1).
struct IndexLaunchReport {
  int64_t segments = 0;
  int cluster_size = 0;
  bool select_in_one_cta = false;
  bool key_ring = false;  // the scoring kernel streams the keys through shared memory
};
IndexLaunchReport index_topk_launch_report(const IndexerProblem& problem, int device);

// How the kernel computes q · K: tensor cores (the default: a warpgroup's wgmma per 64 entries
// up to 64 heads, a warp's mma.sync per 8 entries above), the warp kernel at any head count, or
// plain fp32 FMAs on CUDA cores (slow, kept as an independent cross-check). A test and tuning aid,
// affecting every later call in the process; the tests restore the default with a scope guard.
enum class IndexScorePath { kTensorCore, kWarpMma, kCudaCore };
void set_index_score_path(IndexScorePath path);
IndexScorePath index_score_path();

// The key ring's choice (IndexKeyRingChoice, index_launch_plan.h) for every later call in the
// process.
void set_index_key_ring_override(IndexKeyRingChoice choice);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
