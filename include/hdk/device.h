// Where the memory behind a TensorView lives.
#pragma once

#include <cstdint>
#include <string>

namespace hdk {

struct Device {
  enum class Type : uint8_t { kCPU, kCUDA };

  Type type = Type::kCPU;
  int index = 0;  // CUDA ordinal; always 0 for the CPU

  static constexpr Device cpu() { return Device{Type::kCPU, 0}; }
  static constexpr Device cuda(int index = 0) { return Device{Type::kCUDA, index}; }

  bool is_cpu() const { return type == Type::kCPU; }
  bool is_cuda() const { return type == Type::kCUDA; }
  bool operator==(const Device& other) const { return type == other.type && index == other.index; }
  bool operator!=(const Device& other) const { return !(*this == other); }

  // "cpu" or "cuda:N".
  std::string str() const;
};

}  // namespace hdk
