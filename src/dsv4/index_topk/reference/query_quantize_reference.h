// The float64 oracle of hdk::dsv4::quantize_indexer_query, for tests: each [n, h] vector, as
// float64, rotated by the float64 Hadamard transform when `rotate`, then encoded by the KV cache
// reference's MXFP4 key encoder (nearest-value search, kv_cache_reference.h). Slow on purpose;
// shares no code with the backends.
#pragma once

#include "hdk/dsv4/attention.h"

namespace hdk {
namespace dsv4 {

// Same contract as quantize_indexer_query for CPU tensors (validated first).
void quantize_indexer_query_reference(const QuantizeIndexerQueryParams& params);

}  // namespace dsv4
}  // namespace hdk
