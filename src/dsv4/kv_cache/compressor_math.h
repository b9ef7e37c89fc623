// The compressor's per-channel online softmax, shared by the CPU and CUDA backends. A window's
// softmax-weighted sum is kept as (running max M, sum of e^(s - M), sum of kv * e^(s - M)); two
// accumulators merge exactly, which is how CSA's one softmax over the previous window's first-d
// channels and the current window's last-d channels is formed without keeping rows.
#pragma once

#include <cmath>

#include "core/host_device.h"

namespace hdk {
namespace dsv4 {
namespace detail {

struct SoftmaxAccumulator {
  float max;
  float sum;
  float weighted;
};

HDK_HOST_DEVICE SoftmaxAccumulator empty_accumulator() {
  return SoftmaxAccumulator{-INFINITY, 0.0f, 0.0f};
}

// Folds in one row (score s, value v). A score of -inf weighs nothing; NaN or +inf make the
// accumulator NaN, as the float64 softmax over rows would (e^(inf - inf)).
HDK_HOST_DEVICE void accumulate(SoftmaxAccumulator& a, float s, float v) {
  if (s == -INFINITY) return;
  if (!(s < INFINITY)) {
    a.sum = NAN;
    a.weighted = NAN;
    return;
  }
  if (s > a.max) {
    const float rescale = expf(a.max - s);  // 0 for the empty accumulator
    a.sum = a.sum * rescale + 1.0f;
    a.weighted = a.weighted * rescale + v;
    a.max = s;
  } else {
    const float w = expf(s - a.max);
    a.sum += w;
    a.weighted += v * w;
  }
}

// sum_r v_r softmax_r(s) over the rows of both accumulators (an empty one contributes nothing).
HDK_HOST_DEVICE float softmax_merge(const SoftmaxAccumulator& a, const SoftmaxAccumulator& b) {
  const float top = fmaxf(a.max, b.max);
  const float wa = a.max == -INFINITY ? 0.0f : expf(a.max - top);
  const float wb = b.max == -INFINITY ? 0.0f : expf(b.max - top);
  return (a.weighted * wa + b.weighted * wb) / (a.sum * wa + b.sum * wb);
}

// cos/sin rotation of one RoPE pair.
HDK_HOST_DEVICE void rotate_pair(float& x0, float& x1, float cosine, float sine) {
  const float y0 = x0 * cosine - x1 * sine;
  const float y1 = x0 * sine + x1 * cosine;
  x0 = y0;
  x1 = y1;
}

// 1 / sqrt(128): the normalization of the 128-point Hadamard transform.
constexpr float kHadamardNorm = 0.08838834764831845f;

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
