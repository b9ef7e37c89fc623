// An argument of a call with the name its messages give it, for checks that go over several of a
// call's tensors (devices, aliasing).
#pragma once

#include "hdk/tensor_view.h"

namespace hdk {
namespace detail {

struct NamedView {
  const TensorView* view;
  const char* name;
};

}  // namespace detail
}  // namespace hdk
