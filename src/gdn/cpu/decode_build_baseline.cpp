// The CPU decode's baseline build (decode_builds.h): 4-float vectors, one SSE or NEON register.
#include <cstdint>

#include "gdn/cpu/decode_builds.h"
#include "gdn/cpu/decode_tasks.h"
#include "gdn/decode_problem.h"

namespace hdk {
namespace gdn {
namespace detail {

__attribute__((flatten)) int64_t run_tasks_baseline(const DecodeProblem& p, int64_t begin,
                                                    int64_t end) {
  return run_tasks<float4>(p, begin, end);
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
