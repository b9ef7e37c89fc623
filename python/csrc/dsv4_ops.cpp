// torch.ops.hdk.dsv4_route and torch.ops.hdk.topk: hdk::dsv4::route and hdk::topk as torch custom
// ops. Both write their outputs in place and return nothing, as their schemas declare, so
// torch.compile functionalizes them and CUDA graphs can capture them (no allocation, no
// synchronization). hdk.dsv4.route() and hdk.topk.topk() are the Python APIs; they allocate the
// outputs (and the router's logits workspace) with torch's allocator.
// torch.ops.hdk.dsv4_route_workspace_slabs is hdk::dsv4::route_workspace_slabs.
#include <torch/library.h>

#include "hdk/dsv4/router.h"
#include "hdk/topk.h"
#include "torch_glue.h"

#ifdef HDK_PYTHON_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace hdk_python {
namespace {

// Argument names match hdk::dsv4::RouterParams.
constexpr const char* kRouteSchema =
    "dsv4_route(Tensor? logits, Tensor? hidden, Tensor? gate_weight, Tensor? bias, "
    "Tensor? token_ids, Tensor? tid2eid, Tensor(a!) topk_ids, Tensor(b!) topk_weights, "
    "Tensor(c!)? logits_workspace, Tensor(d!)? invalid_count, int top_k, float route_scale) -> ()";

constexpr const char* kTopkSchema =
    "topk(Tensor values, int k, Tensor(a!) out_values, Tensor(b!) out_indices, "
    "Tensor? row_lengths) -> ()";

// The device a call's CUDA work belongs on: torch code expects the tensors' device, hdk launches
// on the current one.
#ifdef HDK_PYTHON_WITH_CUDA
#define HDK_PYTHON_DEVICE_GUARD(tensor)      \
  c10::cuda::OptionalCUDAGuard device_guard; \
  if ((tensor).is_cuda()) device_guard.set_device((tensor).device())
#else
#define HDK_PYTHON_DEVICE_GUARD(tensor) (void)(tensor)
#endif

// One body for the CPU, CUDA and Meta dispatch keys. The Meta kernel does nothing: every output
// already exists with its final shape, which is all tracing needs to know.
template <bool kMeta>
void dsv4_route(const OptionalTensor& logits, const OptionalTensor& hidden,
                const OptionalTensor& gate_weight, const OptionalTensor& bias,
                const OptionalTensor& token_ids, const OptionalTensor& tid2eid,
                const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                const OptionalTensor& logits_workspace, const OptionalTensor& invalid_count,
                int64_t top_k, double route_scale) {
  if constexpr (kMeta) return;
  call_hdk([&] {
    hdk::dsv4::RouterParams params;
    params.logits = to_view(logits, "logits");
    params.hidden = to_view(hidden, "hidden");
    params.gate_weight = to_view(gate_weight, "gate_weight");
    params.bias = to_view(bias, "bias");
    params.token_ids = to_view(token_ids, "token_ids");
    params.tid2eid = to_view(tid2eid, "tid2eid");
    params.topk_ids = to_view(topk_ids, "topk_ids");
    params.topk_weights = to_view(topk_weights, "topk_weights");
    params.logits_workspace = to_view(logits_workspace, "logits_workspace");
    params.invalid_count = to_view(invalid_count, "invalid_count");
    params.top_k = top_k;
    params.route_scale = static_cast<float>(route_scale);
    HDK_PYTHON_DEVICE_GUARD(topk_ids);
    hdk::dsv4::route(params, current_stream(topk_ids));
  });
}

template <bool kMeta>
void topk(const at::Tensor& values, int64_t k, const at::Tensor& out_values,
          const at::Tensor& out_indices, const OptionalTensor& row_lengths) {
  if constexpr (kMeta) return;
  call_hdk([&] {
    const hdk::TensorView lengths = to_view(row_lengths, "row_lengths");
    HDK_PYTHON_DEVICE_GUARD(values);
    hdk::topk(to_view(values, "values"), k, to_view(out_values, "out_values"),
              to_view(out_indices, "out_indices"), lengths, current_stream(values));
  });
}

}  // namespace
}  // namespace hdk_python

TORCH_LIBRARY_FRAGMENT(hdk, m) {
  m.def(hdk_python::kRouteSchema);
  // No tensor arguments, so one kernel for every backend.
  m.def("dsv4_route_workspace_slabs(int num_tokens) -> int",
        [](int64_t num_tokens) { return hdk::dsv4::route_workspace_slabs(num_tokens); });
  m.def(hdk_python::kTopkSchema);
}

TORCH_LIBRARY_IMPL(hdk, CPU, m) {
  m.impl("dsv4_route", &hdk_python::dsv4_route<false>);
  m.impl("topk", &hdk_python::topk<false>);
}

// Registered even without CUDA support, so CUDA tensors get hdk's message about the build
// rather than the dispatcher's "could not run with arguments from the 'CUDA' backend".
TORCH_LIBRARY_IMPL(hdk, CUDA, m) {
  m.impl("dsv4_route", &hdk_python::dsv4_route<false>);
  m.impl("topk", &hdk_python::topk<false>);
}

TORCH_LIBRARY_IMPL(hdk, Meta, m) {
  m.impl("dsv4_route", &hdk_python::dsv4_route<true>);
  m.impl("topk", &hdk_python::topk<true>);
}

#if TORCH_VERSION_MAJOR < 2
// torch 1.x has no autograd fallback for meta tensors (see gdn_ops.cpp).
TORCH_LIBRARY_IMPL(hdk, AutogradMeta, m) {
  m.impl("dsv4_route", torch::CppFunction::makeFallthrough());
  m.impl("topk", torch::CppFunction::makeFallthrough());
}
#endif
