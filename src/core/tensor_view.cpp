#include "hdk/tensor_view.h"

#include <string>

#include "hdk/error.h"

namespace hdk {
namespace {

TensorView make_view(void* data, DType dtype, const int64_t* shape, const int64_t* strides,
                     size_t ndim, Device device) {
  if (ndim > static_cast<size_t>(TensorView::kMaxDims)) {
    throw Error("hdk::TensorView: at most " + std::to_string(TensorView::kMaxDims) +
                " dimensions are supported, got " + std::to_string(ndim));
  }
  TensorView view;
  view.data = data;
  view.dtype = dtype;
  view.device = device;
  view.ndim = static_cast<int>(ndim);
  for (size_t d = 0; d < ndim; ++d) {
    if (shape[d] < 0) {
      throw Error("hdk::TensorView: dimension " + std::to_string(d) + " has negative size " +
                  std::to_string(shape[d]));
    }
    view.shape[d] = shape[d];
  }
  if (strides != nullptr) {
    for (size_t d = 0; d < ndim; ++d)
      view.strides[d] = strides[d];
  } else {
    int64_t running = 1;
    for (size_t d = ndim; d-- > 0;) {
      view.strides[d] = running;
      running *= shape[d] > 0 ? shape[d] : 1;
    }
  }
  return view;
}

std::string join(const int64_t* values, int count) {
  std::string text = "[";
  for (int i = 0; i < count; ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(values[i]);
  }
  return text + "]";
}

}  // namespace

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape,
                                  Device device) {
  return make_view(data, dtype, shape.begin(), nullptr, shape.size(), device);
}

TensorView TensorView::contiguous(void* data, DType dtype, const std::vector<int64_t>& shape,
                                  Device device) {
  return make_view(data, dtype, shape.data(), nullptr, shape.size(), device);
}

TensorView TensorView::strided(void* data, DType dtype, std::initializer_list<int64_t> shape,
                               std::initializer_list<int64_t> strides, Device device) {
  if (shape.size() != strides.size()) {
    throw Error("hdk::TensorView::strided: " + std::to_string(shape.size()) + " sizes but " +
                std::to_string(strides.size()) + " strides");
  }
  return make_view(data, dtype, shape.begin(), strides.begin(), shape.size(), device);
}

TensorView TensorView::strided(void* data, DType dtype, const std::vector<int64_t>& shape,
                               const std::vector<int64_t>& strides, Device device) {
  if (shape.size() != strides.size()) {
    throw Error("hdk::TensorView::strided: " + std::to_string(shape.size()) + " sizes but " +
                std::to_string(strides.size()) + " strides");
  }
  return make_view(data, dtype, shape.data(), strides.data(), shape.size(), device);
}

int64_t TensorView::numel() const {
  if (!defined()) return 0;
  int64_t count = 1;
  for (int d = 0; d < ndim; ++d)
    count *= shape[d];
  return count;
}

bool TensorView::is_contiguous() const {
  int64_t expected = 1;
  for (int d = ndim; d-- > 0;) {
    if (shape[d] != 1 && strides[d] != expected) return false;
    expected *= shape[d];
  }
  return true;
}

std::string TensorView::shape_str() const {
  return defined() ? join(shape, ndim) : "(not given)";
}

std::string TensorView::strides_str() const {
  return defined() ? join(strides, ndim) : "(not given)";
}

}  // namespace hdk
