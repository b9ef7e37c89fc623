// The common form of a decode call (src/gdn/common_decode_problem.h): which validated calls have
// it, that its compact block carries the call, and that each request's plan (slots, padding,
// invalid rows) is DecodeProblem's to the letter; with the CUDA backend built, when the
// dispatcher hands the short kernel the compact block. Plain C++, so these run on the CPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "gdn/common_decode_problem.h"
#include "gdn/decode_problem.h"
#include "hdk/dtype.h"
#include "support/gdn_case.h"
#include "support/gdn_host_call.h"

#ifdef HDK_WITH_CUDA
#include "gdn/cuda/decode_cuda.h"
#endif

namespace hdk {
namespace testing {
namespace {

using gdn::detail::CommonDecodeProblem;
using gdn::detail::DecodeProblem;
using gdn::detail::RequestPlan;

// The engines' call: Qwen-sized heads, bf16 q/k/v/a/b/out, int32 per-request indices.
GdnCaseConfig engine_call() {
  GdnCaseConfig config;
  config.B = 6, config.T = 1, config.H = 2, config.HV = 4, config.K = 128, config.V = 32;
  return config;
}

TEST(GdnCommonForm, TheEnginesCallFits) {
  GdnCaseConfig config = engine_call();
  EXPECT_TRUE(gdn::detail::common_form_fits(HostCall(config).problem(), 16));
  config.indices = IndexKind::kNone;  // request n uses slot n
  EXPECT_TRUE(gdn::detail::common_form_fits(HostCall(config).problem(), 16));
  config = engine_call();
  config.T = 3, config.intermediate = true, config.update_state = false;  // verify pass
  EXPECT_TRUE(gdn::detail::common_form_fits(HostCall(config).problem(), 16));
  config = engine_call();
  config.split_pool = true;  // int32 output_state_indices
  EXPECT_TRUE(gdn::detail::common_form_fits(HostCall(config).problem(), 16));
  config = engine_call();  // SGLang's decode step: [1, B] tokens, cu_seqlens, one token each
  config.varlen_lengths = {1, 1, 1, 1, 1, 1};
  config.max_tokens_per_request = 1;
  EXPECT_TRUE(gdn::detail::common_form_fits(HostCall(config).problem(), 16));
}

TEST(GdnCommonForm, EachModeOutsideTheFormIsRefused) {
  struct Variation {
    const char* what;
    void (*apply)(GdnCaseConfig&);
  };
  const Variation variations[] = {
      {"variable length, more than one token a request",
       [](GdnCaseConfig& c) {
         c.varlen_lengths = {1, 2, 0, 1};
       }},
      {"int64 cu_seqlens",
       [](GdnCaseConfig& c) {
         c.varlen_lengths = {1, 1, 1, 1};
         c.max_tokens_per_request = 1;
         c.indices = IndexKind::kNone;  // so that only cu_seqlens is int64
         c.index_dtype = DType::kInt64;
       }},
      {"gating without fusion", [](GdnCaseConfig& c) { c.fused_gating = false; }},
      {"per-token indices", [](GdnCaseConfig& c) { c.indices = IndexKind::kPerToken; }},
      {"int64 indices", [](GdnCaseConfig& c) { c.index_dtype = DType::kInt64; }},
      {"fp32 gates", [](GdnCaseConfig& c) { c.gate_dtype = DType::kFloat32; }},
      {"fp32 output", [](GdnCaseConfig& c) { c.out_dtype = DType::kFloat32; }},
      {"fp16 q/k/v", [](GdnCaseConfig& c) { c.input_dtype = DType::kFloat16; }},
  };
  for (const Variation& variation : variations) {
    GdnCaseConfig config = engine_call();
    variation.apply(config);
    SCOPED_TRACE(variation.what);
    EXPECT_FALSE(gdn::detail::common_form_fits(HostCall(config).problem(), 16));
  }
}

TEST(GdnCommonForm, QAndKMustBeWholeVectorsApart) {
  const HostCall call(engine_call());
  DecodeProblem p = call.problem();
  ASSERT_TRUE(gdn::detail::common_form_fits(p, 16));
  // A q row 8 bytes off a 16-byte boundary: 8-byte pieces still load whole, 16-byte ones not.
  p.q.stride_head = 132;  // 264 bytes between heads
  EXPECT_FALSE(gdn::detail::common_form_fits(p, 16));
  EXPECT_TRUE(gdn::detail::common_form_fits(p, 8));
  // A stride over a dim of one element is never used.
  p = call.problem();
  p.num_qk_heads = 1, p.num_v_heads = 2;
  p.k.stride_head = 3;
  EXPECT_TRUE(gdn::detail::common_form_fits(p, 16));
  // A base pointer off the boundary.
  p = call.problem();
  p.k.data = static_cast<char*>(p.k.data) + 8;
  EXPECT_FALSE(gdn::detail::common_form_fits(p, 16));
  EXPECT_TRUE(gdn::detail::common_form_fits(p, 8));
  // Token offsets beyond 32 bits.
  p = call.problem();
  p.out.stride_request = std::numeric_limits<int32_t>::max();
  EXPECT_FALSE(gdn::detail::common_form_fits(p, 16));
}

TEST(GdnCommonForm, TheCompactBlockCarriesTheCall) {
  GdnCaseConfig config = engine_call();
  config.T = 2, config.intermediate = true, config.split_pool = true;
  config.packed_inputs = true;
  const HostCall call(config);
  const DecodeProblem& p = call.problem();
  const CommonDecodeProblem c = gdn::detail::to_common_form(p);
  EXPECT_EQ(c.tokens_per_request, p.tokens_per_request);
  const uint32_t ratio = static_cast<uint32_t>(p.num_v_heads / p.num_qk_heads);
  for (uint32_t hv = 0; hv < 4096; ++hv) {
    ASSERT_EQ(hdk::detail::fast_quotient(hv, c.qk_head_multiplier, c.qk_head_shift), hv / ratio)
        << "value head " << hv;
  }
  EXPECT_EQ(c.head_v, p.head_v);
  EXPECT_EQ(c.head_pitch, p.head_pitch);
  EXPECT_EQ(c.slot_pitch, p.slot_pitch);
  EXPECT_EQ(c.pool_size, p.pool_size);
  EXPECT_EQ(c.scale, p.scale);
  EXPECT_EQ(c.update_state, p.update_state);
  EXPECT_EQ(c.use_qk_l2norm, p.use_qk_l2norm);
  const struct {
    const gdn::detail::CompactTokenTensor& compact;
    const gdn::detail::TokenTensor& full;
  } tensors[] = {{c.q, p.q}, {c.k, p.k}, {c.v, p.v}, {c.a, p.a}, {c.b, p.b}, {c.out, p.out}};
  for (const auto& tensor : tensors) {
    EXPECT_EQ(tensor.compact.data, tensor.full.data);
    EXPECT_EQ(tensor.compact.stride_request, tensor.full.stride_request);
    EXPECT_EQ(tensor.compact.stride_token, tensor.full.stride_token);
    EXPECT_EQ(tensor.compact.stride_head, tensor.full.stride_head);
  }
  EXPECT_EQ(c.state, p.state);
  EXPECT_EQ(c.intermediate_states, p.intermediate_states);
  EXPECT_EQ(c.intermediate_stride_request, p.intermediate_stride_request);
  EXPECT_EQ(c.intermediate_stride_token, p.intermediate_stride_token);
  EXPECT_EQ(static_cast<const void*>(c.output_state_indices), p.output_state_indices.data);

  // A decode step with cu_seqlens: the same block, then the token ranges.
  config = engine_call();
  config.varlen_lengths = {1, 1, 0, 1};
  config.max_tokens_per_request = 1;
  const HostCall decode_step(config);
  const DecodeProblem& full = decode_step.problem();
  const gdn::detail::CommonDecodeStepProblem s = gdn::detail::to_common_decode_step(full);
  EXPECT_TRUE(s.variable_length);
  EXPECT_EQ(s.q.data, full.q.data);
  EXPECT_EQ(s.q.stride_token, full.q.stride_token);
  EXPECT_EQ(static_cast<const void*>(s.cu_seqlens), full.cu_seqlens.data);
  EXPECT_EQ(s.cu_seqlens_stride, full.cu_seqlens.row_stride);
  EXPECT_EQ(s.total_tokens, full.total_tokens);
  EXPECT_EQ(s.tokens_per_request, 1);
}

TEST(GdnCommonForm, EveryRequestPlansAsInTheFullProblem) {
  std::vector<GdnCaseConfig> configs;
  GdnCaseConfig config = engine_call();
  config.B = 24, config.padding_fraction = 0.25, config.invalid_rows = 3;
  configs.push_back(config);
  config.split_pool = true, config.no_write_fraction = 0.25;  // output indices, some -1
  configs.push_back(config);
  config.update_state = false, config.intermediate = true, config.T = 2;  // verify: no writes
  configs.push_back(config);
  config = engine_call();
  config.B = 24, config.indices = IndexKind::kNone, config.split_pool = true,
  config.invalid_rows = 2;
  configs.push_back(config);
  config = engine_call();  // decode steps with cu_seqlens: empty, padding and invalid rows
  config.B = 8, config.varlen_lengths = {1, 1, 0, 1, 1, 1, 1, 1};
  config.max_tokens_per_request = 1, config.padding_fraction = 0.25, config.invalid_rows = 2;
  configs.push_back(config);
  config.varlen_lengths = {1, 2, 1, 1, 0, 1, 1, 1};  // a request longer than the bound
  config.padding_fraction = 0, config.invalid_rows = 0;
  configs.push_back(config);
  for (size_t i = 0; i < configs.size(); ++i) {
    SCOPED_TRACE(configs[i].describe());
    const HostCall call(configs[i]);
    const DecodeProblem& p = call.problem();
    ASSERT_TRUE(gdn::detail::common_form_fits(p, 16));
    // A decode step with cu_seqlens has a block type of its own.
    const CommonDecodeProblem c = gdn::detail::to_common_form(p);
    const gdn::detail::CommonDecodeStepProblem step = gdn::detail::to_common_decode_step(p);
    int invalid = 0, padding = 0;
    for (int64_t n = 0; n < p.num_requests; ++n) {
      const RequestPlan full = gdn::detail::plan_request(p, n);
      const RequestPlan common =
          p.variable_length ? gdn::detail::plan_request(step, n) : gdn::detail::plan_request(c, n);
      SCOPED_TRACE(n);
      EXPECT_EQ(common.token_origin, full.token_origin);
      EXPECT_EQ(common.num_tokens, full.num_tokens);
      EXPECT_EQ(common.read_slot, full.read_slot);
      EXPECT_EQ(common.final_slot, full.final_slot);
      EXPECT_EQ(common.invalid, full.invalid);
      invalid += full.invalid ? 1 : 0;
      padding += full.read_slot < 0 && !full.invalid ? 1 : 0;
    }
    // The rows hold what the comparison is meant to cover.
    EXPECT_EQ(invalid, call.expected_invalid());
    EXPECT_GT(invalid, 0);
    if (configs[i].padding_fraction > 0) {
      EXPECT_GT(padding, 0);
    }
  }
  // A call without tokens runs no request.
  DecodeProblem empty = HostCall(engine_call()).problem();
  empty.tokens_per_request = 0;
  const RequestPlan none = gdn::detail::plan_request(gdn::detail::to_common_form(empty), 0);
  EXPECT_EQ(none.read_slot, -1);
  EXPECT_EQ(none.final_slot, -1);
  EXPECT_FALSE(none.invalid);
}

#ifdef HDK_WITH_CUDA
TEST(GdnLaunchPlan, CallsOfTheCommonFormTakeTheCompactBlock) {
  auto plan = [](const GdnCaseConfig& config, const gdn::detail::LaunchOverride& forced = {}) {
    return plan_with(HostCall(config).problem(), forced);
  };

  for (DType state : {DType::kBFloat16, DType::kFloat32}) {
    for (int64_t T : {1, 2, 4}) {
      GdnCaseConfig config = engine_call();
      config.state_dtype = state, config.T = T, config.intermediate = T > 1;
      config.update_state = T == 1;
      SCOPED_TRACE(::testing::Message() << dtype_name(state) << ", T = " << T);
      const gdn::detail::LaunchPlan chosen = plan(config);
      EXPECT_EQ(chosen.kernel, gdn::detail::DecodeKernel::kVKShort);
      EXPECT_TRUE(chosen.common_form);
      // Not where the tests or a sweep ask for the full problem, another shape or 64-bit
      // offsets, nor for a head size without an instance of the form.
      gdn::detail::LaunchOverride forced;
      forced.full_problem = true;
      EXPECT_FALSE(plan(config, forced).common_form);
      forced = {};
      forced.rows_per_thread = 2;
      EXPECT_FALSE(plan(config, forced).common_form);
      forced = {};
      forced.wide_offsets = true;
      EXPECT_FALSE(plan(config, forced).common_form);
      config.K = 64;
      EXPECT_FALSE(plan(config).common_form);
      // Nor for heads that end inside a warp's tile of rows (its instances check no row).
      config.K = 128, config.V = 20;
      EXPECT_FALSE(plan(config).common_form);
      config.V = 24;
      EXPECT_TRUE(plan(config).common_form);
    }
    // SGLang's decode step ([1, B] tokens with cu_seqlens, one token each).
    GdnCaseConfig step = engine_call();
    step.state_dtype = state;
    step.varlen_lengths = {1, 1, 1, 1};
    step.max_tokens_per_request = 1;
    const gdn::detail::LaunchPlan chosen = plan(step);
    EXPECT_TRUE(chosen.common_form);
    EXPECT_TRUE(chosen.one_token_build);
  }
}

TEST(GdnLaunchPlan, OneTokenCallsOfTheCommonFormRunTheBuildWithoutATokenLoop) {
  auto plan = [](int64_t B, DType state, gdn::detail::ShortBuild build) {
    GdnCaseConfig config = engine_call();
    config.B = B, config.state_dtype = state;  // 4 value heads a request
    gdn::detail::LaunchOverride forced;
    forced.short_build = build;
    const gdn::detail::LaunchPlan chosen = plan_with(HostCall(config).problem(), forced);
    EXPECT_TRUE(chosen.common_form);
    return chosen.one_token_build;
  };

  const auto automatic = gdn::detail::ShortBuild::kAuto;
  // bf16 state at every size (the full problem's threshold is 192 heads).
  EXPECT_TRUE(plan(1, DType::kBFloat16, automatic));
  EXPECT_TRUE(plan(48, DType::kBFloat16, automatic));
  // fp32 state at every size as well; the token loop when forced.
  EXPECT_TRUE(plan(1, DType::kFloat32, automatic));
  EXPECT_TRUE(plan(1023, DType::kFloat32, automatic));
  EXPECT_TRUE(plan(1025, DType::kFloat32, automatic));
  EXPECT_FALSE(plan(1, DType::kFloat32, gdn::detail::ShortBuild::kTokenLoop));
}

TEST(GdnLaunchPlan, Fp32OneTokenCallsRunTheCommonFormsOneTokenBuildAtEverySize) {
  auto plan = [](int64_t B, DType state) {
    GdnCaseConfig config = engine_call();
    config.B = B, config.state_dtype = state;  // 4 value heads a request
    return plan_with(HostCall(config).problem());
  };
  // 32 lanes x 8 rows on the common form's one-token build, as 4-warp CTAs up to 1024 heads and
  // 1-warp CTAs above (the 16 x 4 token loop the H100 had chosen from 4096 heads measured 5-7%
  // slower on an H200).
  for (int64_t B : {1, 256, 257, 1023, 1024, 1025}) {
    const gdn::detail::LaunchPlan chosen = plan(B, DType::kFloat32);
    SCOPED_TRACE(::testing::Message() << "B = " << B);
    EXPECT_EQ(chosen.kernel, gdn::detail::DecodeKernel::kVKShort);
    EXPECT_TRUE(chosen.common_form);
    EXPECT_TRUE(chosen.one_token_build);
    EXPECT_EQ(chosen.lanes_per_row, 32);
    EXPECT_EQ(chosen.rows_per_thread, 8);
    EXPECT_EQ(chosen.warps_per_cta, B * 4 > 1024 ? 1 : 4);
  }
  // bf16 state's common form at 1024 requests too, and a verify call's 32 lanes.
  EXPECT_TRUE(plan(1024, DType::kBFloat16).common_form);
  GdnCaseConfig verify = engine_call();
  verify.B = 1024, verify.state_dtype = DType::kFloat32, verify.T = 2, verify.intermediate = true;
  verify.update_state = false;
  EXPECT_EQ(plan_with(HostCall(verify).problem()).lanes_per_row, 32);
  gdn::detail::LaunchOverride forced;
  forced.lanes_per_row = 32;
  forced.rows_per_thread = 8;
  GdnCaseConfig wide = engine_call();
  wide.B = 1024, wide.state_dtype = DType::kFloat32;
  EXPECT_TRUE(plan_with(HostCall(wide).problem(), forced).common_form);
}

TEST(GdnLaunchPlan, Fp32OneTokenCallsLoadTheStateFirstOutsideOneWave) {
  auto plan = [](int64_t B, DType state,
                 gdn::detail::ShortLoadOrder order = gdn::detail::ShortLoadOrder::kAuto,
                 IndexKind indices = IndexKind::kPerRequest) {
    GdnCaseConfig config = engine_call();
    config.B = B, config.state_dtype = state;  // 4 value heads of 4 warps a request
    config.indices = indices;
    gdn::detail::LaunchOverride forced;
    forced.load_order = order;
    return plan_with(HostCall(config).problem(), forced);  // 132 SMs: 4224 warp slots
  };
  const auto automatic = gdn::detail::ShortLoadOrder::kAuto;
  // The state first up to half of the slots (132 requests: 2112 warps) and beyond all of them
  // (265: 4240), with or without a pool index; the inputs first in between (133 to 264).
  for (IndexKind indices : {IndexKind::kPerRequest, IndexKind::kNone}) {
    const bool dense = indices == IndexKind::kNone;
    SCOPED_TRACE(dense ? "dense states" : "pool index");
    for (int64_t B : {1, 132, 133, 264, 265, 1023}) {
      const gdn::detail::LaunchPlan chosen = plan(B, DType::kFloat32, automatic, indices);
      SCOPED_TRACE(::testing::Message() << "B = " << B);
      EXPECT_TRUE(chosen.common_form);
      EXPECT_TRUE(chosen.one_token_build);
      EXPECT_EQ(chosen.state_first, B >= 265 || B <= 132);
    }
  }
  EXPECT_TRUE(plan(1025, DType::kFloat32).state_first);  // beyond the slots at any size
  // Forced either way where the order is built; never for bf16 state.
  EXPECT_TRUE(plan(1, DType::kFloat32, gdn::detail::ShortLoadOrder::kStateFirst).state_first);
  EXPECT_FALSE(plan(265, DType::kFloat32, gdn::detail::ShortLoadOrder::kInputsFirst).state_first);
  EXPECT_FALSE(plan(265, DType::kBFloat16).state_first);
  EXPECT_FALSE(plan(265, DType::kBFloat16, gdn::detail::ShortLoadOrder::kStateFirst).state_first);
  // Nor off the common form's one-token build: the token loop or the full block when forced,
  // or a verify call.
  gdn::detail::LaunchOverride forced;
  forced.short_build = gdn::detail::ShortBuild::kTokenLoop;
  GdnCaseConfig config = engine_call();
  config.B = 265, config.state_dtype = DType::kFloat32;
  EXPECT_FALSE(plan_with(HostCall(config).problem(), forced).state_first);
  forced = {};
  forced.full_problem = true;
  EXPECT_FALSE(plan_with(HostCall(config).problem(), forced).state_first);
  config.T = 2, config.intermediate = true, config.update_state = false;
  EXPECT_FALSE(plan_with(HostCall(config).problem()).state_first);
}
#endif  // HDK_WITH_CUDA

}  // namespace
}  // namespace testing
}  // namespace hdk
