#include "support/device_memory.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hdk {
namespace testing {

#ifdef HDK_WITH_CUDA
namespace {
void check_cuda(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(status));
  }
}
}  // namespace
#endif

const char* backend_name(Backend backend) {
  return backend == Backend::kCPU ? "cpu" : "cuda";
}

Device backend_device(Backend backend) {
  return backend == Backend::kCPU ? Device::cpu() : Device::cuda(0);
}

std::string backend_unavailable_reason(Backend backend) {
  if (backend == Backend::kCPU) return "";
#ifdef HDK_WITH_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable CUDA device (") + cudaGetErrorString(status) + ")";
  }
  if (count == 0) return "no CUDA device on this machine";
  return "";
#else
  return "this build has no CUDA backend (HDK_WITH_CUDA off)";
#endif
}

DeviceBuffer::DeviceBuffer(Backend backend, size_t bytes) : backend_(backend), bytes_(bytes) {
  if (backend_ == Backend::kCPU) {
    // 64-byte aligned, as serving engines' allocators (and cudaMalloc) hand memory out: the CPU
    // backend streams rows past the caches only from aligned addresses.
    host_.resize(bytes + 63);
    const uintptr_t start = reinterpret_cast<uintptr_t>(host_.data());
    data_ = host_.data() + ((64 - start % 64) % 64);
    return;
  }
#ifdef HDK_WITH_CUDA
  if (bytes > 0) check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
#else
  throw std::runtime_error("DeviceBuffer: CUDA backend not built");
#endif
}

DeviceBuffer::~DeviceBuffer() {
#ifdef HDK_WITH_CUDA
  if (backend_ == Backend::kCUDA && data_ != nullptr) cudaFree(data_);
#endif
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : backend_(other.backend_),
      bytes_(other.bytes_),
      data_(other.data_),
      host_(std::move(other.host_)) {  // a moved vector keeps its storage, so data_ stays valid
  other.data_ = nullptr;
  other.bytes_ = 0;
}

void DeviceBuffer::upload(const void* host, size_t bytes, size_t offset) {
  if (bytes == 0) return;
  if (backend_ == Backend::kCPU) {
    std::memcpy(static_cast<char*>(data_) + offset, host, bytes);
    return;
  }
#ifdef HDK_WITH_CUDA
  check_cuda(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice),
             "cudaMemcpy to device");
#endif
}

void DeviceBuffer::download(void* host, size_t bytes, size_t offset) const {
  if (bytes == 0) return;
  if (backend_ == Backend::kCPU) {
    std::memcpy(host, static_cast<const char*>(data_) + offset, bytes);
    return;
  }
#ifdef HDK_WITH_CUDA
  check_cuda(
      cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost),
      "cudaMemcpy to host");
#endif
}

void DeviceBuffer::fill(uint8_t byte) {
  if (backend_ == Backend::kCPU) {
    std::memset(data_, byte, bytes_);
    return;
  }
#ifdef HDK_WITH_CUDA
  check_cuda(cudaMemset(data_, byte, bytes_), "cudaMemset");
#endif
}

void synchronize(Backend backend) {
#ifdef HDK_WITH_CUDA
  if (backend == Backend::kCUDA) check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  (void)backend;
#endif
}

}  // namespace testing
}  // namespace hdk
