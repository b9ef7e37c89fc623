// The one place that checks an hdk::dsv4::route call; every backend (and the reference) calls it.
#pragma once

#include "dsv4/router/router_problem.h"
#include "hdk/dsv4/router.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// Checks ranks, shapes, dtypes, strides, devices, options and aliasing; throws hdk::Error naming
// the argument, the expectation and what was given. Reads no tensor data.
RouterProblem validate_route(const RouterParams& params);

// The CPU's data check for hash routing, over a problem whose token_ids and tid2eid are readable
// on the host: throws for a token id outside tid2eid's rows and for a table entry that is not an
// expert id (the CUDA backend runs such rows as invalid and counts them instead).
void check_hash_indices(const RouterProblem& host_problem);

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
