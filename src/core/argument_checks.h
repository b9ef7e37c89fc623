// Argument checks shared by every operation's validation. Each failed check throws hdk::Error
// naming the operation, the argument, what was expected and what was given.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

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
  void on_device(const TensorView& view, const char* name, const Device& device) const;
  void not_null(const TensorView& view, const char* name) const;

  // Throws when `output`'s bytes may overlap `other`'s.
  void no_overlap(const TensorView& output, const char* output_name, const TensorView& other,
                  const char* other_name) const;

 private:
  std::string prefix(const char* name) const;
  const char* operation_;
};

std::string shape_string(const std::vector<int64_t>& shape);

}  // namespace detail
}  // namespace hdk
