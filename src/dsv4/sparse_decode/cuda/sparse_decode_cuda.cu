// The host dispatch of sparse_decode's CUDA backend: which kernel serves a call (the tensor-core
// ones for Hq a multiple of 16 up to 512, else the CUDA-core one), its instance for the call's
// pools, head groups and combine, its plan (sparse_decode_plan.h) and the launches. The kernels
// are sparse_decode_kernels.cuh's, one file each. Design, the work split and what was verified
// where: docs/dsv4-attention.md ("sparse_decode on CUDA").
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <tuple>

#include "core/cuda_helpers.h"
#include "core/resident_clusters.h"
#include "dsv4/attention/attention_problem.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_cuda.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_kernels.cuh"
#include "dsv4/sparse_decode/cuda/sparse_decode_plan.h"
#include "hdk/cuda_stream.h"
#include "hdk/error.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

constexpr const char* kOperation = "hdk::dsv4::sparse_decode";

std::atomic<SparseDecodeKernel> kernel_override{SparseDecodeKernel::kAuto};
std::atomic<int> splits_override{0};
std::atomic<SparseWorkspaceChoice> workspace_override{SparseWorkspaceChoice::kAuto};

bool aligned_16(const void* pointer) {
  return reinterpret_cast<uintptr_t>(pointer) % 16 == 0;
}

// Whether the dispatcher (SparseDecodeKernel::kAuto) runs the pipelined kernel where it applies:
// on an H100 it is 1.2-1.7x the other from 3 tiles a CTA (bench/results/
// 2026-11-26-h100-sparse-pipelined), and since its handshakes moved to mbarriers it is
// racecheck-clean (docs/dsv4-attention.md, "Pipelined kernel").
constexpr bool kPipelinedByDefault = true;

// The pipelined kernel's speed comes from its steady state; on a slice of one or two tiles the
// first tile's latency dominates, and there the other tensor-core kernel, whose 8 warps all
// convert that tile, measured 1-3% faster (H100, Flash CSA lists at N <= 8: 2 tiles a CTA;
// git show 0712de7:bench/results/2026-11-26-h100-sparse-pipelined). From 3 tiles on, the pipelined
// one is ahead; its plan splits no further (kSparsePipelinedCosts), so only lists shorter than 3
// tiles, or a forced split count, leave it fewer.
constexpr int64_t kPipelinedMinTiles = kSparsePipelinedCosts.min_tiles_per_split;

// What a tensor-core launch runs: which kernel, its shared memory and threads, and the plan.
struct TensorCoreLaunch {
  TensorCoreKernel kernel;
  bool pipelined;
  unsigned threads;
  int shared_bytes;
  SparsePlan plan;
};

// The instance of a tensor-core kernel for a call's pools, head groups and partial results (the
// pipelined kernel's groups are always 64 heads).
TensorCoreKernel tensor_core_kernel(bool pipelined, bool shared_conversion, bool wide,
                                    SparsePartials partials, int group_heads) {
  return pipelined ? sparse_decode_pipelined_instance(wide, shared_conversion, partials)
                   : sparse_decode_mma_instance(wide, partials, group_heads);
}

// One of the two tensor-core kernels over the row clusters of plan_sparse_decode: `pipelined`
// false forces the other; true runs the pipelined one where the call allows it (the caller
// checked the pools) and, unless `forced`, where its slices are at least kPipelinedMinTiles
// long. `fewest_tiles` (the dispatcher's own choice) runs the other kernel one or two tiles a CTA
// through the workspace instead where plan_sparse_fewest_tiles applies.
TensorCoreLaunch plan_tensor_core(const SparseDecodeProblem& p, bool pipelined, bool forced,
                                  bool fewest_tiles, int device) {
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  const bool wide = aligned_16(p.cache.data) && p.cache.page_stride % 16 == 0 &&
                    (p.num_extra_indices == 0 ||
                     (aligned_16(p.extra_cache.data) && p.extra_cache.page_stride % 16 == 0));
  // Two head groups (Hq 65..128) share the conversion of each tile in the pipelined kernel.
  const bool shared_conversion = sparse_head_groups(p.num_heads) == 2;
  // A kernel's instance, threads and shared memory, its plan left to the caller.
  auto kernel_of = [&](bool use_pipelined, SparsePartials partials,
                       int group_heads = kSparseGroupHeads) {
    TensorCoreLaunch launch{};
    launch.pipelined = use_pipelined;
    launch.threads = use_pipelined ? kSparsePipelinedThreads : kSparseThreads;
    launch.shared_bytes =
        use_pipelined ? sparse_decode_pipelined_shared_bytes() : sparse_decode_mma_shared_bytes();
    launch.kernel =
        tensor_core_kernel(use_pipelined, shared_conversion, wide, partials, group_heads);
    hdk::detail::allow_dynamic_shared_memory(launch.kernel, launch.shared_bytes, device,
                                             kOperation);
    return launch;
  };
  const bool bf16_outputs = p.out_dtype == DType::kBFloat16;
  // A workspace plan's record type, for the plans that do not set it themselves (the fewest
  // tiles, a forced split count).
  auto with_records = [&](SparsePlan plan) {
    plan.bf16_records = plan.through_workspace &&
                        sparse_plan_bf16_records(plan, p.num_rows, sm_count, bf16_outputs);
    return plan;
  };
  auto launch_of = [&](bool use_pipelined) {
    TensorCoreLaunch launch = kernel_of(use_pipelined, SparsePartials::kInCluster);
    // Every cluster size (above 8 CTAs: 0 where the device does not run clusters of that size).
    const hdk::detail::ResidentClusterCounts& resident = hdk::detail::resident_clusters(
        launch.kernel, launch.threads, static_cast<size_t>(launch.shared_bytes), device,
        kOperation);
    const SparseKernelCosts costs = use_pipelined ? kSparsePipelinedCosts : kSparseMmaCosts;
    launch.plan = plan_sparse_decode(p.num_rows, p.num_heads, p.list_length(), resident, costs);
    const SparseWorkspaceChoice through = workspace_override.load();
    if (p.workspace != nullptr && through != SparseWorkspaceChoice::kNever) {
      const SparsePlan split = plan_sparse_workspace(p.num_rows, p.num_heads, p.list_length(),
                                                     sm_count, costs, bf16_outputs);
      const bool faster =
          sparse_plan_steps(split, p.num_rows, p.list_length(), resident, costs) <
          sparse_plan_steps(launch.plan, p.num_rows, p.list_length(), resident, costs);
      if (split.through_workspace && (faster || through == SparseWorkspaceChoice::kAlways)) {
        launch.plan = split;
      }
    }
    if (const int forced_splits = splits_override.load(); forced_splits > 0) {
      const int tiles = static_cast<int>(sparse_tiles(p.list_length()));
      const int most =
          launch.plan.through_workspace
              ? sparse_workspace_max_splits(p.num_rows, launch.plan.groups, tiles, sm_count)
              : sparse_max_splits(launch.plan.groups, tiles, resident.largest());
      launch.plan.splits = forced_splits < most ? forced_splits : most;
      launch.plan.through_workspace = launch.plan.through_workspace && launch.plan.splits > 1;
    }
    if (launch.plan.through_workspace) {
      launch.plan = with_records(launch.plan);
      launch.kernel = kernel_of(use_pipelined, sparse_partials(launch.plan)).kernel;
    }
    return launch;
  };
  if (pipelined && fewest_tiles && p.workspace != nullptr &&
      workspace_override.load() != SparseWorkspaceChoice::kNever && splits_override.load() == 0) {
    const SparsePlan plan =
        with_records(plan_sparse_fewest_tiles(p.num_rows, p.num_heads, p.list_length(), sm_count));
    if (plan.through_workspace) {
      TensorCoreLaunch launch = kernel_of(false, sparse_partials(plan), plan.group_heads);
      launch.plan = plan;
      return launch;
    }
  }
  TensorCoreLaunch launch = launch_of(pipelined);
  const int64_t tiles_per_cta =
      (sparse_tiles(p.list_length()) + launch.plan.splits - 1) / launch.plan.splits;
  if (pipelined && !forced && tiles_per_cta < kPipelinedMinTiles) launch = launch_of(false);
  return launch;
}

void launch_tensor_core(const SparseDecodeProblem& p, const TensorCoreLaunch& launch, int sm_count,
                        cudaStream_t stream) {
  const int64_t element = p.q.dtype == DType::kFloat32 ? 4 : 2;
  const bool q_vector = aligned_16(p.q.data) && (p.q.row_stride * element) % 16 == 0 &&
                        (p.q.head_stride * element) % 16 == 0;
  const int64_t out_element = p.out_dtype == DType::kFloat32 ? 4 : 2;
  const bool out_vector = reinterpret_cast<uintptr_t>(p.out) % (4 * out_element) == 0 &&
                          p.out_row_stride % 4 == 0 && p.out_head_stride % 4 == 0;
  const unsigned cluster = static_cast<unsigned>(launch.plan.cluster());
  const unsigned ctas = static_cast<unsigned>(p.num_rows * launch.plan.row_ctas());
  hdk::detail::check_launch(
      hdk::detail::launch_in_clusters(launch.kernel, ctas, launch.threads, launch.shared_bytes,
                                      stream, cluster, p, launch.plan, q_vector, out_vector),
      kOperation, launch.pipelined ? "sparse_decode_pipelined_kernel" : "sparse_decode_mma_kernel");
  if (!launch.plan.through_workspace) return;
  const int slices = sparse_combine_launch_slices(
      p.num_rows, launch.plan.groups, sm_count, launch.plan.group_heads, launch.plan.bf16_records);
  const unsigned combine_ctas = static_cast<unsigned>(p.num_rows * launch.plan.groups * slices);
  hdk::detail::check_launch(
      hdk::detail::launch_dependent(
          sparse_decode_combine_instance(launch.plan.group_heads, launch.plan.bf16_records),
          combine_ctas, kSparseCombineThreads, 0, stream, p, launch.plan, slices, out_vector),
      kOperation, "sparse_decode_combine_kernel");
}

// Which kernel serves a call, from the override and the problem: the CUDA-core one
// (tensor_core false), or a tensor-core one with the arguments of plan_tensor_core.
struct KernelChoice {
  bool tensor_core;
  bool pipelined;
  bool every_call;
  bool fewest_tiles;  // the dispatcher's choice: plan_sparse_fewest_tiles where it applies
};

KernelChoice choose_kernel(const SparseDecodeProblem& p) {
  const SparseDecodeKernel forced = kernel_override.load();
  const bool mma_fits = sparse_mma_supports(p.num_heads);
  const bool pipelined_asked = forced == SparseDecodeKernel::kTensorCorePipelined ||
                               forced == SparseDecodeKernel::kTensorCorePipelinedEveryCall ||
                               (forced == SparseDecodeKernel::kAuto && kPipelinedByDefault);
  const bool forced_tensor_core = forced == SparseDecodeKernel::kTensorCore || pipelined_asked;
  if (forced != SparseDecodeKernel::kAuto && forced_tensor_core && !mma_fits) {
    throw Error(std::string(kOperation) +
                ": the tensor-core kernel was forced, but it serves only "
                "head counts that are multiples of 16 up to 512, got Hq = " +
                std::to_string(p.num_heads));
  }
  // The pipelined kernel points the loads of entries that are not real at a pool's first
  // entry and divides slots in 32 bits: without a slot in any pool (nothing to attend to), or
  // with a pool of 2^31 slots or more (over a terabyte of entries), the other one runs.
  const bool extra_used = p.num_extra_indices > 0;
  const bool pool_with_slots =
      p.cache.num_slots() > 0 || (extra_used && p.extra_cache.num_slots() > 0);
  const bool narrow_slots =
      p.cache.num_slots() <= INT32_MAX && (!extra_used || p.extra_cache.num_slots() <= INT32_MAX);
  return KernelChoice{forced == SparseDecodeKernel::kAuto ? mma_fits : forced_tensor_core,
                      pipelined_asked && pool_with_slots && narrow_slots,
                      forced == SparseDecodeKernel::kTensorCorePipelinedEveryCall,
                      forced == SparseDecodeKernel::kAuto};
}

}  // namespace

void set_sparse_decode_kernel_override(SparseDecodeKernel kernel) {
  kernel_override.store(kernel);
}

void set_sparse_decode_splits_override(int splits) {
  splits_override.store(splits);
}

void set_sparse_decode_workspace_override(SparseWorkspaceChoice choice) {
  workspace_override.store(choice);
}

void sparse_decode_cuda(const SparseDecodeProblem& p, int device, CudaStream stream) {
  if (p.num_rows == 0) return;
  for (const auto& [pool, name, used] :
       {std::make_tuple(&p.cache, "cache", true),
        std::make_tuple(&p.extra_cache, "extra_cache", p.num_extra_indices > 0)}) {
    if (used && (reinterpret_cast<uintptr_t>(pool->data) % 8 != 0 || pool->page_stride % 8 != 0)) {
      throw Error(std::string(kOperation) + ": argument '" + name +
                  "' must be 8-byte aligned with a page stride that is a multiple of 8 bytes on "
                  "CUDA");
    }
  }
  const KernelChoice choice = choose_kernel(p);
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const int sm_count =
      hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device, kOperation);
  if (choice.tensor_core) {
    launch_tensor_core(
        p, plan_tensor_core(p, choice.pipelined, choice.every_call, choice.fewest_tiles, device),
        sm_count, stream);
    return;
  }
  hdk::detail::check_launch(
      hdk::detail::launch_dependent(sparse_decode_simple_kernel, static_cast<unsigned>(p.num_rows),
                                    kSparseThreads, 0, stream, p),
      kOperation, "sparse_decode_simple_kernel");
}

SparseLaunchReport sparse_decode_launch_report(const SparseDecodeProblem& p, int device) {
  SparseLaunchReport report;
  if (p.num_rows == 0) return report;
  const KernelChoice choice = choose_kernel(p);
  if (!choice.tensor_core) return report;
  hdk::detail::CudaDeviceGuard guard(device, kOperation);
  const TensorCoreLaunch launch =
      plan_tensor_core(p, choice.pipelined, choice.every_call, choice.fewest_tiles, device);
  report.kernel = launch.pipelined ? "pipelined" : "mma";
  report.plan = launch.plan;
  return report;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
