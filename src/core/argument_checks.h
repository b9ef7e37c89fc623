// Argument checks shared by every operation's validation. Each failed check throws hdk::Error
// naming the operation, the argument, what was expected and what was given.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "core/named_view.h"
#include "hdk/error.h"
#include "hdk/tensor_view.h"

namespace hdk {
namespace detail {

// Byte range [begin, end) that a view can touch; empty views give begin == end.
struct MemorySpan {
  uintptr_t begin = 0;
  uintptr_t end = 0;
  bool overlaps(const MemorySpan& other) const { return begin < other.end && other.begin < end; }
};

MemorySpan memory_span(const TensorView& view);

// The error every entry point gives for tensors on `device` (not the CPU) in a build of hdk
// without the CUDA backend.
[[noreturn]] void throw_no_cuda_backend(const char* operation, const Device& device);

class ArgumentChecks {
 public:
  explicit ArgumentChecks(const char* operation) : operation_(operation) {}

  [[noreturn]] void fail(const std::string& message) const;

  void require(const TensorView& view, const char* name, const char* why) const;
  void forbid(const TensorView& view, const char* name, const char* why) const;

  void dtype_in(const TensorView& view, const char* name,
                std::initializer_list<DType> allowed) const;
  void same_dtype(const TensorView& view, const char* name, const TensorView& reference,
                  const char* reference_name) const;

  void rank_in(const TensorView& view, const char* name, std::initializer_list<int> ranks,
               const char* dims_description) const;

  // Full shape check; `dims_description` names the dims, e.g. "[B, T, H, K]".
  void shape_is(const TensorView& view, const char* name, const std::vector<int64_t>& expected,
                const char* dims_description) const;

  void innermost_contiguous(const TensorView& view, const char* name) const;
  void not_null(const TensorView& view, const char* name) const;

  // Every given view of the call (what it reads, then what it writes) on one device, each with a
  // usable data pointer. A view off the device most of them are on is named with that device and
  // the views on it; on a tie the device of the first given view is the reference, so list the
  // call's leading tensor first.
  void same_device(std::initializer_list<NamedView> inputs,
                   std::initializer_list<NamedView> outputs) const {
    same_device(NamedViews{inputs.begin(), inputs.size()},
                NamedViews{outputs.begin(), outputs.size()});
  }
  // The same for lists a validation builds once and checks more than once.
  template <size_t kInputs, size_t kOutputs>
  void same_device(const std::array<NamedView, kInputs>& inputs,
                   const std::array<NamedView, kOutputs>& outputs) const {
    same_device(NamedViews{inputs.data(), kInputs}, NamedViews{outputs.data(), kOutputs});
  }

  // What a call writes: no output maps two of its indices to one element (its rows would
  // overwrite each other), and none shares bytes with another output or with an input. Also
  // refuses a view of a dtype hdk has no name for, so such a view never reaches a backend.
  void disjoint_outputs(std::initializer_list<NamedView> outputs,
                        std::initializer_list<NamedView> inputs) const {
    disjoint_outputs(NamedViews{outputs.begin(), outputs.size()},
                     NamedViews{inputs.begin(), inputs.size()});
  }
  template <size_t kOutputs, size_t kInputs>
  void disjoint_outputs(const std::array<NamedView, kOutputs>& outputs,
                        const std::array<NamedView, kInputs>& inputs) const {
    disjoint_outputs(NamedViews{outputs.data(), kOutputs}, NamedViews{inputs.data(), kInputs});
  }

  // Throws when two distinct indices of `output` may reach one element: a stride of 0 on a dim
  // of extent > 1, or dims that interleave (a stride within the reach of the smaller strides).
  void no_self_overlap(const TensorView& output, const char* name) const;

  // Throws when `output`'s bytes may overlap `other`'s.
  void no_overlap(const TensorView& output, const char* output_name, const TensorView& other,
                  const char* other_name) const;
  // The same for arguments of two calls of one launch, named "<call>'s <argument>" in the message
  // (composed only when it throws).
  void no_overlap(const char* output_call, const NamedView& output, const char* other_call,
                  const NamedView& other) const;

 private:
  void same_device(NamedViews inputs, NamedViews outputs) const;
  void disjoint_outputs(NamedViews outputs, NamedViews inputs) const;
  std::string prefix(const char* name) const;
  const char* operation_;
};

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace detail
}  // namespace hdk
