// The float64 oracle of GDN decode: the spec written out as plainly as possible, for tests and
// for `hdk-bench --verify`. Slow on purpose; never a user-facing backend.
#pragma once

#include "hdk/gdn/decode.h"

namespace hdk {
namespace gdn {

// Same contract as decode() for CPU tensors: validates, then computes every value in double
// and rounds once when storing into out, the pool and intermediate_states (whatever dtype they
// have). Derives the pool-index semantics on its own, sharing no code with the backends.
void decode_reference(const DecodeParams& params);

}  // namespace gdn
}  // namespace hdk
