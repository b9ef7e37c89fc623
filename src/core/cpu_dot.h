// The fp32 dot product of the CPU backends: 4-float vectors (GCC/Clang vector extensions) with
// four accumulators to hide the add latency, so the compiler keeps it in SIMD registers without
// -ffast-math. The summation order is fixed, so results do not depend on threading.
#pragma once

#include <cstdint>
#include <cstring>

namespace hdk {
namespace detail {

using float4 = float __attribute__((vector_size(16)));

inline float4 load4(const float* p) {
  float4 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline float dot(const float* x, const float* y, int64_t n) {
  float4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  const int64_t full = n - n % 16;
  int64_t i = 0;
  for (; i < full; i += 16) {
    a0 += load4(x + i) * load4(y + i);
    a1 += load4(x + i + 4) * load4(y + i + 4);
    a2 += load4(x + i + 8) * load4(y + i + 8);
    a3 += load4(x + i + 12) * load4(y + i + 12);
  }
  const float4 a = (a0 + a1) + (a2 + a3);
  float sum = (a[0] + a[1]) + (a[2] + a[3]);
  for (; i < n; ++i)
    sum += x[i] * y[i];
  return sum;
}

}  // namespace detail
}  // namespace hdk
