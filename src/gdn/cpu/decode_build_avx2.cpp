// The CPU decode's AVX2/FMA build (decode_builds.h): 8-float vectors.
#include <cstdint>

#include "gdn/cpu/decode_builds.h"
#include "gdn/cpu/decode_tasks.h"
#include "gdn/decode_problem.h"

namespace hdk {
namespace gdn {
namespace detail {

#ifdef HDK_GDN_CPU_X86_BUILDS
HDK_GDN_CPU_TARGET_AVX2 __attribute__((flatten)) int64_t run_tasks_avx2(const DecodeProblem& p,
                                                                        int64_t begin,
                                                                        int64_t end) {
  return run_tasks<float8>(p, begin, end);
}
#endif

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
