// The table of built GDN kernels (src/gdn/cuda/built_kernels.h) against the dispatcher: every
// plan it makes on its own needs no tuning-sweep kernel, so a default build (without
// -DHDK_GDN_SWEEP_KERNELS=ON) serves every call; a forced sweep shape is built exactly when the
// option is on, and refused with the option's name otherwise. The plan checks are plain C++.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <tuple>

#include "hdk/dtype.h"
#include "hdk/error.h"
#include "support/gdn_case.h"
#include "support/gdn_host_call.h"

#ifdef HDK_WITH_CUDA
#include "gdn/cuda/built_kernels.h"
#include "gdn/cuda/decode_cuda.h"
#include "gdn/cuda/decode_launch.h"
#endif

namespace hdk {
namespace testing {
namespace {

#ifdef HDK_WITH_CUDA
using gdn::detail::DecodeKernel;
using gdn::detail::find_vk_shape;
using gdn::detail::kVKShapes;
using gdn::detail::LaunchOverride;
using gdn::detail::VKShapeEntry;

TEST(GdnBuiltKernels, EachStateDtypeAndHeadSizeHasItsDefaultShapeOnce) {
  std::set<std::tuple<int, int, int, int>> seen;
  for (const VKShapeEntry& entry : kVKShapes) {
    EXPECT_TRUE(
        seen.insert({entry.state_bytes, entry.head_k, entry.lanes_per_row, entry.rows_per_thread})
            .second)
        << "shape listed twice";
    const bool default_shape =
        entry.lanes_per_row == gdn::detail::full_lanes_per_row(entry.state_bytes, entry.head_k) &&
        entry.rows_per_thread == gdn::detail::vk_default_rows(entry.state_bytes, entry.head_k);
    EXPECT_EQ(entry.sweep_only, !default_shape)
        << entry.state_bytes << "-byte state, K = " << entry.head_k;
  }
  for (int bytes : {2, 4}) {
    for (int k : {64, 128, 256}) {
      const VKShapeEntry* entry = find_vk_shape(bytes, k, gdn::detail::full_lanes_per_row(bytes, k),
                                                gdn::detail::vk_default_rows(bytes, k));
      ASSERT_NE(entry, nullptr) << bytes << "-byte state, K = " << k;
      EXPECT_FALSE(entry->sweep_only);
    }
  }
}

TEST(GdnBuiltKernels, TheDispatchersPlansNeedNoSweepKernel) {
  int plans = 0;
  for (gdn::StateLayout layout : {gdn::StateLayout::kVK, gdn::StateLayout::kKV}) {
    for (DType state : {DType::kFloat32, DType::kBFloat16}) {
      for (DType input : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
        for (int64_t K : {64, 128, 256}) {
          for (int64_t T : {1, 2, 8, 33}) {
            for (int64_t B : {1, 8, 300}) {
              for (bool verify : {false, true}) {
                // 300 requests (1200 heads: past the plan's head thresholds) only where the
                // buffers stay small; a verify cache of 33 tokens would be 650 MB.
                if ((verify && T == 1) || (B == 300 && (verify || T > 2))) continue;
                GdnCaseConfig config;
                config.layout = layout, config.state_dtype = state, config.input_dtype = input;
                config.K = K, config.V = 16, config.T = T, config.B = B;
                config.H = 2, config.HV = 4;
                config.intermediate = verify, config.update_state = !verify;
                const gdn::detail::DecodeProblem problem = HostCall(config).problem();
                const gdn::detail::LaunchPlan plan = plan_with(problem);
                SCOPED_TRACE(config.describe());
                ++plans;
                EXPECT_NE(plan.kernel, DecodeKernel::kVKOneTokenSweep);
                EXPECT_TRUE(gdn::detail::launch_plan_built(problem, plan));
                if (plan.kernel == DecodeKernel::kKV) continue;
                const VKShapeEntry* entry = find_vk_shape(static_cast<int>(dtype_size(state)), K,
                                                          plan.lanes_per_row, plan.rows_per_thread);
                ASSERT_NE(entry, nullptr);
                EXPECT_FALSE(entry->sweep_only);
              }
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(plans, 2 * 2 * 3 * 3 * (3 + 1 + 3 * 2 * 2));
}

TEST(GdnBuiltKernels, ForcedSweepKernelsAreBuiltWithTheOptionOnly) {
  GdnCaseConfig config;
  config.K = 128, config.V = 32, config.B = 3;
  const gdn::detail::DecodeProblem problem = HostCall(config).problem();
  LaunchOverride rows;
  rows.rows_per_thread = 2;
  EXPECT_EQ(gdn::detail::launch_plan_built(problem, plan_with(problem, rows)),
            gdn::detail::kSweepKernelsBuilt);
  LaunchOverride one_token_sweep;
  one_token_sweep.one_token_sweep = true;
  const gdn::detail::LaunchPlan sweep = plan_with(problem, one_token_sweep);
  EXPECT_EQ(sweep.kernel, DecodeKernel::kVKOneTokenSweep);
  EXPECT_EQ(gdn::detail::launch_plan_built(problem, sweep), gdn::detail::kOneTokenSweepKernelBuilt);
}

// On a GPU, a forced kernel this build lacks is an hdk::Error naming the option, before any
// launch; with the option it runs.
TEST(GdnBuiltKernels, AForcedKernelOutsideTheBuildIsAClearError) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << reason;
  GdnCaseConfig config;
  config.K = 128, config.V = 32, config.B = 3;
  const GdnCase test_case(config);
  LaunchOverride forced;
  forced.one_token_sweep = true;
  if (gdn::detail::kOneTokenSweepKernelBuilt) {
    const BufferContents expected = run_reference(test_case);
    gdn::detail::LaunchPlan launched;
    EXPECT_TRUE(outputs_match(test_case, expected, run_cuda_tuned(test_case, forced, &launched)));
    EXPECT_EQ(launched.kernel, DecodeKernel::kVKOneTokenSweep);
    return;
  }
  try {
    run_cuda_tuned(test_case, forced);
    ADD_FAILURE() << "a forced one-token sweep kernel ran in a build without it";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("-DHDK_GDN_SWEEP_KERNELS=ON"), std::string::npos)
        << error.what();
  }
}
#endif

}  // namespace
}  // namespace testing
}  // namespace hdk
