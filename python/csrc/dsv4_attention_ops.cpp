// torch.ops.hdk.dsv4_index_topk and dsv4_sparse_decode: DeepSeek-V4's read side (the indexer's
// score + top-k, sparse MQA attention with a sink) as torch custom ops that write their outputs
// in place and return nothing (capturable in CUDA graphs). Argument names match the C++ params
// structs of hdk/dsv4/attention.h; format is 0 (MXFP4) or 1 (NVFP4). hdk/dsv4/ops.py wraps them.
// index_topk's q_scales (packed MXFP4 q only) comes last, so older positional calls still work.
// dsv4_index_topk_workspace_bytes / dsv4_sparse_decode_workspace_bytes are the size functions of
// their optional workspace (pure host functions of the shapes and the device).
#include <torch/library.h>

#include <cstdint>

#include "hdk/dsv4/attention.h"
#include "torch_glue.h"

#ifdef HDK_PYTHON_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace hdk_python {
namespace {

template <bool kMeta>
void index_topk(const at::Tensor& q, const at::Tensor& weights, const at::Tensor& key_cache,
                int64_t block_size, int64_t format, const at::Tensor& block_table,
                const at::Tensor& num_entries, int64_t top_k, const at::Tensor& topk_indices,
                const OptionalTensor& topk_scores, const OptionalTensor& topk_slots,
                const OptionalTensor& invalid_count, const OptionalTensor& workspace,
                const OptionalTensor& q_scales) {
  CallViews views("hdk::dsv4::index_topk", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::IndexerParams p;
    p.q = views(q, "q");
    p.q_scales = views(q_scales, "q_scales");
    p.weights = views(weights, "weights");
    p.key_cache = views(key_cache, "key_cache");
    p.block_size = block_size;
    p.format = key_format(format, "hdk::dsv4::index_topk", "format");
    p.block_table = views(block_table, "block_table");
    p.num_entries = views(num_entries, "num_entries");
    p.top_k = top_k;
    p.topk_indices = views(topk_indices, "topk_indices");
    p.topk_scores = views(topk_scores, "topk_scores");
    p.topk_slots = views(topk_slots, "topk_slots");
    p.invalid_count = views(invalid_count, "invalid_count");
    p.workspace = views(workspace, "workspace");
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(topk_indices);
    hdk::dsv4::index_topk(p, current_stream(topk_indices));
  });
}

template <bool kMeta>
void sparse_decode(const at::Tensor& q, const at::Tensor& cache, int64_t block_size,
                   const at::Tensor& indices, const OptionalTensor& extra_cache,
                   int64_t extra_block_size, const OptionalTensor& extra_indices,
                   const OptionalTensor& sink, double scale, const at::Tensor& out,
                   const OptionalTensor& lse, bool lse_includes_sink,
                   const OptionalTensor& invalid_count, const OptionalTensor& workspace) {
  CallViews views("hdk::dsv4::sparse_decode", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::SparseDecodeParams p;
    p.q = views(q, "q");
    p.cache = views(cache, "cache");
    p.block_size = block_size;
    p.indices = views(indices, "indices");
    p.extra_cache = views(extra_cache, "extra_cache");
    p.extra_block_size = extra_block_size;
    p.extra_indices = views(extra_indices, "extra_indices");
    p.sink = views(sink, "sink");
    p.scale = static_cast<float>(scale);
    p.out = views(out, "out");
    p.lse = views(lse, "lse");
    p.lse_includes_sink = lse_includes_sink;
    p.invalid_count = views(invalid_count, "invalid_count");
    p.workspace = views(workspace, "workspace");
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(out);
    hdk::dsv4::sparse_decode(p, current_stream(out));
  });
}

// The device a size function plans for; a CUDA device without an index is the current one.
hdk::Device to_device(const c10::Device& device) {
  if (!device.is_cuda()) return hdk::Device::cpu();
#ifdef HDK_PYTHON_WITH_CUDA
  return hdk::Device::cuda(device.has_index() ? device.index() : c10::cuda::current_device());
#else
  return hdk::Device::cuda(device.has_index() ? device.index() : 0);
#endif
}

int64_t index_topk_workspace_bytes(int64_t num_rows, int64_t max_entries, c10::Device device) {
  int64_t bytes = 0;
  call_hdk([&] {
    bytes = hdk::dsv4::index_topk_workspace_bytes(num_rows, max_entries, to_device(device));
  });
  return bytes;
}

int64_t sparse_decode_workspace_bytes(int64_t num_rows, int64_t num_heads, int64_t list_length,
                                      c10::Device device) {
  int64_t bytes = 0;
  call_hdk([&] {
    bytes = hdk::dsv4::sparse_decode_workspace_bytes(num_rows, num_heads, list_length,
                                                     to_device(device));
  });
  return bytes;
}

}  // namespace
}  // namespace hdk_python

TORCH_LIBRARY_FRAGMENT(hdk, m) {
  m.def(
      "dsv4_index_topk(Tensor q, Tensor weights, Tensor key_cache, int block_size, int format, "
      "Tensor block_table, Tensor num_entries, int top_k, Tensor(a!) topk_indices, "
      "Tensor(b!)? topk_scores, Tensor(c!)? topk_slots, Tensor(d!)? invalid_count, "
      "Tensor(e!)? workspace=None, Tensor? q_scales=None) -> ()");
  m.def(
      "dsv4_sparse_decode(Tensor q, Tensor cache, int block_size, Tensor indices, "
      "Tensor? extra_cache, int extra_block_size, Tensor? extra_indices, Tensor? sink, "
      "float scale, Tensor(a!) out, Tensor(b!)? lse, bool lse_includes_sink, "
      "Tensor(c!)? invalid_count, Tensor(d!)? workspace=None) -> ()");
  m.def("dsv4_index_topk_workspace_bytes(int num_rows, int max_entries, Device device) -> int",
        &hdk_python::index_topk_workspace_bytes);
  m.def(
      "dsv4_sparse_decode_workspace_bytes(int num_rows, int num_heads, int list_length, "
      "Device device) -> int",
      &hdk_python::sparse_decode_workspace_bytes);
}

#define HDK_ATTENTION_REGISTER(key, meta)                           \
  TORCH_LIBRARY_IMPL(hdk, key, m) {                                 \
    m.impl("dsv4_index_topk", &hdk_python::index_topk<meta>);       \
    m.impl("dsv4_sparse_decode", &hdk_python::sparse_decode<meta>); \
  }

HDK_ATTENTION_REGISTER(CPU, false)
HDK_ATTENTION_REGISTER(CUDA, false)
HDK_ATTENTION_REGISTER(Meta, true)

#if TORCH_VERSION_MAJOR < 2
TORCH_LIBRARY_IMPL(hdk, AutogradMeta, m) {
  for (const char* name : {"dsv4_index_topk", "dsv4_sparse_decode"}) {
    m.impl(name, torch::CppFunction::makeFallthrough());
  }
}
#endif
