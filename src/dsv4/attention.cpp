// Entry points of the read side: validate once, then run the backend of the device the tensors
// live on. The CPU checks entry counts, block ids and slots on the host first (an hdk::Error
// before anything is written); the CUDA kernels make such rows invalid and count them instead
// (sparse_decode's check_indices asks for the CPU's check, at the cost of a synchronization).
#include "hdk/dsv4/attention.h"

#include <cstdint>
#include <string>
#include <vector>

#include "dsv4/attention_validation.h"
#include "dsv4/cpu/attention_cpu.h"
#include "hdk/error.h"

#ifdef HDK_WITH_CUDA
#include "dsv4/cuda/index_topk_cuda.h"
#include "dsv4/cuda/kv_cache_cuda.h"
#include "dsv4/cuda/sparse_decode_cuda.h"
#endif

namespace hdk {
namespace dsv4 {
namespace {

#ifndef HDK_WITH_CUDA
[[noreturn]] void no_cuda_build(const char* operation, const Device& device) {
  throw Error(std::string(operation) + ": the tensors are on " + device.str() +
              " but this build of hdk has no CUDA backend (configure with -DHDK_WITH_CUDA=ON)");
}
#endif

}  // namespace

void index_topk(const IndexerParams& params) {
  index_topk(params, nullptr);
}

void index_topk(const IndexerParams& params, CudaStream stream) {
  const detail::IndexerProblem problem = detail::validate_index_topk(params);
  const Device device = params.topk_indices.device;
  if (!device.is_cpu()) {
#ifdef HDK_WITH_CUDA
    // No host check of num_entries and block ids (it would synchronize): the kernel gives such
    // rows padding and counts them.
    detail::index_topk_cuda(problem, device.index, stream);
    return;
#else
    (void)stream;
    no_cuda_build("hdk::dsv4::index_topk", device);
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
  no_cuda_build("hdk::dsv4::sparse_decode", device);
#endif
}

}  // namespace dsv4
}  // namespace hdk
