// The per-token scalars of the GDN step, shared by the CPU and CUDA backends.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace hdk {
namespace gdn {
namespace detail {

// g = -exp(A_log) * softplus(a + dt_bias), with torch's softplus(beta, threshold) convention.
HDK_HOST_DEVICE float fused_log_decay(float A_log, float a, float dt_bias, float softplus_beta,
                                      float softplus_threshold) {
  const float x = a + dt_bias;
  const float bx = softplus_beta * x;
  const float softplus = bx > softplus_threshold ? x : log1pf(expf(bx)) / softplus_beta;
  return -expf(A_log) * softplus;
}

HDK_HOST_DEVICE float sigmoid(float x) {
  return 1.0f / (1.0f + expf(-x));
}

}  // namespace detail
}  // namespace gdn
}  // namespace hdk
