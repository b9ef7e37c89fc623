// A test case's call validated into the DecodeProblem the backends read, with its tensors in host
// memory (so host-side code such as the request plans can read the index tensors), and, with the
// CUDA backend built, the dispatcher's launch plan for a problem under a forced choice.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "gdn/decode_problem.h"
#include "gdn/decode_validation.h"
#include "hdk/device.h"
#include "support/gdn_case.h"

#ifdef HDK_WITH_CUDA
#include "gdn/cuda/decode_cuda.h"
#endif

namespace hdk {
namespace testing {

class HostCall {
 public:
  explicit HostCall(const GdnCaseConfig& config) : case_(config) {
    for (const BufferSpec& buffer : case_.buffers())
      memory_.push_back(buffer.initial);
    std::vector<void*> bases;
    for (auto& bytes : memory_)
      bases.push_back(bytes.data());
    problem_ = gdn::detail::validate_decode(case_.bind(bases, Device::cpu()));
  }
  const gdn::detail::DecodeProblem& problem() const { return problem_; }
  int64_t expected_invalid() const { return case_.expected_invalid(); }

 private:
  GdnCase case_;
  std::vector<std::vector<uint8_t>> memory_;
  gdn::detail::DecodeProblem problem_;
};

#ifdef HDK_WITH_CUDA
// plan_launch for `p` on a 132-SM device with `forced` as its tuning (no process-wide state).
inline gdn::detail::LaunchPlan plan_with(const gdn::detail::DecodeProblem& p,
                                         const gdn::detail::LaunchOverride& forced = {}) {
  return gdn::detail::plan_launch(p, gdn::detail::DeviceInfo{132}, forced);
}

// Whether a CUDA call of `test_case` launched what plan_launch gives under `forced`: the kernel,
// its build and shape (not the load order, which depends on the device's SM count). An empty
// call launches nothing and passes.
inline ::testing::AssertionResult launched_as_planned(const GdnCase& test_case,
                                                      const gdn::detail::LaunchOverride& forced,
                                                      const gdn::detail::LaunchPlan& launched) {
  if (launched.ctas == 0) return ::testing::AssertionSuccess();
  std::vector<std::vector<uint8_t>> memory;
  std::vector<void*> bases;
  for (const BufferSpec& buffer : test_case.buffers())
    memory.push_back(buffer.initial);
  for (auto& bytes : memory)
    bases.push_back(bytes.data());
  const gdn::detail::LaunchPlan wanted =
      plan_with(gdn::detail::validate_decode(test_case.bind(bases, Device::cpu())), forced);
  auto describe = [](const gdn::detail::LaunchPlan& plan) {
    return std::string(gdn::detail::decode_kernel_name(plan.kernel)) + " w" +
           std::to_string(plan.warps_per_cta) + " r" + std::to_string(plan.rows_per_thread) + " l" +
           std::to_string(plan.lanes_per_row) + (plan.one_token_build ? " one-token" : "") +
           (plan.common_form ? " common" : "") + (plan.narrow_offsets ? " narrow" : "");
  };
  if (describe(launched) == describe(wanted)) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "launched " << describe(launched) << ", the forced plan is " << describe(wanted);
}
#endif

}  // namespace testing
}  // namespace hdk
