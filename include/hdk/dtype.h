// Element types hdk understands.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hdk {

enum class DType : uint8_t {
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt32,
  kInt64,
  kUInt8,
};

// Size of one element in bytes.
size_t dtype_size(DType dtype);

// Short lowercase name ("float32", "bfloat16", ...) used in error messages and tables.
const char* dtype_name(DType dtype);

}  // namespace hdk
