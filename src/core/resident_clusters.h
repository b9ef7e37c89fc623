// How many thread-block clusters of each size a kernel's launch configuration fits on the device
// at once, as plain host-and-device data: the launch plans (and their CPU tests) read it without
// CUDA headers; core/cuda_helpers.h asks the device for it (resident_clusters).
#pragma once

#include "core/host_device.h"

namespace hdk {
namespace detail {

constexpr int kPortableClusterSize = 8;
constexpr int kMaxClusterSize = 16;  // Hopper's largest, a non-portable size a kernel opts in to

// by_size[s]: clusters of s CTAs the device runs at once (cudaOccupancyMaxActiveClusters). A
// cluster needs its SMs in one GPC, so this can be well under SMs / s (an H100 with one CTA an SM:
// 132, 66, 39, 30, 22, 17, 15 and 15 for 1 to 8 CTAs, 9 for 9, 7 for 10 to 16). Above the
// portable 8, 0 where the device or the driver refuses the size.
struct ResidentClusterCounts {
  int by_size[kMaxClusterSize + 1] = {};
  // The largest cluster a plan may take: 16 where the device runs clusters of 16, else 8.
  HDK_HOST_DEVICE int largest() const {
    return by_size[kMaxClusterSize] > 0 ? kMaxClusterSize : kPortableClusterSize;
  }
};

}  // namespace detail
}  // namespace hdk
