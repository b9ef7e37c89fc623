// torch.ops.hdk.dsv4_route and torch.ops.hdk.topk: hdk::dsv4::route and hdk::topk as torch custom
// ops. Both write their outputs in place and return nothing, as their schemas declare, so
// torch.compile functionalizes them and CUDA graphs can capture them (no allocation, no
// synchronization). hdk.route() (hdk.dsv4.route) and hdk.topk() are the Python APIs; they allocate
// the outputs (and the router's logits workspace) with torch's allocator.
// torch.ops.hdk.dsv4_route_workspace_slabs is hdk::dsv4::route_workspace_slabs.
#include <torch/library.h>

#include "hdk/dsv4/router.h"
#include "hdk/topk.h"
#include "torch_glue.h"

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

// One body for the CPU, CUDA and Meta dispatch keys. The Meta kernel runs nothing (every output
// already exists with its final shape, which is all tracing needs to know), once CallViews has
// seen every tensor on meta.
template <bool kMeta>
void dsv4_route(const OptionalTensor& logits, const OptionalTensor& hidden,
                const OptionalTensor& gate_weight, const OptionalTensor& bias,
                const OptionalTensor& token_ids, const OptionalTensor& tid2eid,
                const at::Tensor& topk_ids, const at::Tensor& topk_weights,
                const OptionalTensor& logits_workspace, const OptionalTensor& invalid_count,
                int64_t top_k, double route_scale) {
  CallViews views("hdk::dsv4::route", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::RouterParams params;
    params.logits = views(logits, "logits");
    params.hidden = views(hidden, "hidden");
    params.gate_weight = views(gate_weight, "gate_weight");
    params.bias = views(bias, "bias");
    params.token_ids = views(token_ids, "token_ids");
    params.tid2eid = views(tid2eid, "tid2eid");
    params.topk_ids = views(topk_ids, "topk_ids");
    params.topk_weights = views(topk_weights, "topk_weights");
    params.logits_workspace = views(logits_workspace, "logits_workspace");
    params.invalid_count = views(invalid_count, "invalid_count");
    params.top_k = top_k;
    params.route_scale = static_cast<float>(route_scale);
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(topk_ids);
    hdk::dsv4::route(params, current_stream(topk_ids));
  });
}

template <bool kMeta>
void topk(const at::Tensor& values, int64_t k, const at::Tensor& out_values,
          const at::Tensor& out_indices, const OptionalTensor& row_lengths) {
  CallViews views("hdk::topk", kMeta);
  call_hdk(views, [&] {
    const hdk::TensorView values_view = views(values, "values");
    const hdk::TensorView out_values_view = views(out_values, "out_values");
    const hdk::TensorView out_indices_view = views(out_indices, "out_indices");
    const hdk::TensorView lengths = views(row_lengths, "row_lengths");
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(values);
    hdk::topk(values_view, k, out_values_view, out_indices_view, lengths, current_stream(values));
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
