// Entry points of the read side: validate once, then run the backend of the device the tensors
// live on. The CPU checks entry counts, block ids and slots on the host first (an hdk::Error
// before anything is written); the CUDA kernels make such rows invalid and count them instead
// (sparse_decode's check_indices asks for the CPU's check, at the cost of a synchronization).
#include "hdk/dsv4/attention.h"

#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/argument_checks.h"
#include "dsv4/attention/attention_validation.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/attention/cpu/attention_cpu.h"
#include "hdk/error.h"

#ifdef HDK_WITH_CUDA
#include "core/cuda_helpers.h"
#include "dsv4/index_topk/cuda/index_topk_cuda.h"
#include "dsv4/kv_cache/cuda/kv_cache_cuda.h"
#include "dsv4/sparse_decode/cuda/sparse_decode_cuda.h"
#endif

namespace hdk {
namespace dsv4 {
namespace {

// The SM count the workspace sizes are planned for; 0 for the CPU, which uses none.
int workspace_sm_count(const Device& device, const char* operation) {
  if (device.is_cpu()) return 0;
#ifdef HDK_WITH_CUDA
  return hdk::detail::cached_device_attribute(cudaDevAttrMultiProcessorCount, device.index,
                                              operation);
#else
  hdk::detail::throw_no_cuda_backend(operation, device);
#endif
}

void check_sizes(const char* operation,
                 std::initializer_list<std::pair<const char*, int64_t>> sizes) {
  for (const auto& [name, value] : sizes) {
    if (value < 0) {
      throw Error(std::string(operation) + ": argument '" + name + "' must not be negative, got " +
                  std::to_string(value));
    }
  }
}

#ifdef HDK_WITH_CUDA
// A workspace given to a CUDA call must hold what the size function promises for the call's
// sizes, whether or not this call's plan uses it: a short allocation then fails on the first
// call instead of on a later one whose plan needs more.
void check_workspace_holds(const char* operation, int64_t given, int64_t needed,
                           const std::string& size_call) {
  if (given >= needed) return;
  throw Error(std::string(operation) + ": argument 'workspace' must hold at least " +
              std::to_string(needed) + " bytes (" + size_call + "), got " + std::to_string(given));
}
#endif

}  // namespace

int64_t index_topk_workspace_bytes(int64_t num_rows, int64_t max_entries, const Device& device) {
  constexpr const char* kOperation = "hdk::dsv4::index_topk_workspace_bytes";
  check_sizes(kOperation, {{"num_rows", num_rows}, {"max_entries", max_entries}});
  if (workspace_sm_count(device, kOperation) == 0) return 0;
  return detail::index_workspace_layout(num_rows, max_entries).bytes;
}

int64_t sparse_decode_workspace_bytes(int64_t num_rows, int64_t num_heads, int64_t list_length,
                                      const Device& device) {
  constexpr const char* kOperation = "hdk::dsv4::sparse_decode_workspace_bytes";
  check_sizes(kOperation,
              {{"num_rows", num_rows}, {"num_heads", num_heads}, {"list_length", list_length}});
  const int sm_count = workspace_sm_count(device, kOperation);
  if (sm_count == 0) return 0;
  return detail::sparse_workspace_bytes_up_to(num_rows, num_heads, list_length, sm_count);
}

void index_topk(const IndexerParams& params) {
  index_topk(params, nullptr);
}

void index_topk(const IndexerParams& params, CudaStream stream) {
  const detail::IndexerProblem problem = detail::validate_index_topk(params);
  const Device device = params.topk_indices.device;
  if (!device.is_cpu()) {
#ifdef HDK_WITH_CUDA
    if (problem.workspace != nullptr) {
      const int64_t max_entries = problem.max_blocks * problem.keys.block_size;
      check_workspace_holds("hdk::dsv4::index_topk", problem.workspace_bytes,
                            index_topk_workspace_bytes(problem.num_rows, max_entries, device),
                            "index_topk_workspace_bytes(" + std::to_string(problem.num_rows) +
                                ", " + std::to_string(max_entries) + ", device)");
    }
    // No host check of num_entries and block ids (it would synchronize): the kernel gives such
    // rows padding and counts them.
    detail::index_topk_cuda(problem, device.index, stream);
    return;
#else
    (void)stream;
    hdk::detail::throw_no_cuda_backend("hdk::dsv4::index_topk", device);
#endif
  }
  detail::check_indexer_indices(problem);
  detail::index_topk_cpu(problem);
}

void sparse_decode(const SparseDecodeParams& params) {
  sparse_decode(params, nullptr);
}

void sparse_decode(const SparseDecodeParams& params, CudaStream stream) {
  const detail::SparseDecodeProblem problem = detail::validate_sparse_decode(params);
  const Device device = params.out.device;
  if (device.is_cpu()) {
    detail::check_sparse_indices(problem);
    detail::sparse_decode_cpu(problem);
    return;
  }
#ifdef HDK_WITH_CUDA
  if (problem.workspace != nullptr) {
    const int64_t list_length = problem.list_length();
    check_workspace_holds(
        "hdk::dsv4::sparse_decode", problem.workspace_bytes,
        sparse_decode_workspace_bytes(problem.num_rows, problem.num_heads, list_length, device),
        "sparse_decode_workspace_bytes(" + std::to_string(problem.num_rows) + ", " +
            std::to_string(problem.num_heads) + ", " + std::to_string(list_length) + ", device)");
  }
  // CUDA rows naming a slot beyond the cache are invalid rows; the host check is opt-in.
  if (params.check_indices) {
    std::vector<uint8_t> storage, extra_storage;
    detail::SparseDecodeProblem host = problem;
    host.indices = detail::copy_indices_to_host(problem.indices, problem.num_rows,
                                                problem.num_indices, storage, device.index, stream);
    host.extra_indices = detail::copy_indices_to_host(problem.extra_indices, problem.num_rows,
                                                      problem.num_extra_indices, extra_storage,
                                                      device.index, stream);
    detail::check_sparse_indices(host);
  }
  detail::sparse_decode_cuda(problem, device.index, stream);
#else
  (void)stream;
  hdk::detail::throw_no_cuda_backend("hdk::dsv4::sparse_decode", device);
#endif
}

}  // namespace dsv4
}  // namespace hdk
