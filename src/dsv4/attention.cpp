// Entry points of the read side: validate once, then run the backend of the device the tensors
// live on. The CPU checks entry counts, block ids and slots on the host first (an hdk::Error
// before anything is written). There are no CUDA kernels yet: CUDA tensors get an hdk::Error that
// says so, after the same validation, so a caller's mistakes surface the same way on both.
#include "hdk/dsv4/attention.h"

#include <string>

#include "dsv4/attention_validation.h"
#include "dsv4/cpu/attention_cpu.h"
#include "hdk/error.h"

#ifdef HDK_WITH_CUDA
#include "dsv4/cuda/index_topk_cuda.h"
#endif

namespace hdk {
namespace dsv4 {
namespace {

[[noreturn]] void no_cuda_backend(const char* operation, const Device& device) {
#ifdef HDK_WITH_CUDA
  throw Error(std::string(operation) + ": the tensors are on " + device.str() +
              ", but this operation is not implemented on CUDA yet (only the CPU backend "
              "exists; see docs/dsv4-attention.md)");
#else
  throw Error(std::string(operation) + ": the tensors are on " + device.str() +
              " but this build of hdk has no CUDA backend (configure with -DHDK_WITH_CUDA=ON); "
              "this operation is not implemented on CUDA yet either");
#endif
}

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
    throw Error("hdk::dsv4::index_topk: the tensors are on " + device.str() +
                " but this build of hdk has no CUDA backend (configure with -DHDK_WITH_CUDA=ON)");
#endif
  }
  detail::check_indexer_indices(problem);
  detail::index_topk_cpu(problem);
}

void sparse_decode(const SparseDecodeParams& params) {
  sparse_decode(params, nullptr);
}

void sparse_decode(const SparseDecodeParams& params, CudaStream stream) {
  (void)stream;
  const detail::SparseDecodeProblem problem = detail::validate_sparse_decode(params);
  const Device device = params.out.device;
  if (!device.is_cpu()) no_cuda_backend("hdk::dsv4::sparse_decode", device);
  detail::check_sparse_indices(problem);
  detail::sparse_decode_cpu(problem);
}

}  // namespace dsv4
}  // namespace hdk
