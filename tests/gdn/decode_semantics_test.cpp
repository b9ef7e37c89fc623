// Every GDN decode semantic against the float64 reference, on every backend this build and
// machine have. A backend that cannot run here is skipped with the reason.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "core/float_convert.h"
#include "hdk/error.h"
#include "hdk/gdn/decode.h"
#include "hdk/tensor_view.h"
#include "support/gdn_case.h"
#include "support/gdn_host_call.h"

#ifdef HDK_WITH_CUDA
#include "gdn/cuda/built_kernels.h"
#include "gdn/cuda/decode_cuda.h"
#endif

namespace hdk {
namespace testing {
namespace {

using gdn::StateLayout;

struct Shape {
  const char* name;
  int64_t H, HV, K, V;
};

// The spec's real shapes, the other supported head sizes, and odd sizes the CPU must handle.
const Shape kShapes[] = {
    {"qwen3-next", 16, 32, 128, 128},
    {"qwen3.5-397b", 16, 64, 128, 128},
    {"397b-tp2", 8, 32, 128, 128},
    {"397b-tp4", 4, 16, 128, 128},
    {"397b-tp8", 2, 8, 128, 128},
    {"qwen3.5-27b", 16, 48, 128, 128},
    {"k64", 2, 4, 64, 64},
    {"k256", 1, 2, 256, 256},
    {"k64-v256", 2, 2, 64, 256},
    {"k256-v64", 2, 2, 256, 64},
    {"k128-v64", 2, 6, 128, 64},
    {"odd", 1, 3, 12, 20},
};

std::vector<GdnCaseConfig> semantic_cases() {
  std::vector<GdnCaseConfig> cases;
  uint64_t seed = 100;
  auto add = [&](GdnCaseConfig c) {
    c.seed = ++seed;
    cases.push_back(c);
  };

  // Real and supported shapes, both state dtypes, with padding rows and shuffled slots.
  for (const Shape& shape : kShapes) {
    for (DType state : {DType::kFloat32, DType::kBFloat16}) {
      GdnCaseConfig c;
      c.B = 4;
      c.H = shape.H, c.HV = shape.HV, c.K = shape.K, c.V = shape.V;
      c.state_dtype = state;
      c.padding_fraction = 0.25;
      add(c);
    }
  }

  // Pools of more than 32 MiB, in place and split: the CPU backend then streams its one-token
  // updates past the caches.
  for (DType state : {DType::kFloat32, DType::kBFloat16}) {
    for (bool split : {false, true}) {
      GdnCaseConfig c;
      c.B = state == DType::kFloat32 ? 10 : 20;
      c.H = 16, c.HV = 64, c.K = 128, c.V = 128;
      c.state_dtype = state;
      c.split_pool = split;
      c.padding_fraction = 0.1;
      add(c);
    }
  }

  // Layout x state dtype x T, with the token cache on for T > 1, alternating gating sets.
  int variant = 0;
  for (StateLayout layout : {StateLayout::kVK, StateLayout::kKV}) {
    for (DType state : {DType::kFloat32, DType::kBFloat16}) {
      for (int64_t T : {1, 2, 3, 8}) {
        GdnCaseConfig c;
        c.B = 5, c.T = T, c.H = 2, c.HV = 4, c.K = 64, c.V = 32;
        c.layout = layout;
        c.state_dtype = state;
        c.fused_gating = (variant++ % 2) == 0;
        c.intermediate = T > 1;
        c.padding_fraction = 0.2;
        add(c);
      }
    }
  }

  // The short kernel holds one token per lane: 32 tokens (every lane, 2-D indices and the
  // cache) and 40 (more than it takes: the general kernel runs even when the short one is forced).
  for (DType state : {DType::kFloat32, DType::kBFloat16}) {
    GdnCaseConfig c;
    c.B = 3, c.T = 32, c.H = 2, c.HV = 4, c.K = 128, c.V = 32;
    c.state_dtype = state;
    c.indices = IndexKind::kPerToken;
    c.num_accepted_tokens = true;
    c.intermediate = true;
    add(c);
    c.T = 40;
    c.indices = IndexKind::kPerRequest;
    c.num_accepted_tokens = false;
    c.padding_fraction = 0.3;
    add(c);
  }

  // Input and output dtypes; fp32 end to end is held to 1e-5.
  for (DType input : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (StateLayout layout : {StateLayout::kVK, StateLayout::kKV}) {
      GdnCaseConfig c;
      c.B = 3, c.T = 2, c.H = 2, c.HV = 4, c.K = 64, c.V = 32;
      c.layout = layout;
      c.input_dtype = input;
      c.gate_dtype = input;
      c.out_dtype = input;
      c.dt_bias_dtype = input == DType::kBFloat16 ? DType::kBFloat16 : DType::kFloat32;
      add(c);
    }
  }
  {
    GdnCaseConfig c;  // mixed: fp16 inputs, bf16 gates, fp32 output
    c.B = 3, c.T = 3, c.K = 64, c.V = 48;
    c.input_dtype = DType::kFloat16;
    c.gate_dtype = DType::kBFloat16;
    c.out_dtype = DType::kFloat32;
    add(c);
  }

  // Pool semantics. At K = 128 with layout kVK, the calls of the common form
  // (common_decode_problem.h: fixed length, fused gating, bf16 q/k/v, per-request int32 indices
  // or none) run on the short kernel's compact parameter block; the forced runs below repeat them
  // on the full block.
  for (StateLayout layout : {StateLayout::kVK, StateLayout::kKV}) {
    for (int64_t K : {64, 128}) {
      if (layout == StateLayout::kKV && K == 128) continue;
      for (DType state : {DType::kFloat32, DType::kBFloat16}) {
        GdnCaseConfig base;
        base.B = 8, base.T = 1, base.H = 2, base.HV = 4, base.K = K, base.V = 32;
        base.layout = layout;
        base.state_dtype = state;

        GdnCaseConfig c = base;  // no indices: request n uses slot n
        c.indices = IndexKind::kNone;
        add(c);
        c = base;  // int64 indices, slots in random order, padding and invalid rows
        c.index_dtype = DType::kInt64;
        c.padding_fraction = 0.25;
        c.invalid_rows = 2;
        add(c);
        c = base;  // split pool with some rows not writing, T = 2
        c.T = 2;
        c.split_pool = true;
        c.no_write_fraction = 0.25;
        c.padding_fraction = 0.125;
        add(c);
        c = base;  // split pool without state_indices; an invalid write index
        c.indices = IndexKind::kNone;
        c.split_pool = true;
        c.invalid_rows = 1;
        add(c);
        c = base;  // padded slot pitch and packed (strided) q/k/v/a/b
        c.slot_padding_rows = 3;
        c.packed_inputs = true;
        c.padding_fraction = 0.25;
        add(c);
        c = base;  // verify pass: cache on, pool untouched
        c.T = 3;
        c.intermediate = true;
        c.update_state = false;
        c.padding_fraction = 0.25;
        c.invalid_rows = 1;
        add(c);
        c = base;  // cache with capacity larger than T
        c.T = 2;
        c.intermediate = true;
        c.capacity = 4;
        add(c);
        c = base;  // vLLM speculative decoding: 2-D indices with num_accepted_tokens
        c.T = 4;
        c.indices = IndexKind::kPerToken;
        c.num_accepted_tokens = true;
        c.padding_fraction = 0.25;
        c.invalid_rows = 1;
        c.intermediate = true;
        add(c);
        c = base;  // 2-D indices without num_accepted_tokens (read column 0), int64
        c.T = 3;
        c.indices = IndexKind::kPerToken;
        c.index_dtype = DType::kInt64;
        add(c);
        c = base;  // 2-D indices, verify only
        c.T = 3;
        c.indices = IndexKind::kPerToken;
        c.num_accepted_tokens = true;
        c.update_state = false;
        add(c);
        c = base;  // variable-length batch, with a zero-length request
        c.varlen_lengths = {1, 3, 0, 2, 1, 4};
        c.intermediate = true;
        c.padding_fraction = 0.2;
        add(c);
        c = base;  // variable-length + 2-D indices + accepted tokens (vLLM's call form)
        c.varlen_lengths = {2, 2, 1, 3};
        c.indices = IndexKind::kPerToken;
        c.num_accepted_tokens = true;
        c.invalid_rows = 1;
        add(c);
        c = base;  // SGLang's decode form: [1, B] tokens with cu_seqlens = arange(B + 1)
        c.varlen_lengths = {1, 1, 1, 1, 1, 1, 1};
        c.padding_fraction = 0.3;
        c.packed_inputs = true;
        c.max_tokens_per_request = 1;
        add(c);
        c = base;  // a request longer than max_tokens_per_request is invalid and counted
        c.varlen_lengths = {1, 2, 1, 1, 0, 1};
        c.max_tokens_per_request = 1;
        c.invalid_rows = 1;
        add(c);
        c = base;  // one token with the verify cache, 2-D indices and accepted tokens
        c.indices = IndexKind::kPerToken;
        c.num_accepted_tokens = true;
        c.capacity = 3;
        c.intermediate = true;
        c.padding_fraction = 0.25;
        add(c);
        c = base;  // no qk l2norm, explicit scale
        c.use_qk_l2norm = false;
        c.scale = 0.3f;
        c.T = 2;
        add(c);
        c = base;  // no l2norm, default scale
        c.use_qk_l2norm = false;
        add(c);
      }
    }
  }
  return cases;
}

class GdnDecodeSemantics : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(GdnDecodeSemantics, MatchesReference) {
  const Backend backend = std::get<0>(GetParam());
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << backend_name(backend) << " backend skipped: " << reason;
  static const std::vector<GdnCaseConfig> cases = semantic_cases();
  const GdnCaseConfig& config = cases[std::get<1>(GetParam())];
  SCOPED_TRACE(config.describe());
  const GdnCase test_case(config);
  const bool cuda_kernel_exists =
      (config.K == 64 || config.K == 128 || config.K == 256) && config.V % 8 == 0;
  if (backend == Backend::kCUDA && !cuda_kernel_exists) {
    // Head sizes without a CUDA kernel are refused with a message, never computed wrongly.
    try {
      run_backend(test_case, backend);
      ADD_FAILURE() << "CUDA accepted K=" << config.K << " V=" << config.V;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find("the CUDA backend"), std::string::npos)
          << error.what();
    }
    return;
  }
  const BufferContents expected = run_reference(test_case);
  const BufferContents actual = run_backend(test_case, backend);
  EXPECT_TRUE(outputs_match(test_case, expected, actual));
#ifdef HDK_WITH_CUDA
  // The dispatcher sends [V, K] calls to the short or the general kernel (32- or 64-bit token
  // offsets, the compact or the full parameter block, two builds for one-token calls), and a
  // sweep may force the one-token sweep kernel: each must honour every semantic of the grid,
  // whichever the grid's sizes select.
  if (backend == Backend::kCUDA) {
    using gdn::detail::LaunchOverride;
    using gdn::detail::VKKernel;
    struct Forced {
      const char* name;
      bool one_token_sweep;  // one-token calls on the one-token sweep kernel
      VKKernel kernel;
      bool wide_offsets;
      int warps;  // per CTA, 0 = the dispatcher's
      gdn::detail::ShortBuild short_build = gdn::detail::ShortBuild::kAuto;
      bool full_problem = false;  // the short kernel's full parameter block for the common form
      gdn::detail::ShortLoadOrder load_order = gdn::detail::ShortLoadOrder::kAuto;
    };
    const Forced forced_runs[] = {
        {"one-token sweep kernel forced", true, VKKernel::kGeneral, false, 0},
        {"general kernel forced", false, VKKernel::kGeneral, false, 0},
        {"short kernel forced", false, VKKernel::kShort, false, 0},
        {"short kernel forced, 64-bit token offsets", false, VKKernel::kShort, true, 0},
        {"short kernel forced, 1-warp CTAs", false, VKKernel::kShort, false, 1},
        {"short kernel forced, 3-warp CTAs (a partial last CTA per head)", false, VKKernel::kShort,
         false, 3},
        {"short kernel forced, its token-loop build for one-token calls", false, VKKernel::kShort,
         false, 0, gdn::detail::ShortBuild::kTokenLoop},
        {"short kernel forced, its one-token build for one-token calls (bf16 state)", false,
         VKKernel::kShort, false, 0, gdn::detail::ShortBuild::kOneToken},
        {"short kernel forced, its one-token build, 64-bit token offsets", false, VKKernel::kShort,
         true, 0, gdn::detail::ShortBuild::kOneToken},
        {"short kernel forced, on the full parameter block", false, VKKernel::kShort, false, 0,
         gdn::detail::ShortBuild::kAuto, true},
        {"short kernel forced, its one-token build on the full parameter block", false,
         VKKernel::kShort, false, 0, gdn::detail::ShortBuild::kOneToken, true},
        {"short kernel forced, its one-token build loading the state first (fp32 state in the "
         "common form)",
         false, VKKernel::kShort, false, 0, gdn::detail::ShortBuild::kOneToken, false,
         gdn::detail::ShortLoadOrder::kStateFirst},
    };
    for (const Forced& run : forced_runs) {
      // The one-token sweep kernel exists only in builds with the tuning-sweep kernels
      // (built_kernels.h); GdnBuiltKernels checks the refusal elsewhere.
      if (run.one_token_sweep && !gdn::detail::kOneTokenSweepKernelBuilt) continue;
      LaunchOverride forced;
      forced.one_token_sweep = run.one_token_sweep;
      forced.vk_kernel = run.kernel;
      forced.wide_offsets = run.wide_offsets;
      forced.warps = run.warps;
      forced.short_build = run.short_build;
      forced.full_problem = run.full_problem;
      forced.load_order = run.load_order;
      SCOPED_TRACE(run.name);
      gdn::detail::LaunchPlan launched;
      const BufferContents forced_actual = run_cuda_tuned(test_case, forced, &launched);
      EXPECT_TRUE(launched_as_planned(test_case, forced, launched));
      EXPECT_TRUE(outputs_match(test_case, expected, forced_actual));
    }
  }
#endif

  // The reference's invalid-index count against the test's own bookkeeping.
  for (size_t i = 0; i < test_case.buffers().size(); ++i) {
    if (test_case.buffers()[i].name != "invalid_index_count") continue;
    int64_t counted = 0;
    std::memcpy(&counted, expected[i].data(), expected[i].size());
    if (expected[i].size() == 4) counted = static_cast<int32_t>(counted);
    EXPECT_EQ(counted, 5 + test_case.expected_invalid());
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return std::string(backend_name(std::get<0>(info.param))) + "_case" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, GdnDecodeSemantics,
    ::testing::Combine(::testing::Values(Backend::kCPU, Backend::kCUDA),
                       ::testing::Range(0, static_cast<int>(semantic_cases().size()))),
    case_name);

// Repeated calls on fresh random inputs: the backend keeps no state between calls.
TEST(GdnDecodeRepeated, FreshInputsEachCall) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    const std::string reason = backend_unavailable_reason(backend);
    if (!reason.empty()) {
      std::printf("[  NOTE    ] %s backend skipped: %s\n", backend_name(backend), reason.c_str());
      continue;
    }
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      GdnCaseConfig c;
      c.B = 6, c.T = 1 + seed % 3, c.H = 4, c.HV = 8, c.K = 64, c.V = 64;
      c.state_dtype = seed % 2 ? DType::kFloat32 : DType::kBFloat16;
      c.padding_fraction = 0.3;
      c.seed = 7000 + seed;
      SCOPED_TRACE(std::string(backend_name(backend)) + " " + c.describe());
      const GdnCase test_case(c);
      EXPECT_TRUE(
          outputs_match(test_case, run_reference(test_case), run_backend(test_case, backend)));
    }
  }
}

// Zero-sized batches and token counts are valid calls that do nothing.
TEST(GdnDecodeEmpty, ZeroRequestsAndZeroTokens) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    for (int64_t B : {0, 3}) {
      GdnCaseConfig c;
      c.B = B;
      c.T = B == 0 ? 1 : 0;
      c.K = 64;
      c.intermediate = true;
      c.capacity = 2;
      const GdnCase test_case(c);
      EXPECT_TRUE(
          outputs_match(test_case, run_reference(test_case), run_backend(test_case, backend)));
    }
  }
}

// The CPU backend stores a bf16 state rounded to nearest even, bit for bit like float_to_bf16,
// denormals included (AVX512-BF16's conversion would flush them): with beta = 0 the step is
// S' = exp(g) S, so every stored element is known exactly. Rows of every length class (in
// registers, streamed, with a scalar tail) and a random mix of normal, denormal and zero values.
TEST(GdnDecodeBf16State, StoresRoundToNearestEvenBitForBit) {
  for (const int64_t K : {int64_t{128}, int64_t{64}, int64_t{40}}) {
    for (const float g : {0.0f, -0.356f, -3.1f}) {
      const int64_t B = 2, H = 1, HV = 2, V = 8, P = 3;
      const int64_t state_count = P * HV * V * K;
      std::vector<uint16_t> state(static_cast<size_t>(state_count));
      uint64_t x = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(K);
      for (uint16_t& bits : state) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        const uint16_t sign = static_cast<uint16_t>((x >> 20) & 0x8000u);
        switch (x % 4) {
          case 0:  // denormal
            bits = static_cast<uint16_t>(sign | (1u + (x >> 24) % 0x7fu));
            break;
          case 1:  // around the smallest normal
            bits = static_cast<uint16_t>(sign | (0x0080u + (x >> 24) % 0x100u));
            break;
          case 2:  // zero
            bits = 0;
            break;
          default:  // ordinary values
            bits = static_cast<uint16_t>(sign | (0x3c00u + (x >> 24) % 0x0800u));
            break;
        }
      }
      const std::vector<uint16_t> initial = state;
      const std::vector<uint8_t> qk = random_floats(DType::kFloat32, B * H * K, 5, 0.0, 1.0);
      const std::vector<uint8_t> values = random_floats(DType::kFloat32, B * HV * V, 6, 0.0, 1.0);
      std::vector<float> log_decay(static_cast<size_t>(B * HV), g);
      std::vector<float> beta(static_cast<size_t>(B * HV), 0.0f);
      std::vector<float> out(static_cast<size_t>(B * HV * V), -1.0f);
      std::vector<int32_t> slots = {2, 0};

      const Device cpu = Device::cpu();
      gdn::DecodeParams p;
      void* qk_data = const_cast<uint8_t*>(qk.data());
      p.q = TensorView::contiguous(qk_data, DType::kFloat32, {B, 1, H, K}, cpu);
      p.k = TensorView::contiguous(qk_data, DType::kFloat32, {B, 1, H, K}, cpu);
      p.v = TensorView::contiguous(const_cast<uint8_t*>(values.data()), DType::kFloat32,
                                   {B, 1, HV, V}, cpu);
      p.g = TensorView::contiguous(log_decay.data(), DType::kFloat32, {B, 1, HV}, cpu);
      p.beta = TensorView::contiguous(beta.data(), DType::kFloat32, {B, 1, HV}, cpu);
      p.state = TensorView::contiguous(state.data(), DType::kBFloat16, {P, HV, V, K}, cpu);
      p.state_indices = TensorView::contiguous(slots.data(), DType::kInt32, {B}, cpu);
      p.out = TensorView::contiguous(out.data(), DType::kFloat32, {B, 1, HV, V}, cpu);
      gdn::decode(p);

      const float decay = std::exp(g);
      const int64_t slot_size = HV * V * K;
      int64_t mismatches = 0;
      for (int64_t i = 0; i < state_count; ++i) {
        const bool updated = i / slot_size != 1;  // slot 1 is not in the batch
        const size_t at = static_cast<size_t>(i);
        const uint16_t want =
            updated ? detail::float_to_bf16(decay * detail::bf16_to_float(initial[at]))
                    : initial[at];
        if (state[at] != want && ++mismatches <= 5) {
          ADD_FAILURE() << "K=" << K << " g=" << g << " element " << i << ": got 0x" << std::hex
                        << state[at] << ", want 0x" << want << " (from 0x" << initial[at] << ")"
                        << std::dec;
        }
      }
      EXPECT_EQ(mismatches, 0) << "K=" << K << " g=" << g;
    }
  }
}

}  // namespace
}  // namespace testing
}  // namespace hdk
