#include "torch_glue.h"

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <string>

#ifdef HDK_PYTHON_WITH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace hdk_python {
namespace {

std::string argument(const char* name) {
  return std::string("hdk: argument '") + name + "'";
}

// Python's names for the dtypes users are most likely to pass by mistake; C++'s otherwise.
std::string dtype_name(const at::Tensor& tensor) {
  switch (tensor.scalar_type()) {
    case at::ScalarType::Double:
      return "float64";
    case at::ScalarType::Bool:
      return "bool";
    case at::ScalarType::Char:
      return "int8";
    case at::ScalarType::Short:
      return "int16";
    case at::ScalarType::ComplexFloat:
      return "complex64";
    case at::ScalarType::ComplexDouble:
      return "complex128";
    default: {
      const auto name = tensor.dtype().name();
      return std::string(name.data(), name.size());
    }
  }
}

hdk::DType to_dtype(const at::Tensor& tensor, const char* name) {
  switch (tensor.scalar_type()) {
    case at::ScalarType::Float:
      return hdk::DType::kFloat32;
    case at::ScalarType::Half:
      return hdk::DType::kFloat16;
    case at::ScalarType::BFloat16:
      return hdk::DType::kBFloat16;
    case at::ScalarType::Int:
      return hdk::DType::kInt32;
    case at::ScalarType::Long:
      return hdk::DType::kInt64;
    case at::ScalarType::Byte:
      return hdk::DType::kUInt8;
    default:
      throw hdk::Error(argument(name) + " has dtype " + dtype_name(tensor) +
                       ", which hdk cannot read (float32, float16, bfloat16, int32, int64, uint8)");
  }
}

hdk::Device to_device(const at::Tensor& tensor, const char* name) {
  const c10::Device device = tensor.device();
  if (device.is_cpu()) return hdk::Device::cpu();
  if (device.is_cuda()) return hdk::Device::cuda(device.has_index() ? device.index() : 0);
  throw hdk::Error(argument(name) + " is on " + device.str() +
                   "; hdk runs on cpu and cuda tensors");
}

}  // namespace

hdk::TensorView to_view(const at::Tensor& tensor, const char* name) {
  if (!tensor.defined()) return hdk::TensorView();
  if (tensor.layout() != c10::kStrided) {
    throw hdk::Error(argument(name) + " is a sparse or otherwise non-strided tensor; hdk needs " +
                     "a strided (dense) tensor");
  }
  // A negated view keeps the un-negated values in memory; reading it raw would flip the sign.
  if (tensor.is_neg()) {
    throw hdk::Error(argument(name) + " is a lazily negated view; call .resolve_neg() first");
  }
  const int64_t rank = tensor.dim();
  if (rank > hdk::TensorView::kMaxDims) {
    throw hdk::Error(argument(name) + " has " + std::to_string(rank) + " dims; hdk views hold " +
                     "at most " + std::to_string(hdk::TensorView::kMaxDims));
  }
  hdk::TensorView view;
  view.data = tensor.data_ptr();
  view.dtype = to_dtype(tensor, name);
  view.device = to_device(tensor, name);
  view.ndim = static_cast<int>(rank);
  for (int64_t d = 0; d < rank; ++d) {
    view.shape[d] = tensor.size(d);
    view.strides[d] = tensor.stride(d);
  }
  return view;
}

hdk::TensorView to_view(const OptionalTensor& tensor, const char* name) {
  if (!tensor.has_value()) return hdk::TensorView();
  return to_view(*tensor, name);
}

hdk::CudaStream current_stream(const at::Tensor& tensor) {
  if (!tensor.is_cuda()) return nullptr;
#ifdef HDK_PYTHON_WITH_CUDA
  return c10::cuda::getCurrentCUDAStream(tensor.device().index()).stream();
#else
  throw hdk::Error(
      "hdk: the tensors are on " + tensor.device().str() +
      " but this build of the hdk torch extension has no CUDA support (it was built against a "
      "CPU-only torch, or with HDK_PYTHON_CUDA=0)");
#endif
}

bool extension_has_cuda() {
#ifdef HDK_PYTHON_WITH_CUDA
  return true;
#else
  return false;
#endif
}

void throw_value_error(const std::string& message) {
  TORCH_CHECK_VALUE(false, message);
  // TORCH_CHECK_VALUE(false, ...) always throws; this keeps [[noreturn]] honest for compilers
  // that cannot see through the macro.
  throw hdk::Error(message);
}

}  // namespace hdk_python
