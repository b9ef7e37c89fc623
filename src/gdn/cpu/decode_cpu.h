// The CPU backend of GDN decode: fp32 math, threads over (request, value head).
#pragma once

#include "gdn/decode_problem.h"

namespace hdk {
namespace gdn {
namespace detail {

void decode_cpu(const DecodeProblem& problem);

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
