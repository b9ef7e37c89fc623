#include "gdn/cpu/decode_cpu.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/thread_pool.h"
#include "gdn/cpu/decode_builds.h"
#include "gdn/decode_problem.h"
#include "hdk/dtype.h"

namespace hdk {
namespace gdn {
namespace detail {
namespace {

using RunTasks = int64_t (*)(const DecodeProblem&, int64_t, int64_t);

// The widest build this CPU runs, or a narrower one named by HDK_CPU_ISA ("avx512", "avx2",
// "baseline"): the tests run every build that way on one machine.
RunTasks pick_build() {
  const char* requested = std::getenv("HDK_CPU_ISA");
  const std::string limit = requested != nullptr ? requested : "";
#ifdef HDK_GDN_CPU_X86_BUILDS
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") &&
                      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  const bool avx512_bf16 =
      avx512 && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bf16");
  if (avx512_bf16 && limit.empty()) return run_tasks_avx512_bf16;
  if (avx512 && limit != "avx2" && limit != "baseline") return run_tasks_avx512;
  if (avx2 && limit != "baseline") return run_tasks_avx2;
#endif
  return run_tasks_baseline;
}

// A [1] int32/int64 counter of the call (absent: nullptr).
void add_to_counter(void* counter, DType dtype, int64_t amount) {
  if (counter == nullptr || amount == 0) return;
  if (dtype == DType::kInt64) {
    *static_cast<int64_t*>(counter) += amount;
  } else {
    *static_cast<int32_t*>(counter) += static_cast<int32_t>(amount);
  }
}

}  // namespace

void decode_cpu(const DecodeProblem& p) {
  if (p.invalid_index_count != nullptr) {
    int64_t invalid = 0;
    for (int64_t n = 0; n < p.num_requests; ++n)
      invalid += plan_request(p, n).invalid ? 1 : 0;
    add_to_counter(p.invalid_index_count, p.invalid_index_count_dtype, invalid);
  }
  static const RunTasks run = pick_build();
  std::atomic<int64_t> refused{0};
  hdk::detail::parallel_for(p.num_requests * p.num_v_heads, [&](int64_t begin, int64_t end) {
    const int64_t counted = run(p, begin, end);
    if (counted != 0) refused.fetch_add(counted, std::memory_order_relaxed);
  });
  add_to_counter(p.nonfinite_head_count, p.nonfinite_head_count_dtype, refused.load());
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
