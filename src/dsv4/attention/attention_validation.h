// The one place that checks hdk::dsv4::index_topk and sparse_decode calls; both backends and the
// float64 reference call it. validate_* check ranks, shapes, dtypes, strides, devices, options and
// aliasing, throw hdk::Error naming the argument, the expectation and what was given, and read no
// tensor data. The check_* functions are the CPU's data checks (entry counts, block ids, slots),
// run on the host before anything is written.
#pragma once

#include "dsv4/attention/attention_problem.h"
#include "hdk/dsv4/attention.h"

namespace hdk {
namespace dsv4 {
namespace detail {

IndexerProblem validate_index_topk(const IndexerParams& params);
SparseDecodeProblem validate_sparse_decode(const SparseDecodeParams& params);

// num_entries[n] in 0 .. max_blocks * block_size, and every page those entries use names a block
// of the key cache.
void check_indexer_indices(const IndexerProblem& host_problem);
// Every index below the cache's slots (negative ones are skipped).
void check_sparse_indices(const SparseDecodeProblem& host_problem);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
