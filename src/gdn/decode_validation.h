// The one place that checks a GDN decode call; every backend (and the reference) calls it.
#pragma once

#include "gdn/decode_problem.h"
#include "hdk/gdn/decode.h"

namespace hdk {
namespace gdn {
namespace detail {

// Checks ranks, shapes, dtypes, strides, devices, option values and aliasing; throws hdk::Error
// naming the argument, the expectation and what was given. Reads no tensor data.
DecodeProblem validate_decode(const DecodeParams& params);

// The data checks of DecodeParams::check_indices, over a problem whose index tensors are
// readable on the host: throws for every request plan_request() would mark invalid, and for
// slots written twice or written by one request and read by another.
void check_index_data(const DecodeProblem& host_problem);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
