// torch.ops.hdk.gdn_decode: hdk::gdn::decode as a torch custom op. The op writes `state`,
// `intermediate_states`, `out`, `invalid_index_count` and `nonfinite_head_count` in place and
// returns nothing, as its schema declares, so torch.compile functionalizes it and CUDA graphs can
// capture it (no allocation, no synchronization unless check_indices). hdk.gdn_decode() is the
// Python API.
//
// This file owns the TORCH_LIBRARY(hdk, m) block: other binding files add their ops to the
// namespace with TORCH_LIBRARY_FRAGMENT(hdk, m).
#include <torch/library.h>

#include <string>

#include "hdk/gdn/decode.h"
#include "torch_glue.h"

namespace hdk_python {
namespace {

// Argument names and order match hdk::gdn::DecodeParams; `layout` is 0 (kVK) or 1 (kKV).
constexpr const char* kGdnDecodeSchema =
    "gdn_decode(Tensor q, Tensor k, Tensor v, Tensor(a!) state, Tensor? A_log, Tensor? a, "
    "Tensor? dt_bias, Tensor? b, Tensor? g, Tensor? beta, Tensor? state_indices, "
    "Tensor? output_state_indices, Tensor? num_accepted_tokens, Tensor? cu_seqlens, "
    "Tensor(b!)? intermediate_states, Tensor(c!) out, Tensor(d!)? invalid_index_count, "
    "Tensor(e!)? nonfinite_head_count, "
    "int layout, float scale, bool use_qk_l2norm, float l2norm_eps, float softplus_beta, "
    "float softplus_threshold, bool update_state, int max_tokens_per_request, "
    "bool check_indices) -> ()";

hdk::gdn::StateLayout to_layout(int64_t layout) {
  if (layout == 0) return hdk::gdn::StateLayout::kVK;
  if (layout == 1) return hdk::gdn::StateLayout::kKV;
  throw hdk::Error("hdk::gdn::decode: option 'layout' must be 0 (\"vk\") or 1 (\"kv\"), got " +
                   std::to_string(layout));
}

// One body for the CPU, CUDA and Meta dispatch keys (the signature has to match the schema
// three times otherwise). The Meta kernel runs nothing (every output already exists and keeps its
// shape, which is all that tracing, torch.compile and fake tensors, needs to know), once CallViews
// has seen every tensor on meta.
template <bool kMeta>
void gdn_decode(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                const at::Tensor& state, const OptionalTensor& A_log, const OptionalTensor& a,
                const OptionalTensor& dt_bias, const OptionalTensor& b, const OptionalTensor& g,
                const OptionalTensor& beta, const OptionalTensor& state_indices,
                const OptionalTensor& output_state_indices,
                const OptionalTensor& num_accepted_tokens, const OptionalTensor& cu_seqlens,
                const OptionalTensor& intermediate_states, const at::Tensor& out,
                const OptionalTensor& invalid_index_count,
                const OptionalTensor& nonfinite_head_count, int64_t layout, double scale,
                bool use_qk_l2norm, double l2norm_eps, double softplus_beta,
                double softplus_threshold, bool update_state, int64_t max_tokens_per_request,
                bool check_indices) {
  CallViews views("hdk::gdn::decode", kMeta);
  call_hdk(views, [&] {
    hdk::gdn::DecodeParams params;
    params.q = views(q, "q");
    params.k = views(k, "k");
    params.v = views(v, "v");
    params.A_log = views(A_log, "A_log");
    params.a = views(a, "a");
    params.dt_bias = views(dt_bias, "dt_bias");
    params.b = views(b, "b");
    params.g = views(g, "g");
    params.beta = views(beta, "beta");
    params.state = views(state, "state");
    params.state_indices = views(state_indices, "state_indices");
    params.output_state_indices = views(output_state_indices, "output_state_indices");
    params.num_accepted_tokens = views(num_accepted_tokens, "num_accepted_tokens");
    params.cu_seqlens = views(cu_seqlens, "cu_seqlens");
    params.intermediate_states = views(intermediate_states, "intermediate_states");
    params.out = views(out, "out");
    params.invalid_index_count = views(invalid_index_count, "invalid_index_count");
    params.nonfinite_head_count = views(nonfinite_head_count, "nonfinite_head_count");
    params.layout = to_layout(layout);
    params.scale = static_cast<float>(scale);
    params.use_qk_l2norm = use_qk_l2norm;
    params.l2norm_eps = static_cast<float>(l2norm_eps);
    params.softplus_beta = static_cast<float>(softplus_beta);
    params.softplus_threshold = static_cast<float>(softplus_threshold);
    params.update_state = update_state;
    params.max_tokens_per_request = max_tokens_per_request;
    params.check_indices = check_indices;
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(q);
    hdk::gdn::decode(params, current_stream(q));
  });
}

}  // namespace
}  // namespace hdk_python

TORCH_LIBRARY(hdk, m) {
  m.def(hdk_python::kGdnDecodeSchema);
}

TORCH_LIBRARY_IMPL(hdk, CPU, m) {
  m.impl("gdn_decode", &hdk_python::gdn_decode<false>);
}

// Registered even without CUDA support, so CUDA tensors get hdk's message about the build
// rather than the dispatcher's "could not run with arguments from the 'CUDA' backend".
TORCH_LIBRARY_IMPL(hdk, CUDA, m) {
  m.impl("gdn_decode", &hdk_python::gdn_decode<false>);
}

TORCH_LIBRARY_IMPL(hdk, Meta, m) {
  m.impl("gdn_decode", &hdk_python::gdn_decode<true>);
}

#if TORCH_VERSION_MAJOR < 2
// torch 1.x has no autograd fallback for meta tensors; without this, meta calls stop at the
// AutogradMeta key instead of reaching the Meta kernel. torch 2 registers one itself.
TORCH_LIBRARY_IMPL(hdk, AutogradMeta, m) {
  m.impl("gdn_decode", torch::CppFunction::makeFallthrough());
}
#endif
