// torch.ops.hdk.dsv4_quantize_indexer_query: the indexer's q, each [n, h] vector rotated (when
// asked) and quantized to the bytes store_indexer_keys writes for an MXFP4 key, as a torch custom
// op that writes q_packed and q_scales in place and returns nothing (capturable in CUDA graphs).
// Argument names match hdk::dsv4::QuantizeIndexerQueryParams (hdk/dsv4/attention.h);
// hdk/dsv4/ops.py wraps it.
#include <torch/library.h>

#include "hdk/dsv4/attention.h"
#include "torch_glue.h"

namespace hdk_python {
namespace {

template <bool kMeta>
void quantize_indexer_query(const at::Tensor& q, const at::Tensor& q_packed,
                            const at::Tensor& q_scales, bool rotate,
                            const OptionalTensor& invalid_count) {
  CallViews views("hdk::dsv4::quantize_indexer_query", kMeta);
  call_hdk(views, [&] {
    hdk::dsv4::QuantizeIndexerQueryParams p;
    p.q = views(q, "q");
    p.q_packed = views(q_packed, "q_packed");
    p.q_scales = views(q_scales, "q_scales");
    p.rotate = rotate;
    p.invalid_count = views(invalid_count, "invalid_count");
    if (views.tracing()) return;
    HDK_PYTHON_DEVICE_GUARD(q_packed);
    hdk::dsv4::quantize_indexer_query(p, current_stream(q_packed));
  });
}

}  // namespace
}  // namespace hdk_python

TORCH_LIBRARY_FRAGMENT(hdk, m) {
  m.def(
      "dsv4_quantize_indexer_query(Tensor q, Tensor(a!) q_packed, Tensor(b!) q_scales, "
      "bool rotate, Tensor(c!)? invalid_count) -> ()");
}

#define HDK_QUERY_REGISTER(key, meta)                                                 \
  TORCH_LIBRARY_IMPL(hdk, key, m) {                                                   \
    m.impl("dsv4_quantize_indexer_query", &hdk_python::quantize_indexer_query<meta>); \
  }

HDK_QUERY_REGISTER(CPU, false)
HDK_QUERY_REGISTER(CUDA, false)
HDK_QUERY_REGISTER(Meta, true)

#if TORCH_VERSION_MAJOR < 2
TORCH_LIBRARY_IMPL(hdk, AutogradMeta, m) {
  m.impl("dsv4_quantize_indexer_query", torch::CppFunction::makeFallthrough());
}
#endif
