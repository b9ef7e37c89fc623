// A non-owning view of a strided tensor: hdk never allocates or frees the memory it is given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "hdk/device.h"
#include "hdk/dtype.h"

namespace hdk {

struct TensorView {
  static constexpr int kMaxDims = 8;

  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Device device = Device::cpu();
  int ndim = -1;  // -1: not given (a default-constructed view)
  int64_t shape[kMaxDims] = {};
  int64_t strides[kMaxDims] = {};  // in elements, not bytes

  // Row-major strides computed from the shape.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               Device device = Device::cpu());
  static TensorView contiguous(void* data, DType dtype, const std::vector<int64_t>& shape,
                               Device device = Device::cpu());
  static TensorView strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                            std::initializer_list<int64_t> strides, Device device = Device::cpu());
  static TensorView strided(void* data, DType dtype, const std::vector<int64_t>& shape,
                            const std::vector<int64_t>& strides, Device device = Device::cpu());

  bool defined() const { return ndim >= 0; }
  int64_t size(int dim) const { return shape[dim]; }
  int64_t stride(int dim) const { return strides[dim]; }
  int64_t numel() const;
  size_t element_size() const { return dtype_size(dtype); }
  bool is_contiguous() const;

  // "[2, 3, 4]"-style strings for messages.
  std::string shape_str() const;
  std::string strides_str() const;
};

}  // namespace hdk
