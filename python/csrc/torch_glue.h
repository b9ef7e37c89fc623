// The glue every torch binding of hdk shares: at::Tensor -> hdk::TensorView, the stream a CUDA
// call runs on, and the conversion of hdk::Error into an exception Python shows as a plain
// message. A new binding file (python/csrc/<area>_ops.cpp) includes this header and registers
// its ops with TORCH_LIBRARY_FRAGMENT(hdk, m); gdn_ops.cpp owns the TORCH_LIBRARY(hdk, m) block.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/version.h>

#include <optional>
#include <string>

#include "hdk/cuda_stream.h"
#include "hdk/error.h"
#include "hdk/tensor_view.h"

namespace hdk_python {

// The dispatcher passes `Tensor?` arguments as std::optional from torch 2.4 on and as
// c10::optional (a distinct class) before; kernels must name the exact type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
using OptionalTensor = std::optional<at::Tensor>;
#else
using OptionalTensor = c10::optional<at::Tensor>;
#endif

// A view of `tensor` (data pointer including the storage offset, dtype, device, shape and
// strides in elements). Throws hdk::Error naming `name` for what hdk cannot describe: an
// unsupported dtype or device, more than TensorView::kMaxDims dims, a sparse or negated tensor.
hdk::TensorView to_view(const at::Tensor& tensor, const char* name);

// An absent (or undefined) optional tensor gives a default TensorView, which hdk reads as
// "not given".
hdk::TensorView to_view(const OptionalTensor& tensor, const char* name);

// The stream torch would run work on for `tensor`: the current CUDA stream of its device, or
// nullptr for CPU tensors. Throws hdk::Error for CUDA tensors when this build of the extension
// has no CUDA support.
hdk::CudaStream current_stream(const at::Tensor& tensor);

// True when the extension was compiled with torch's CUDA headers (HDK_PYTHON_WITH_CUDA).
bool extension_has_cuda();

// Throws c10::ValueError with `message` and nothing else: torch shows c10 errors to Python
// without their C++ backtrace, and hdk's Python layer re-raises messages that start with
// "hdk" as hdk.HdkError.
[[noreturn]] void throw_value_error(const std::string& message);

// Runs `body`; an hdk::Error it throws reaches Python as a ValueError carrying hdk's message.
template <typename Body>
void call_hdk(Body&& body) {
  try {
    body();
  } catch (const hdk::Error& error) {
    throw_value_error(error.what());
  }
}

}  // namespace hdk_python
