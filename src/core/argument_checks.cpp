#include "core/argument_checks.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

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

void ArgumentChecks::not_null(const TensorView& view, const char* name) const {
  if (view.data != nullptr || view.numel() == 0) return;
  fail(prefix(name) + " has a null data pointer but " + std::to_string(view.numel()) + " elements");
}

namespace {

// "a, b, c": the names of `views` for messages.
std::string name_list(const std::vector<const NamedView*>& views) {
  std::string text;
  for (const NamedView* named : views) {
    if (!text.empty()) text += ", ";
    text += named->name;
  }
  return text;
}

}  // namespace

void ArgumentChecks::same_device(NamedViews inputs, NamedViews outputs) const {
  std::vector<const NamedView*> given;
  for (const auto& list : {inputs, outputs}) {
    for (const NamedView& named : list) {
      if (named.view->defined()) given.push_back(&named);
    }
  }
  // The reference device: the one most views are on; the earliest such device on a tie.
  Device reference = given.empty() ? Device::cpu() : given.front()->view->device;
  size_t reference_count = 0;
  for (const NamedView* candidate : given) {
    const Device device = candidate->view->device;
    const auto count =
        static_cast<size_t>(std::count_if(given.begin(), given.end(), [&](const NamedView* named) {
          return named->view->device == device;
        }));
    if (count > reference_count) {
      reference = device;
      reference_count = count;
    }
  }
  std::vector<const NamedView*> on_reference;
  std::vector<const NamedView*> elsewhere;
  for (const NamedView* named : given) {
    (named->view->device == reference ? on_reference : elsewhere).push_back(named);
  }
  if (!elsewhere.empty()) {
    const NamedView& odd = *elsewhere.front();
    std::string message = prefix(odd.name) + " is on " + odd.view->device.str() + " but " +
                          name_list(on_reference) + (on_reference.size() == 1 ? " is" : " are") +
                          " on " + reference.str();
    for (size_t i = 1; i < elsewhere.size(); ++i) {
      message += std::string(i == 1 ? " (" : ", ") + "'" + elsewhere[i]->name + "' is on " +
                 elsewhere[i]->view->device.str();
    }
    if (elsewhere.size() > 1) message += ")";
    fail(message + "; all tensors of one call must be on one device");
  }
  for (const NamedView* named : given)
    not_null(*named->view, named->name);
}

void ArgumentChecks::disjoint_outputs(NamedViews outputs, NamedViews inputs) const {
  for (const auto& list : {outputs, inputs}) {
    for (const NamedView& named : list) {
      if (named.view->defined() && named.view->element_size() == 0) {
        fail(prefix(named.name) + " has a dtype hdk cannot read, got " +
             dtype_name(named.view->dtype));
      }
    }
  }
  for (auto out = outputs.begin(); out != outputs.end(); ++out) {
    no_self_overlap(*out->view, out->name);
    for (const NamedView& input : inputs)
      no_overlap(*out->view, out->name, *input.view, input.name);
    for (auto other = out + 1; other != outputs.end(); ++other)
      no_overlap(*out->view, out->name, *other->view, other->name);
  }
}

void ArgumentChecks::no_self_overlap(const TensorView& output, const char* name) const {
  if (!output.defined() || output.numel() == 0) return;
  // (|stride|, extent) of the dims that hold more than one index.
  std::vector<std::pair<int64_t, int64_t>> dims;
  for (int d = 0; d < output.ndim; ++d) {
    if (output.shape[d] <= 1) continue;
    if (output.strides[d] == 0) {
      fail(prefix(name) + " has stride 0 in dim " + std::to_string(d) + " (extent " +
           std::to_string(output.shape[d]) + "; shape " + output.shape_str() + ", strides " +
           output.strides_str() +
           "), so its indices along that dim write one element; every element of an output "
           "needs its own memory (an expand()ed tensor cannot be an output)");
    }
    dims.emplace_back(std::llabs(output.strides[d]), output.shape[d]);
  }
  std::sort(dims.begin(), dims.end());
  // Sorted by stride, each dim must step past every element the smaller dims reach.
  int64_t reach = 0;
  for (const auto& [stride, extent] : dims) {
    if (stride <= reach) {
      fail(prefix(name) + " has strides " + output.strides_str() + " for shape " +
           output.shape_str() +
           ", so distinct indices may reach one element; every element of an output needs its "
           "own memory (each stride larger than what the smaller strides reach)");
    }
    reach += (extent - 1) * stride;
  }
}

void ArgumentChecks::no_overlap(const TensorView& output, const char* output_name,
                                const TensorView& other, const char* other_name) const {
  if (!output.defined() || !other.defined()) return;
  if (!memory_span(output).overlaps(memory_span(other))) return;
  fail(prefix(output_name) + " overlaps '" + other_name +
       "' in memory; an output must not share bytes with another argument");
}

void ArgumentChecks::no_overlap(const char* output_call, const NamedView& output,
                                const char* other_call, const NamedView& other) const {
  if (!output.view->defined() || !other.view->defined()) return;
  if (!memory_span(*output.view).overlaps(memory_span(*other.view))) return;
  const std::string output_name = std::string(output_call) + "'s " + output.name;
  const std::string other_name = std::string(other_call) + "'s " + other.name;
  no_overlap(*output.view, output_name.c_str(), *other.view, other_name.c_str());
}

void throw_no_cuda_backend(const char* operation, const Device& device) {
  throw Error(std::string(operation) + ": the tensors are on " + device.str() +
              " but this build of hdk has no CUDA backend (configure with -DHDK_WITH_CUDA=ON)");
}

}  // namespace detail
}  // namespace hdk
