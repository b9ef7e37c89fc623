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

// What a view of a dtype hdk has no name for carries: a value outside hdk::DType's names, which
// every operation's dtype check refuses with the dtypes the argument accepts.
constexpr auto kUnnamedDType = static_cast<hdk::DType>(0xff);

hdk::DType to_dtype(const at::Tensor& tensor) {
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
      return kUnnamedDType;
  }
}

hdk::Device to_device(const at::Tensor& tensor, const char* name) {
  const c10::Device device = tensor.device();
  if (device.is_cpu()) return hdk::Device::cpu();
  if (device.is_cuda()) return hdk::Device::cuda(device.has_index() ? device.index() : 0);
  throw hdk::Error(argument(name) + " is on " + device.str() +
                   "; hdk runs on cpu and cuda tensors");
}

hdk::TensorView to_view(const at::Tensor& tensor, const char* name) {
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
  view.device = to_device(tensor, name);
  view.data = tensor.data_ptr();
  view.dtype = to_dtype(tensor);
  view.ndim = static_cast<int>(rank);
  for (int64_t d = 0; d < rank; ++d) {
    view.shape[d] = tensor.size(d);
    view.strides[d] = tensor.stride(d);
  }
  return view;
}

}  // namespace

hdk::TensorView CallViews::operator()(const at::Tensor& tensor, const char* name) {
  if (!tensor.defined()) return hdk::TensorView();
  const bool unnamed = to_dtype(tensor) == kUnnamedDType;
  given_.push_back({name, tensor.device(), unnamed ? dtype_name(tensor) : std::string()});
  // A Meta kernel runs nothing and meta tensors have no memory: tracing() decides.
  if (meta_kernel_) return hdk::TensorView();
  return to_view(tensor, name);
}

hdk::TensorView CallViews::operator()(const OptionalTensor& tensor, const char* name) {
  if (!tensor.has_value()) return hdk::TensorView();
  return (*this)(*tensor, name);
}

bool CallViews::tracing() const {
  if (!meta_kernel_) return false;
  std::vector<const Given*> on_meta;
  std::vector<const Given*> elsewhere;
  for (const Given& given : given_)
    (given.device.is_meta() ? on_meta : elsewhere).push_back(&given);
  if (elsewhere.empty()) return true;
  // Name the smaller group, as hdk's own device check names the tensors off the majority's
  // device; on a tie the group without the call's first tensor.
  const bool name_meta = on_meta.size() < elsewhere.size() ||
                         (on_meta.size() == elsewhere.size() && !given_.front().device.is_meta());
  const std::vector<const Given*>& odd = name_meta ? on_meta : elsewhere;
  const std::vector<const Given*>& rest = name_meta ? elsewhere : on_meta;
  std::string others;
  for (const Given* given : rest) {
    if (!others.empty()) others += ", ";
    others += given->name;
  }
  std::string message = std::string(operation_) + ": argument '" + odd.front()->name + "' is on " +
                        odd.front()->device.str() + " but " + others +
                        (rest.size() == 1 ? " is" : " are") + " on " + rest.front()->device.str();
  for (size_t i = 1; i < odd.size(); ++i) {
    message +=
        std::string(i == 1 ? " ('" : ", '") + odd[i]->name + "' is on " + odd[i]->device.str();
  }
  if (odd.size() > 1) message += ")";
  throw hdk::Error(message +
                   "; all tensors of one call must be on one device (meta tensors only trace: "
                   "hdk runs cpu and cuda tensors)");
}

std::string CallViews::explain(const std::string& message) const {
  const std::string unnamed = std::string("got ") + hdk::dtype_name(kUnnamedDType);
  if (message.size() < unnamed.size() ||
      message.compare(message.size() - unnamed.size(), unnamed.size(), unnamed) != 0) {
    return message;
  }
  for (const Given& given : given_) {
    if (given.dtype.empty()) continue;
    if (message.find(std::string("argument '") + given.name + "'") == std::string::npos) continue;
    return message.substr(0, message.size() - unnamed.size()) + "got " + given.dtype;
  }
  return message;
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

hdk::dsv4::KeyFormat key_format(int64_t value, const char* operation, const char* name) {
  switch (value) {
    case 0:
      return hdk::dsv4::KeyFormat::kMXFP4;
    case 1:
      return hdk::dsv4::KeyFormat::kNVFP4;
    case 2:
      return hdk::dsv4::KeyFormat::kFP8;
    default:
      throw hdk::Error(std::string(operation) + ": option '" + name +
                       "' must be 0 (mxfp4), 1 (nvfp4) or 2 (fp8), got " + std::to_string(value));
  }
}

void throw_value_error(const std::string& message) {
  TORCH_CHECK_VALUE(false, message);
  // TORCH_CHECK_VALUE(false, ...) always throws; this keeps [[noreturn]] honest for compilers
  // that cannot see through the macro.
  throw hdk::Error(message);
}

}  // namespace hdk_python
