// A float's bits and the float of given bits, the same on the host and the device (the CPU
// backends and tests reproduce the kernels' bit manipulations with them).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace hdk {
namespace detail {

HDK_HOST_DEVICE uint32_t float_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

HDK_HOST_DEVICE float float_of_bits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

}  // namespace detail
}  // namespace hdk
