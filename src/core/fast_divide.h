// Division by a divisor fixed for a whole launch (a page's block size) with a multiply-high, an
// add and a shift instead of the ~20 instructions of a 32-bit integer division: Granlund and
// Montgomery's round-up method ("Division by Invariant Integers using Multiplication", 1994).
// Exact for every numerator below 2^31 and every divisor from 1 to 2^31 - 1, which is what the
// kernels divide (entry ordinals of int32 lists); tests/core/core_test.cpp checks it against `/`.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace hdk {
namespace detail {

// n / d for n < 2^31, given FastDivide's multiplier and shift for d: the sum stays under 2^32
// because the high product is < n. For a divisor kept as those two fields alone.
HDK_HOST_DEVICE uint32_t fast_quotient(uint32_t n, uint32_t multiplier, uint32_t shift) {
#if defined(__CUDA_ARCH__)
  const uint32_t high = __umulhi(n, multiplier);
#else
  const uint32_t high = static_cast<uint32_t>((uint64_t{n} * multiplier) >> 32);
#endif
  return (high + n) >> shift;
}

struct FastDivide {
  uint32_t divisor = 1;
  uint32_t multiplier = 0;  // floor(2^32 (2^shift - divisor) / divisor) + 1
  uint32_t shift = 0;       // ceil(log2(divisor))

  FastDivide() = default;
  // `divisor` in 1 .. 2^31 - 1 (the caller checks). Also on the device, where a kernel builds
  // it once per thread for a divisor it reads from its parameters.
  HDK_HOST_DEVICE explicit FastDivide(uint32_t d) : divisor(d) {
    while ((uint64_t{1} << shift) < d)
      ++shift;
    multiplier =
        static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }

  // n / divisor for n < 2^31.
  HDK_HOST_DEVICE uint32_t quotient(uint32_t n) const {
    return fast_quotient(n, multiplier, shift);
  }
  // n / divisor rounded up, for n < 2^31.
  HDK_HOST_DEVICE uint32_t ceil_quotient(uint32_t n) const {
    const uint32_t q = quotient(n);
    return q + (q * divisor != n ? 1u : 0u);
  }
};

}  // namespace detail
}  // namespace hdk
