// The oracle itself, against values worked out by hand: if the reference were wrong, every
// backend test would be comparing against the wrong thing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "gdn/reference/decode_reference.h"

namespace hdk {
namespace {

struct TinyCall {
  // H = HV = 1, K = V = 2, T = 2, pool of 2 slots, request 0 uses slot 1.
  std::vector<float> q = {0, 1, 1, 1};
  std::vector<float> k = {1, 0, 0, 1};
  std::vector<float> v = {1, 1, 0, 0};
  std::vector<float> g = {std::log(0.5f), 0.0f};
  std::vector<float> beta = {0.5f, 1.0f};
  std::vector<float> state = {9, 9, 9, 9, 1, 2, 3, 4};  // slot 1: S = [[1, 2], [3, 4]]
  std::vector<int32_t> indices = {1};
  std::vector<float> out = std::vector<float>(4, -123.0f);

  gdn::DecodeParams params() {
    gdn::DecodeParams p;
    p.q = TensorView::contiguous(q.data(), DType::kFloat32, {1, 2, 1, 2});
    p.k = TensorView::contiguous(k.data(), DType::kFloat32, {1, 2, 1, 2});
    p.v = TensorView::contiguous(v.data(), DType::kFloat32, {1, 2, 1, 2});
    p.g = TensorView::contiguous(g.data(), DType::kFloat32, {1, 2, 1});
    p.beta = TensorView::contiguous(beta.data(), DType::kFloat32, {1, 2, 1});
    p.state = TensorView::contiguous(state.data(), DType::kFloat32, {2, 1, 2, 2});
    p.state_indices = TensorView::contiguous(indices.data(), DType::kInt32, {1});
    p.out = TensorView::contiguous(out.data(), DType::kFloat32, {1, 2, 1, 2});
    p.use_qk_l2norm = false;
    p.scale = 1.0f;
    return p;
  }
};

// Token 1: S = 0.5 S0 = [[.5, 1], [1.5, 2]]; u = .5 (v - S k) = [.25, -.25];
//          S += u k^T = [[.75, 1], [1.25, 2]]; o = S q = [1, 2].
// Token 2: decay 1, beta 1: u = -S k = [-1, -2]; S = [[.75, 0], [1.25, 0]]; o = [.75, 1.25].
TEST(GdnReference, HandWorkedTwoTokenExample) {
  TinyCall call;
  gdn::decode_reference(call.params());
  const std::vector<float> expected_out = {1.0f, 2.0f, 0.75f, 1.25f};
  const std::vector<float> expected_state = {9, 9, 9, 9, 0.75f, 0.0f, 1.25f, 0.0f};
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(call.out[i], expected_out[i], 1e-6) << i;
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(call.state[i], expected_state[i], 1e-6) << i;
}

TEST(GdnReference, KVLayoutStoresTheTranspose) {
  TinyCall call;
  call.state = {9, 9, 9, 9, 1, 3, 2, 4};  // slot 1 holds S0^T
  gdn::DecodeParams p = call.params();
  p.layout = gdn::StateLayout::kKV;
  gdn::decode_reference(p);
  const std::vector<float> expected_state = {9, 9, 9, 9, 0.75f, 1.25f, 0.0f, 0.0f};
  for (int i = 0; i < 8; ++i)
    EXPECT_NEAR(call.state[i], expected_state[i], 1e-6) << i;
  EXPECT_NEAR(call.out[2], 0.75f, 1e-6);
}

// Fused gating with A_log = 0, a + dt_bias = 0, b = 0 gives decay 1/2 and beta 1/2 (token 1);
// a = -40 gives softplus ~ 4e-18 (decay 1) and b = 40 gives beta ~ 1 (token 2): same result.
TEST(GdnReference, FusedGatingMatchesTheFormula) {
  TinyCall call;
  std::vector<float> A_log = {0.0f}, dt_bias = {0.0f};
  std::vector<float> a = {0.0f, -40.0f}, b = {0.0f, 40.0f};
  gdn::DecodeParams p = call.params();
  p.g = p.beta = TensorView();
  p.A_log = TensorView::contiguous(A_log.data(), DType::kFloat32, {1});
  p.dt_bias = TensorView::contiguous(dt_bias.data(), DType::kFloat32, {1});
  p.a = TensorView::contiguous(a.data(), DType::kFloat32, {1, 2, 1});
  p.b = TensorView::contiguous(b.data(), DType::kFloat32, {1, 2, 1});
  gdn::decode_reference(p);
  const std::vector<float> expected_out = {1.0f, 2.0f, 0.75f, 1.25f};
  for (int i = 0; i < 4; ++i)
    EXPECT_NEAR(call.out[i], expected_out[i], 1e-6) << i;
}

// softplus(x) with torch's (beta, threshold): x when beta * x > threshold, else
// log(1 + exp(beta * x)) / beta. With k = [1, 0] and q = [0, 1], token 1 outputs
// decay * [2, 4] (the untouched second column of S0), so the decay is read off directly.
TEST(GdnReference, SoftplusBetaAndThreshold) {
  struct Case {
    float softplus_beta, softplus_threshold;
    double expected_softplus;
  };
  const Case cases[] = {
      {1.0f, 0.5f, 1.0},                               // linear branch: 1 > 0.5
      {1.0f, 20.0f, std::log1p(std::exp(1.0))},        // log branch
      {2.0f, 20.0f, std::log1p(std::exp(2.0)) / 2.0},  // beta scales inside and outside
  };
  for (const Case& c : cases) {
    TinyCall call;
    std::vector<float> A_log = {0.0f}, dt_bias = {0.25f};
    std::vector<float> a = {0.75f, 0.75f}, b = {0.0f, 0.0f};
    gdn::DecodeParams p = call.params();
    p.g = p.beta = TensorView();
    p.A_log = TensorView::contiguous(A_log.data(), DType::kFloat32, {1});
    p.dt_bias = TensorView::contiguous(dt_bias.data(), DType::kFloat32, {1});
    p.a = TensorView::contiguous(a.data(), DType::kFloat32, {1, 2, 1});
    p.b = TensorView::contiguous(b.data(), DType::kFloat32, {1, 2, 1});
    p.softplus_beta = c.softplus_beta;
    p.softplus_threshold = c.softplus_threshold;
    gdn::decode_reference(p);
    const double decay = std::exp(-c.expected_softplus);
    EXPECT_NEAR(call.out[0], 2.0 * decay, 1e-6) << c.softplus_beta << " " << c.softplus_threshold;
    EXPECT_NEAR(call.out[1], 4.0 * decay, 1e-6) << c.softplus_beta << " " << c.softplus_threshold;
  }
}

TEST(GdnReference, L2NormAndDefaultScale) {
  TinyCall call;
  call.q = {0, 3, 1, 1};
  call.k = {2, 0, 0, 5};
  gdn::DecodeParams with_norm = call.params();
  with_norm.use_qk_l2norm = true;
  with_norm.l2norm_eps = 0.0f;
  with_norm.scale = 0.0f;  // K^-0.5 = 1/sqrt(2)
  gdn::decode_reference(with_norm);
  // Token 1 with normalized k = [1, 0], q = [0, 1] / sqrt(2): o = [1, 2] / sqrt(2).
  EXPECT_NEAR(call.out[0], 1.0f / std::sqrt(2.0f), 1e-6);
  EXPECT_NEAR(call.out[1], 2.0f / std::sqrt(2.0f), 1e-6);
}

TEST(GdnReference, PaddingRowWritesZerosAndNoSlot) {
  TinyCall call;
  call.indices = {-1};
  gdn::decode_reference(call.params());
  for (float o : call.out)
    EXPECT_EQ(o, 0.0f);
  const std::vector<float> untouched = {9, 9, 9, 9, 1, 2, 3, 4};
  EXPECT_EQ(call.state, untouched);
}

}  // namespace
}  // namespace hdk
