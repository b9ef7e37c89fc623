#include "core/argument_checks.h"

#include <algorithm>

namespace hdk {
namespace detail {

MemorySpan memory_span(const TensorView& view) {
  MemorySpan span;
  if (!view.defined() || view.data == nullptr || view.numel() == 0) return span;
  int64_t low = 0;
  int64_t high = 0;
  for (int d = 0; d < view.ndim; ++d) {
    const int64_t reach = (view.shape[d] - 1) * view.strides[d];
    if (reach < 0) {
      low += reach;
    } else {
      high += reach;
    }
  }
  const auto element = static_cast<int64_t>(view.element_size());
  const auto base = reinterpret_cast<uintptr_t>(view.data);
  span.begin = base + static_cast<uintptr_t>(low * element);
  span.end = base + static_cast<uintptr_t>(high * element + element);
  return span;
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(shape[i]);
  }
  return text + "]";
}

void ArgumentChecks::fail(const std::string& message) const {
  throw Error(std::string(operation_) + ": " + message);
}

std::string ArgumentChecks::prefix(const char* name) const {
  return std::string("argument '") + name + "'";
}

void ArgumentChecks::require(const TensorView& view, const char* name, const char* why) const {
  if (!view.defined()) fail(prefix(name) + " is required " + why + ", but was not given");
}

void ArgumentChecks::forbid(const TensorView& view, const char* name, const char* why) const {
  if (view.defined()) fail(prefix(name) + " must not be given " + why);
}

void ArgumentChecks::dtype_in(const TensorView& view, const char* name,
                              std::initializer_list<DType> allowed) const {
  if (std::find(allowed.begin(), allowed.end(), view.dtype) != allowed.end()) return;
  std::string expected;
  for (DType dtype : allowed) {
    if (!expected.empty()) expected += " or ";
    expected += dtype_name(dtype);
  }
  fail(prefix(name) + " must have dtype " + expected + ", got " + dtype_name(view.dtype));
}

void ArgumentChecks::same_dtype(const TensorView& view, const char* name,
                                const TensorView& reference, const char* reference_name) const {
  if (view.dtype == reference.dtype) return;
  fail(prefix(name) + " must have the dtype of '" + reference_name + "' (" +
       dtype_name(reference.dtype) + "), got " + dtype_name(view.dtype));
}

void ArgumentChecks::rank_in(const TensorView& view, const char* name,
                             std::initializer_list<int> ranks, const char* dims_description) const {
  if (std::find(ranks.begin(), ranks.end(), view.ndim) != ranks.end()) return;
  std::string expected;
  for (int rank : ranks) {
    if (!expected.empty()) expected += " or ";
    expected += std::to_string(rank);
  }
  fail(prefix(name) + " must have rank " + expected + " (" + dims_description + "), got rank " +
       std::to_string(view.ndim) + " with shape " + view.shape_str());
}

void ArgumentChecks::shape_is(const TensorView& view, const char* name,
                              const std::vector<int64_t>& expected,
                              const char* dims_description) const {
  bool match = view.ndim == static_cast<int>(expected.size());
  for (int d = 0; match && d < view.ndim; ++d)
    match = view.shape[d] == expected[d];
  if (match) return;
  fail(prefix(name) + " must have shape " + dims_description + " = " + shape_string(expected) +
       ", got " + view.shape_str());
}

void ArgumentChecks::innermost_contiguous(const TensorView& view, const char* name) const {
  if (view.ndim == 0 || view.shape[view.ndim - 1] <= 1 || view.strides[view.ndim - 1] == 1) return;
  fail(prefix(name) + " must be contiguous in its last dimension (stride 1), got strides " +
       view.strides_str() + " for shape " + view.shape_str());
}

void ArgumentChecks::on_device(const TensorView& view, const char* name,
                               const Device& device) const {
  if (view.device == device) return;
  fail(prefix(name) + " is on " + view.device.str() + " but the other tensors are on " +
       device.str() + "; all tensors of one call must be on one device");
}

void ArgumentChecks::not_null(const TensorView& view, const char* name) const {
  if (view.data != nullptr || view.numel() == 0) return;
  fail(prefix(name) + " has a null data pointer but " + std::to_string(view.numel()) + " elements");
}

void ArgumentChecks::no_overlap(const TensorView& output, const char* output_name,
                                const TensorView& other, const char* other_name) const {
  if (!output.defined() || !other.defined()) return;
  if (!memory_span(output).overlaps(memory_span(other))) return;
  fail(prefix(output_name) + " overlaps '" + other_name +
       "' in memory; an output must not share bytes with another argument");
}

}  // namespace detail
}  // namespace hdk
