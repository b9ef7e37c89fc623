// Integer division rounded up, for tile, wave and segment counts on the host and in kernels.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace hdk {
namespace detail {

// a / b rounded up, for a >= 0 and b > 0.
HDK_HOST_DEVICE constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace detail
}  // namespace hdk
