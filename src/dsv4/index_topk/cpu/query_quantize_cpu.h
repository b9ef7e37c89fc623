// The CPU backend of hdk::dsv4::quantize_indexer_query: threads over the [N, H] vectors, each
// encoded by the indexer-key encoder store_indexer_keys uses (kv_cache/cpu/key_encode.h).
#pragma once

#include "dsv4/index_topk/query_quantize_problem.h"

namespace hdk {
namespace dsv4 {
namespace detail {

void quantize_indexer_query_cpu(const QueryQuantizeProblem& problem);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
