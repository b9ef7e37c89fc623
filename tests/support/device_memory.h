// Test-side memory on a backend: host vectors for the CPU, cudaMalloc for CUDA. Lets one test
// body run against every backend the build and the machine have.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hdk/cuda_stream.h"
#include "hdk/device.h"

namespace hdk {
namespace testing {

enum class Backend { kCPU, kCUDA };

const char* backend_name(Backend backend);
Device backend_device(Backend backend);

// Empty when the backend can run here; otherwise why not ("no CUDA device", ...).
std::string backend_unavailable_reason(Backend backend);

// Bytes on a backend, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend backend, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept;

  void* data() const { return data_; }
  size_t size() const { return bytes_; }
  void upload(const void* host, size_t bytes, size_t offset = 0);
  void download(void* host, size_t bytes, size_t offset = 0) const;
  void fill(uint8_t byte);

 private:
  Backend backend_;
  size_t bytes_ = 0;
  void* data_ = nullptr;
  std::vector<uint8_t> host_;
};

// Waits for all work on the CUDA device (no-op on the CPU); throws on a CUDA error.
void synchronize(Backend backend);

}  // namespace testing
}  // namespace hdk
