// The CPU backend of the KV cache operations: threads over rows, the shared encoders of
// kv_formats.h. Index ranges must have been checked (check_slots, check_compressor_indices).
#pragma once

#include "dsv4/kv_cache/kv_cache_problem.h"

namespace hdk {
namespace dsv4 {
namespace detail {

void store_entries_cpu(const StoreEntriesProblem& problem);
void gather_entries_cpu(const GatherEntriesProblem& problem);
void store_indexer_keys_cpu(const StoreKeysProblem& problem);
void gather_indexer_keys_cpu(const GatherKeysProblem& problem);
void compress_cpu(const CompressorProblem& problem);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
