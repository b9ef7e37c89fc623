// The CUDA backend of the KV cache operations (compiled only with HDK_WITH_CUDA). Each function
// checks what its kernels need beyond the shared validation, then enqueues on `stream`: no
// allocation, no synchronization. Rows with an index out of range are skipped and counted.
#pragma once

#include <cstdint>
#include <vector>

#include "dsv4/kv_cache_problem.h"
#include "hdk/cuda_stream.h"

namespace hdk {
namespace dsv4 {
namespace detail {

void store_entries_cuda(const StoreEntriesProblem& problem, int device, CudaStream stream);
void gather_entries_cuda(const GatherEntriesProblem& problem, int device, CudaStream stream);
void store_indexer_keys_cuda(const StoreKeysProblem& problem, int device, CudaStream stream);
void gather_indexer_keys_cuda(const GatherKeysProblem& problem, int device, CudaStream stream);
// check_indices: `index` ([rows, columns] with its strides) copied to `storage` on the host
// (synchronizing `stream`); returns the view of the copy.
IndexView copy_indices_to_host(const IndexView& index, int64_t rows, int64_t columns,
                               std::vector<uint8_t>& storage, int device, CudaStream stream);

void compress_cuda(const CompressorProblem& problem, int device, CudaStream stream);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
