// Host-side CUDA plumbing shared by the CUDA backends (compiled only with HDK_WITH_CUDA): error
// checks that become hdk::Error naming the operation, a device guard, and device properties
// read once per device so the call path makes no driver queries after the first call.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "core/resident_clusters.h"
#include "hdk/error.h"

namespace hdk {
namespace detail {

inline void check_cuda(cudaError_t status, const char* operation, const char* what) {
  if (status != cudaSuccess) {
    throw Error(std::string(operation) + ": " + what + " failed: " + cudaGetErrorString(status));
  }
}

// After a launch: configuration errors come back from the launch call, others from here.
inline void check_launch(cudaError_t launch_status, const char* operation, const char* kernel) {
  check_cuda(launch_status, operation, kernel);
  check_cuda(cudaGetLastError(), operation, kernel);
}

// Switches to the tensors' device for the call and back afterwards.
class CudaDeviceGuard {
 public:
  CudaDeviceGuard(int device, const char* operation) {
    check_cuda(cudaGetDevice(&previous_), operation, "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), operation, "cudaSetDevice");
  }
  ~CudaDeviceGuard() { cudaSetDevice(previous_); }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

// A device attribute, read once per device and attribute.
inline int cached_device_attribute(cudaDeviceAttr attribute, int device, const char* operation) {
  constexpr int kDevices = 64;
  constexpr int kSlots = 4;
  static std::atomic<int> cache[kSlots][kDevices] = {};
  const int slot = attribute == cudaDevAttrMultiProcessorCount            ? 0
                   : attribute == cudaDevAttrMaxSharedMemoryPerBlockOptin ? 1
                                                                          : 2;
  int value = (device >= 0 && device < kDevices && slot < 2)
                  ? cache[slot][device].load(std::memory_order_relaxed)
                  : 0;
  if (value == 0) {
    check_cuda(cudaDeviceGetAttribute(&value, attribute, device), operation,
               "cudaDeviceGetAttribute");
    if (device >= 0 && device < kDevices && slot < 2) {
      cache[slot][device].store(value, std::memory_order_relaxed);
    }
  }
  return value;
}

// Raises a kernel's dynamic shared memory limit to at least `bytes` once per (kernel, device); a
// host-side attribute, not a stream operation, so it is allowed during graph capture as well.
template <typename Kernel>
void allow_dynamic_shared_memory(Kernel kernel, int bytes, int device, const char* operation) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, int> raised_to;
  const auto key = std::make_pair(reinterpret_cast<const void*>(kernel), device);
  std::lock_guard<std::mutex> lock(mutex);
  int& current = raised_to[key];
  if (current >= bytes) return;
  check_cuda(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes),
             operation, "cudaFuncSetAttribute (dynamic shared memory)");
  current = bytes;
}

// Whether hdk launches its kernels as programmatic dependents of the kernel before them on the
// stream (Hopper; see launch_in_clusters). On by default; HDK_NO_PDL=1 in the environment turns
// it off for the process (a debugging aid), and set_dependent_launch for A/B runs.
inline std::atomic<bool>& dependent_launch_flag() {
  static std::atomic<bool> enabled{[] {
    const char* value = std::getenv("HDK_NO_PDL");
    return value == nullptr || value[0] == '\0' || value[0] == '0';
  }()};
  return enabled;
}
inline bool dependent_launch_enabled() {
  return dependent_launch_flag().load();
}
inline void set_dependent_launch(bool enabled) {
  dependent_launch_flag().store(enabled);
}

// The launch configuration of a `grid` of CTAs of `block` threads in clusters of `cluster_size`
// CTAs along x (0: not a cluster launch), optionally as a programmatic dependent of the kernel
// before it. It owns the attributes its config points to, so it is not copied.
struct ClusterLaunch {
  cudaLaunchConfig_t config = {};
  cudaLaunchAttribute attribute[2] = {};

  ClusterLaunch(dim3 grid, unsigned block, size_t shared_bytes, cudaStream_t stream,
                unsigned cluster_size, bool dependent = false) {
    config.gridDim = grid;
    config.blockDim = dim3(block, 1, 1);
    config.dynamicSmemBytes = shared_bytes;
    config.stream = stream;
    config.attrs = attribute;
    config.numAttrs = 0;
    if (cluster_size > 0) {
      cudaLaunchAttribute& cluster = attribute[config.numAttrs++];
      cluster.id = cudaLaunchAttributeClusterDimension;
      cluster.val.clusterDim.x = cluster_size;
      cluster.val.clusterDim.y = 1;
      cluster.val.clusterDim.z = 1;
    }
    if (dependent) {
      cudaLaunchAttribute& serialization = attribute[config.numAttrs++];
      serialization.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      serialization.val.programmaticStreamSerializationAllowed = 1;
    }
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
};

// Whether a grid of `grid` CTAs leaves at least half of the current device's SMs without one of
// its CTAs. Only such grids are launched as programmatic dependents, for the reason
// begin_dependent_kernel lets only such grids trigger early: a grid scheduled while the kernel
// before it still holds SMs has its CTAs placed on the SMs free at that moment. (H200, whole
// decode step at context 65536: without this rule 46 of 48 cells within 2%, Flash HCA and Pro
// CSA at N = 2 3.3% and 4.5% slower.)
inline bool leaves_half_the_sms_idle(unsigned grid) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const int sms = cached_device_attribute(cudaDevAttrMultiProcessorCount, device, "hdk launch");
  return 2ull * grid <= static_cast<unsigned long long>(sms);
}

// Launches `kernel` as `grid` CTAs of `block` threads in clusters of `cluster_size` CTAs along x
// (0: not a cluster launch) and, while dependent_launch_enabled() and the grid leaves half the
// SMs idle, as a programmatic dependent of the kernel before it on `stream` (Hopper): its CTAs may
// be scheduled once that kernel's CTAs have all allowed it (allow_dependent_grids) or exited, and
// wait for its results in `griddepcontrol.wait` (wait_for_prior_grid;
// core/cuda/dependent_launch.cuh), so its launch and prologue hide behind the other's tail. A CUDA
// graph captures that as a programmatic edge. Every kernel launched here must call
// wait_for_prior_grid before it touches global memory. Returns the launch's status for
// check_launch.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_in_clusters(void (*kernel)(KernelArgs...), unsigned grid, unsigned block,
                               size_t shared_bytes, cudaStream_t stream, unsigned cluster_size,
                               Args&&... args) {
  ClusterLaunch launch(dim3(grid, 1, 1), block, shared_bytes, stream, cluster_size,
                       dependent_launch_enabled() && leaves_half_the_sms_idle(grid));
  return cudaLaunchKernelEx(&launch.config, kernel, std::forward<Args>(args)...);
}

// launch_in_clusters without a cluster.
template <typename... KernelArgs, typename... Args>
cudaError_t launch_dependent(void (*kernel)(KernelArgs...), unsigned grid, unsigned block,
                             size_t shared_bytes, cudaStream_t stream, Args&&... args) {
  return launch_in_clusters(kernel, grid, block, shared_bytes, stream, 0,
                            std::forward<Args>(args)...);
}

// ResidentClusterCounts (core/resident_clusters.h) of `kernel` with `block` threads and
// `shared_bytes` of dynamic shared memory a CTA, every size from 1 to kMaxClusterSize, asked of
// the device once per (kernel, device, block, shared bytes) and kept, so a call's planning is one
// lookup; host-only, allowed during graph capture. Above the portable 8 the kernel opts in to
// non-portable sizes on first use, and a refusal by the device or the driver is the answer 0,
// not an error.
template <typename... KernelArgs>
const ResidentClusterCounts& resident_clusters(void (*kernel)(KernelArgs...), unsigned block,
                                               size_t shared_bytes, int device,
                                               const char* operation) {
  static std::mutex mutex;
  // std::map's elements stay where they are, so the reference returned outlives the lock.
  static std::map<std::tuple<const void*, int, unsigned, size_t>, ResidentClusterCounts> known;
  const auto key =
      std::make_tuple(reinterpret_cast<const void*>(kernel), device, block, shared_bytes);
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(key);
  if (found != known.end()) return found->second;
  ResidentClusterCounts counts;
  for (unsigned size = 1; size <= static_cast<unsigned>(kMaxClusterSize); ++size) {
    ClusterLaunch launch(dim3(size, 1, 1), block, shared_bytes, nullptr, size);
    int clusters = 0;
    if (size <= static_cast<unsigned>(kPortableClusterSize)) {
      check_cuda(cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config), operation,
                 "cudaOccupancyMaxActiveClusters");
    } else {
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
              cudaSuccess ||
          cudaOccupancyMaxActiveClusters(&clusters, kernel, &launch.config) != cudaSuccess) {
        clusters = 0;
      }
      (void)cudaGetLastError();  // a refusal must not surface at the next launch
    }
    counts.by_size[size] = clusters;
  }
  return known.emplace(key, counts).first->second;
}

}  // namespace detail
}  // namespace hdk
