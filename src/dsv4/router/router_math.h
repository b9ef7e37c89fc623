// The router's per-element formulas, shared by the CPU and CUDA backends so both compute the
// same fp32 values (the float64 reference writes them out on its own).
#pragma once

#include <cfloat>
#include <cmath>

#include "core/host_device.h"

namespace hdk {
namespace dsv4 {
namespace detail {

// s = sqrt(softplus(x)) in fp32, with torch's softplus threshold (x > 20 returns x) so the
// result matches the PyTorch chain the router replaces. NaN stays NaN; -inf gives 0.
HDK_HOST_DEVICE float router_score(float logit) {
  const float softplus = logit > 20.0f ? logit : log1pf(expf(logit));
  return sqrtf(softplus);
}

// Weights are s / sum * route_scale; a sum that is 0 (every selected logit -inf, or so negative
// that fp32 softplus underflows), infinite (a +inf logit) or NaN cannot give finite weights.
HDK_HOST_DEVICE bool weights_formable(float selected_sum) {
  return selected_sum > 0.0f && selected_sum <= FLT_MAX;
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
