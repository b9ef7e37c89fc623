// The CUDA backend of hdk::dsv4::quantize_indexer_query (compiled only with HDK_WITH_CUDA): one
// warp per [n, h] vector, encoded by the indexer-key encoder store_indexer_keys' kernel uses
// (kv_cache/cuda/key_encode.cuh). Enqueues one kernel on `stream`: no allocation, no
// synchronization, capturable in a CUDA graph.
#pragma once

#include "dsv4/index_topk/query_quantize_problem.h"
#include "hdk/cuda_stream.h"

namespace hdk {
namespace dsv4 {
namespace detail {

void quantize_indexer_query_cuda(const QueryQuantizeProblem& problem, int device,
                                 CudaStream stream);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
