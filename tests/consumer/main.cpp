// A downstream program: one GDN decode step through the installed public headers only.
#include <hdk/hdk.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  const int64_t B = 2, T = 1, H = 1, HV = 2, K = 4, V = 4;
  std::vector<float> q(B * T * H * K, 0.5f), k(B * T * H * K, 0.25f), v(B * T * HV * V, 1.0f);
  std::vector<float> g(B * T * HV, -0.1f), beta(B * T * HV, 0.5f);
  std::vector<float> state(B * HV * V * K, 0.1f), out(B * T * HV * V, -1.0f);

  hdk::gdn::DecodeParams params;
  params.q = hdk::TensorView::contiguous(q.data(), hdk::DType::kFloat32, {B, T, H, K});
  params.k = hdk::TensorView::contiguous(k.data(), hdk::DType::kFloat32, {B, T, H, K});
  params.v = hdk::TensorView::contiguous(v.data(), hdk::DType::kFloat32, {B, T, HV, V});
  params.g = hdk::TensorView::contiguous(g.data(), hdk::DType::kFloat32, {B, T, HV});
  params.beta = hdk::TensorView::contiguous(beta.data(), hdk::DType::kFloat32, {B, T, HV});
  params.state = hdk::TensorView::contiguous(state.data(), hdk::DType::kFloat32, {B, HV, V, K});
  params.out = hdk::TensorView::contiguous(out.data(), hdk::DType::kFloat32, {B, T, HV, V});
  try {
    hdk::gdn::decode(params);
  } catch (const hdk::Error& error) {
    std::fprintf(stderr, "decode failed: %s\n", error.what());
    return 1;
  }
  for (float value : out) {
    if (!std::isfinite(value) || value == -1.0f) {
      std::fprintf(stderr, "output not written\n");
      return 1;
    }
  }
  std::printf("hdk %s consumer ok: out[0] = %f\n", hdk::version(), out[0]);
  return 0;
}
