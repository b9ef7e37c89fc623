// The CPU backend of the read side: keys and entries decoded from their pages one at a time
// (never a dequantized copy of a cache), fp32 arithmetic, threads over rows and entry chunks.
#pragma once

#include "dsv4/attention/attention_problem.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Entry counts and block ids must have been checked (check_indexer_indices) first.
void index_topk_cpu(const IndexerProblem& problem);
// Indices must have been checked (check_sparse_indices) first.
void sparse_decode_cpu(const SparseDecodeProblem& problem);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
