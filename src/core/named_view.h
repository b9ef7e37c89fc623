// An argument of a call with the name its messages give it, for checks that go over several of a
// call's tensors (devices, aliasing).
#pragma once

#include <cstddef>

#include "hdk/tensor_view.h"

namespace hdk {
namespace detail {

struct NamedView {
  const TensorView* view;
  const char* name;
};

// A run of NamedViews (a braced list's or an array's) for the checks over several arguments;
// it refers to the views, it does not copy them.
struct NamedViews {
  const NamedView* first;
  size_t count;
  const NamedView* begin() const { return first; }
  const NamedView* end() const { return first + count; }
};

}  // namespace detail
}  // namespace hdk
