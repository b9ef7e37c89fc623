// The glue every torch binding of hdk shares: at::Tensor -> hdk::TensorView, the stream a CUDA
// call runs on, and the conversion of hdk::Error into an exception Python shows as a plain
// message. A new binding file (python/csrc/<area>_ops.cpp) includes this header and registers
// its ops with TORCH_LIBRARY_FRAGMENT(hdk, m); gdn_ops.cpp owns the TORCH_LIBRARY(hdk, m) block.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/version.h>

#include <optional>
#include <string>
#include <vector>

#include "hdk/cuda_stream.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "hdk/tensor_view.h"

#ifdef HDK_PYTHON_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
// hdk launches on the device that is current; torch code expects the tensors' device.
#define HDK_PYTHON_DEVICE_GUARD(tensor)      \
  c10::cuda::OptionalCUDAGuard device_guard; \
  if ((tensor).is_cuda()) device_guard.set_device((tensor).device())
#else
#define HDK_PYTHON_DEVICE_GUARD(tensor) (void)(tensor)
#endif

namespace hdk_python {

// The dispatcher passes `Tensor?` arguments as std::optional from torch 2.4 on and as
// c10::optional (a distinct class) before; kernels must name the exact type.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
using OptionalTensor = std::optional<at::Tensor>;
#else
using OptionalTensor = c10::optional<at::Tensor>;
#endif

// The tensors of one call as hdk views: `views(tensor, "name")` gives the view hdk reads (a
// default one, "not given", for an absent optional tensor). A tensor hdk cannot describe (a
// device other than cpu and cuda, more than TensorView::kMaxDims dims, a sparse or negated
// tensor) is an hdk::Error naming it. A dtype hdk has no name for passes as a view of an unnamed
// dtype, so the operation's own check names the dtypes that argument accepts; explain() puts the
// torch name of the dtype into that message.
//
// The Meta kernel (what torch.compile and fake tensors trace with) is what torch dispatches to
// when any tensor of a call is on the meta device, and it runs nothing. So in a Meta kernel every
// tensor must be on meta: tracing() is true then, and it throws hdk::Error naming the odd
// tensors out otherwise (a call mixing meta with real tensors would leave its outputs unwritten).
class CallViews {
 public:
  CallViews(const char* operation, bool meta_kernel)
      : operation_(operation), meta_kernel_(meta_kernel) {}

  hdk::TensorView operator()(const at::Tensor& tensor, const char* name);
  hdk::TensorView operator()(const OptionalTensor& tensor, const char* name);

  // True in a Meta kernel whose tensors are all on meta (nothing to run); false outside one.
  bool tracing() const;

  // `message` with "got <hdk's name for an unnamed dtype>" replaced by the torch dtype of the
  // argument the message names.
  std::string explain(const std::string& message) const;

 private:
  struct Given {
    const char* name;
    c10::Device device;
    std::string dtype;  // torch's name, for dtypes hdk has no name for; else empty
  };
  const char* operation_;
  bool meta_kernel_;
  std::vector<Given> given_;
};

// The stream torch would run work on for `tensor`: the current CUDA stream of its device, or
// nullptr for CPU tensors. Throws hdk::Error for CUDA tensors when this build of the extension
// has no CUDA support.
hdk::CudaStream current_stream(const at::Tensor& tensor);

// True when the extension was compiled with torch's CUDA headers (HDK_PYTHON_WITH_CUDA).
bool extension_has_cuda();

// The indexer key format an op's int option names: 0 kMXFP4, 1 kNVFP4, 2 kFP8 (the values of
// hdk.dsv4.KEY_FORMATS). Any other value is an hdk::Error naming `operation` and the option
// `name`, so call it inside call_hdk.
hdk::dsv4::KeyFormat key_format(int64_t value, const char* operation, const char* name);

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

// The same for a body that reads tensors through `views`, whose dtype names it completes.
template <typename Body>
void call_hdk(const CallViews& views, Body&& body) {
  try {
    body();
  } catch (const hdk::Error& error) {
    throw_value_error(views.explain(error.what()));
  }
}

}  // namespace hdk_python
