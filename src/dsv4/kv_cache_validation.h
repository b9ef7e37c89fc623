// The one place that checks the KV cache operations' calls (kv_cache.h); every backend and the
// reference call it. Each function checks ranks, shapes, dtypes, strides, devices, options and
// aliasing, throws hdk::Error naming the argument, the expectation and what was given, and reads
// no tensor data. The check_* functions are the CPU's data checks (index ranges), run on the host
// before anything is written; the CUDA backend counts such rows in invalid_count instead.
#pragma once

#include "dsv4/kv_cache_problem.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {
namespace detail {

StoreEntriesProblem validate_store_entries(const StoreEntriesParams& params);
GatherEntriesProblem validate_gather_entries(const GatherEntriesParams& params);
StoreKeysProblem validate_store_indexer_keys(const StoreIndexerKeysParams& params);
GatherKeysProblem validate_gather_indexer_keys(const GatherIndexerKeysParams& params);
CompressorProblem validate_compress(const CompressorParams& params);

// Slot [row, column] of `slots` must be negative or below pool.num_slots().
void check_slots(const char* operation, const IndexView& slots, int64_t rows, int64_t columns,
                 const PagedPool& pool);
// Positions, pages and slots every live token of the call will use.
void check_compressor_indices(const CompressorProblem& host_problem);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
