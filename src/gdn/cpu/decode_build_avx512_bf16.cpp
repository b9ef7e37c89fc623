// The CPU decode's AVX-512 build with AVX512-BF16's conversion (decode_builds.h): 16-float vectors,
// bf16 rows stored by one instruction a vector.
#include <cstdint>

#include "gdn/cpu/decode_builds.h"
#include "gdn/cpu/decode_tasks.h"
#include "gdn/decode_problem.h"

namespace hdk {
namespace gdn {
namespace detail {

#ifdef HDK_GDN_CPU_X86_BUILDS
HDK_GDN_CPU_TARGET_AVX512_BF16 __attribute__((flatten)) int64_t run_tasks_avx512_bf16(
    const DecodeProblem& p, int64_t begin, int64_t end) {
  return run_tasks<float16, NativeBf16>(p, begin, end);
}
#endif

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
