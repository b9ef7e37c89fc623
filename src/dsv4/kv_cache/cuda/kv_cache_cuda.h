// The CUDA backend of the KV cache operations (compiled only with HDK_WITH_CUDA). Each function
// checks what its kernels need beyond the shared validation, then enqueues on `stream`: no
// allocation, no synchronization. Rows with an index out of range are skipped and counted.
#pragma once

#include "core/cuda/index_view_to_host.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "hdk/cuda_stream.h"

namespace hdk {
namespace dsv4 {
namespace detail {

void store_entries_cuda(const StoreEntriesProblem& problem, int device, CudaStream stream);
void gather_entries_cuda(const GatherEntriesProblem& problem, int device, CudaStream stream);
void store_indexer_keys_cuda(const StoreKeysProblem& problem, int device, CudaStream stream);
void gather_indexer_keys_cuda(const GatherKeysProblem& problem, int device, CudaStream stream);
// check_indices: the host copy of an index view that the data checks read.
using hdk::detail::copy_indices_to_host;

// `count` (1 or 2) compressor calls and, when `store` is given, store_entries(*store) in one
// launch; no call may write anything another touches.
void write_layer_cuda(const CompressorProblem* problems, int count,
                      const StoreEntriesProblem* store, int device, CudaStream stream);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
