// The host-side checks that pick a build of the CUDA short kernel: 32-bit token
// offsets only where every offset fits, and the most tokens a request can run; with the CUDA
// backend built, the dispatcher's choice of kernel and warps per CTA (plan_launch). Plain C++,
// so these run on the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <tuple>

#include "gdn/decode_problem.h"
#include "gdn/short_kernel_fit.h"
#include "hdk/dtype.h"
#include "support/gdn_case.h"
#include "support/gdn_host_call.h"

#ifdef HDK_WITH_CUDA
#include "gdn/cuda/decode_cuda.h"
#endif

namespace hdk {
namespace testing {
namespace {

using gdn::detail::DecodeProblem;
using gdn::detail::TokenTensor;

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// A [B, T, H, K]-shaped contiguous problem with fused gating and no data behind it (the checks
// read sizes and strides only; a non-null pointer marks a tensor as given).
DecodeProblem contiguous_problem(int64_t B, int64_t T, int64_t H, int64_t HV, int64_t K,
                                 int64_t V) {
  static char storage = 0;
  DecodeProblem p;
  p.num_requests = B, p.tokens_per_request = T, p.token_capacity = T;
  p.num_qk_heads = H, p.num_v_heads = HV, p.head_k = K, p.head_v = V;
  p.total_tokens = B * T;
  p.pool_size = B;
  auto tensor = [&](int64_t heads, int64_t row) {
    TokenTensor x;
    x.data = &storage;
    x.stride_head = row;
    x.stride_token = heads * row;
    x.stride_request = T * heads * row;
    return x;
  };
  p.q = tensor(H, K), p.k = tensor(H, K), p.v = tensor(HV, V), p.out = tensor(HV, V);
  p.a = tensor(HV, 1), p.b = tensor(HV, 1);
  return p;
}

TEST(GdnShortKernelFit, ReachOfAContiguousTensorIsItsLastElement) {
  const DecodeProblem p = contiguous_problem(3, 2, 4, 8, 16, 32);
  EXPECT_EQ(gdn::detail::token_tensor_reach(p.q, 3, 2, 4, 16), 3 * 2 * 4 * 16 - 1);
  EXPECT_EQ(gdn::detail::token_tensor_reach(p.out, 3, 2, 8, 32), 3 * 2 * 8 * 32 - 1);
  EXPECT_EQ(gdn::detail::token_tensor_reach(p.a, 3, 2, 8, 1), 3 * 2 * 8 - 1);
}

TEST(GdnShortKernelFit, NegativeStridesCountByMagnitude) {
  TokenTensor x;
  x.stride_request = -1000, x.stride_token = 10, x.stride_head = -1;
  EXPECT_EQ(gdn::detail::token_tensor_reach(x, 4, 3, 5, 1), 3 * 1000 + 2 * 10 + 4);
}

TEST(GdnShortKernelFit, TokenOffsetsFitUpToInt32Max) {
  // v and out of B x 1 x HV x V elements: the last offset is B * HV * V - 1.
  const int64_t HV = 64, V = 128, K = 128, H = 16;
  const int64_t fits = (kInt32Max + 1) / (HV * V);  // last offset exactly kInt32Max
  EXPECT_TRUE(gdn::detail::token_offsets_fit_32_bits(contiguous_problem(fits, 1, H, HV, K, V)));
  EXPECT_FALSE(
      gdn::detail::token_offsets_fit_32_bits(contiguous_problem(fits + 1, 1, H, HV, K, V)));
}

TEST(GdnShortKernelFit, EachTensorAndIndexCanForceWideOffsets) {
  const DecodeProblem base = contiguous_problem(4, 2, 2, 4, 64, 32);
  ASSERT_TRUE(gdn::detail::token_offsets_fit_32_bits(base));
  for (int which = 0; which < 8; ++which) {
    DecodeProblem p = base;
    TokenTensor* tensors[] = {&p.q, &p.k, &p.v, &p.out, &p.a, &p.b, &p.g, &p.beta};
    TokenTensor& x = *tensors[which];
    static char storage = 0;
    x.data = &storage;             // g and beta are not given in the base problem
    x.stride_request = kInt32Max;  // a view into a huge buffer: request 1 is past 2^31
    EXPECT_FALSE(gdn::detail::token_offsets_fit_32_bits(p)) << "tensor " << which;
    x.data = nullptr;  // a tensor that is not given does not count
    EXPECT_TRUE(gdn::detail::token_offsets_fit_32_bits(p)) << "tensor " << which;
  }
  DecodeProblem p = base;
  p.pool_size = kInt32Max + int64_t{1};  // slot numbers are kept in 32 bits
  EXPECT_FALSE(gdn::detail::token_offsets_fit_32_bits(p));
  p = base;
  p.num_requests = kInt32Max / p.num_v_heads + 1;  // request x head indices
  p.q.stride_request = p.k.stride_request = p.v.stride_request = p.out.stride_request = 0;
  p.a.stride_request = p.b.stride_request = 0;
  EXPECT_FALSE(gdn::detail::token_offsets_fit_32_bits(p));
}

TEST(GdnShortKernelFit, VariableLengthUsesTheTokenDimension) {
  DecodeProblem p = contiguous_problem(1, 5, 2, 4, 64, 32);
  p.variable_length = true;
  p.num_requests = 5;
  p.total_tokens = 5;
  p.tokens_per_request = p.token_capacity = 1;  // max_tokens_per_request = 1
  EXPECT_TRUE(gdn::detail::token_offsets_fit_32_bits(p));
  EXPECT_EQ(gdn::detail::most_tokens_per_request(p), 1);
  // Stride of the token dim so large that token 4 lies past 2^31; request strides are ignored.
  p.v.stride_token = kInt32Max / 4 + 1;
  EXPECT_FALSE(gdn::detail::token_offsets_fit_32_bits(p));
}

// Through validation: the checks see the strides and sizes a real call produces.
TEST(GdnShortKernelFit, ValidatedCallsOfTheTestGrid) {
  GdnCaseConfig config;
  config.B = 3, config.T = 4, config.H = 2, config.HV = 4, config.K = 64, config.V = 32;
  config.indices = IndexKind::kPerToken;
  config.num_accepted_tokens = true;
  config.packed_inputs = true;
  const HostCall call(config);
  const DecodeProblem& p = call.problem();
  EXPECT_TRUE(gdn::detail::token_offsets_fit_32_bits(p));
  EXPECT_EQ(gdn::detail::most_tokens_per_request(p), 4);
  EXPECT_TRUE(gdn::detail::writes_token_slots(p));

  config.varlen_lengths = {2, 40, 1};  // a request longer than the short kernel takes
  config.indices = IndexKind::kPerRequest;
  config.num_accepted_tokens = false;
  const HostCall varlen(config);
  const DecodeProblem& q = varlen.problem();
  EXPECT_GT(gdn::detail::most_tokens_per_request(q), gdn::detail::kShortMaxTokens);
  EXPECT_FALSE(gdn::detail::writes_token_slots(q));
}

#ifdef HDK_WITH_CUDA
using gdn::detail::DecodeKernel;
using gdn::detail::LaunchPlan;

// The Qwen3.5-397B shape (H = 16, HV = 64, K = V = 128) with B requests of T tokens and the
// given state dtype; verify: an intermediate-state cache and no pool update.
DecodeProblem qwen_problem(int64_t B, int64_t T, DType state, bool verify) {
  static char cache = 0;
  DecodeProblem p = contiguous_problem(B, T, 16, 64, 128, 128);
  p.state_dtype = state;
  p.head_pitch = 128 * 128;
  p.slot_pitch = 64 * p.head_pitch;
  p.update_state = !verify;
  p.intermediate_states = verify ? &cache : nullptr;
  return p;
}

TEST(GdnLaunchPlan, OneTokenCallsRunTheShortKernel) {
  // 4-warp CTAs up to 1024 heads, 1-warp CTAs above (the measurements in plan_launch), with
  // either state dtype; fp32 at every batch on the common form's 32 lanes x 8 rows.
  for (const auto& [B, state, warps] :
       {std::tuple{16, DType::kBFloat16, 4}, std::tuple{17, DType::kBFloat16, 1},
        std::tuple{512, DType::kBFloat16, 1}, std::tuple{1, DType::kFloat32, 4},
        std::tuple{16, DType::kFloat32, 4}, std::tuple{17, DType::kFloat32, 1},
        std::tuple{512, DType::kFloat32, 1}}) {
    const LaunchPlan chosen = plan_with(qwen_problem(B, 1, state, false));
    SCOPED_TRACE(::testing::Message() << "B = " << B << ", " << dtype_name(state));
    EXPECT_EQ(chosen.kernel, DecodeKernel::kVKShort);
    EXPECT_EQ(chosen.warps_per_cta, warps);
    // CTAs of the (row-tile CTA, head, request) grid: 16 tiles of 8 rows per head.
    EXPECT_EQ(chosen.tiles_per_head, 16);
    EXPECT_EQ(chosen.ctas, B * 64 * (16 / warps));
  }
}

TEST(GdnLaunchPlan, Fp32MultiTokenCallsRunTheKernelThatMeasuredFaster) {
  struct Expectation {
    int64_t B, T;
    bool verify;
    DecodeKernel kernel;
  };
  for (const Expectation& e : {Expectation{256, 2, true, DecodeKernel::kVKShort},
                               Expectation{2, 8, true, DecodeKernel::kVKShort},     // 128 heads
                               Expectation{16, 8, true, DecodeKernel::kVKShort},    // 1024 heads
                               Expectation{17, 8, true, DecodeKernel::kVKGeneral},  // 1088 heads
                               Expectation{256, 4, true, DecodeKernel::kVKGeneral},
                               Expectation{256, 8, false, DecodeKernel::kVKShort}}) {  // no cache
    SCOPED_TRACE(::testing::Message()
                 << "B = " << e.B << ", T = " << e.T << ", verify " << e.verify);
    EXPECT_EQ(plan_with(qwen_problem(e.B, e.T, DType::kFloat32, e.verify)).kernel, e.kernel);
  }
  // bf16 state: the short kernel for every multi-token call it can hold.
  EXPECT_EQ(plan_with(qwen_problem(256, 8, DType::kBFloat16, true)).kernel, DecodeKernel::kVKShort);
}

TEST(GdnLaunchPlan, CallsTheShortKernelCannotHoldRunTheGeneralOne) {
  // More tokens per request than a lane of the short kernel holds.
  EXPECT_EQ(
      plan_with(qwen_problem(4, gdn::detail::kShortMaxTokens + 1, DType::kBFloat16, true)).kernel,
      DecodeKernel::kVKGeneral);
  // More requests than the short kernel's grid takes in its z dimension, also when forced.
  EXPECT_EQ(plan_with(qwen_problem(65535, 1, DType::kBFloat16, false)).kernel,
            DecodeKernel::kVKShort);
  EXPECT_EQ(plan_with(qwen_problem(65536, 1, DType::kBFloat16, false)).kernel,
            DecodeKernel::kVKGeneral);
  gdn::detail::LaunchOverride forced_short;
  forced_short.vk_kernel = gdn::detail::VKKernel::kShort;
  EXPECT_EQ(plan_with(qwen_problem(65536, 1, DType::kFloat32, false), forced_short).kernel,
            DecodeKernel::kVKGeneral);
  // Forced warps per CTA reach the short kernel's plan; the last CTA of a head is partial.
  forced_short.warps = 3;
  const LaunchPlan three = plan_with(qwen_problem(2, 1, DType::kBFloat16, false), forced_short);
  EXPECT_EQ(three.kernel, DecodeKernel::kVKShort);
  EXPECT_EQ(three.warps_per_cta, 3);
  EXPECT_EQ(three.ctas, 2 * 64 * 6);
}
TEST(GdnLaunchPlan, OneTokenCallsAbove192Bf16HeadsRunTheBuildWithoutATokenLoop) {
  const DType bf16 = DType::kBFloat16;
  EXPECT_FALSE(plan_with(qwen_problem(3, 1, bf16, false)).one_token_build);  // 192 heads
  EXPECT_TRUE(plan_with(qwen_problem(4, 1, bf16, false)).one_token_build);
  EXPECT_TRUE(plan_with(qwen_problem(512, 1, bf16, false)).one_token_build);
  EXPECT_TRUE(plan_with(qwen_problem(4, 1, bf16, true)).one_token_build);  // T = 1 verify
  EXPECT_FALSE(plan_with(qwen_problem(4, 2, bf16, false)).one_token_build);
  // On the full problem (these calls' fp32 inputs are not the common form) fp32 state has no
  // one-token build, forced or not.
  gdn::detail::LaunchOverride one_token;
  one_token.short_build = gdn::detail::ShortBuild::kOneToken;
  EXPECT_FALSE(plan_with(qwen_problem(4, 1, DType::kFloat32, false)).one_token_build);
  EXPECT_FALSE(plan_with(qwen_problem(4, 1, DType::kFloat32, false), one_token).one_token_build);
  // With cu_seqlens, only a capacity of one token per request proves it.
  DecodeProblem ragged = qwen_problem(4, 1, bf16, false);
  ragged.variable_length = true;
  ragged.token_capacity = 1;
  ragged.tokens_per_request = 1;
  EXPECT_TRUE(plan_with(ragged).one_token_build);
  ragged.token_capacity = 2;
  ragged.tokens_per_request = 2;
  EXPECT_FALSE(plan_with(ragged).one_token_build);
  // Forced either way.
  EXPECT_TRUE(plan_with(qwen_problem(1, 1, bf16, false), one_token).one_token_build);
  gdn::detail::LaunchOverride token_loop;
  token_loop.short_build = gdn::detail::ShortBuild::kTokenLoop;
  EXPECT_FALSE(plan_with(qwen_problem(4, 1, bf16, false), token_loop).one_token_build);
}
#endif  // HDK_WITH_CUDA

}  // namespace
}  // namespace testing
}  // namespace hdk
