// hdk::dsv4::quantize_indexer_query: its validation (the one place that checks a call) and its
// entry points, which hand the problem to the backend of the device the tensors live on.
#include <initializer_list>

#include "core/argument_checks.h"
#include "dsv4/index_topk/cpu/query_quantize_cpu.h"
#include "dsv4/index_topk/query_quantize_problem.h"
#include "dsv4/kv_cache/kv_cache_validation.h"
#include "hdk/dsv4/attention.h"

#ifdef HDK_WITH_CUDA
#include "dsv4/index_topk/cuda/query_quantize_cuda.h"
#endif

namespace hdk {
namespace dsv4 {
namespace detail {

using hdk::detail::ArgumentChecks;
using hdk::detail::NamedView;

QueryQuantizeProblem validate_quantize_indexer_query(const QuantizeIndexerQueryParams& p) {
  const ArgumentChecks check("hdk::dsv4::quantize_indexer_query");
  check.require(p.q, "q", "([N, H, 128] bf16 or fp32)");
  check.require(p.q_packed, "q_packed", "([N, H, 64] uint8)");
  check.require(p.q_scales, "q_scales", "([N, H, 4] uint8)");
  const std::initializer_list<NamedView> inputs = {{&p.q, "q"}};
  const std::initializer_list<NamedView> outputs = {
      {&p.q_packed, "q_packed"}, {&p.q_scales, "q_scales"}, {&p.invalid_count, "invalid_count"}};
  check.same_device(inputs, outputs);

  QueryQuantizeProblem problem;
  check.rank_in(p.q, "q", {3}, "[N, H, 128]");
  const int64_t N = p.q.shape[0], H = p.q.shape[1];
  check.shape_is(p.q, "q", {N, H, kIndexerKeyDim}, "[N, H, 128]");
  check.dtype_in(p.q, "q", {DType::kFloat32, DType::kBFloat16});
  check.innermost_contiguous(p.q, "q");
  problem.num_rows = N;
  problem.num_heads = H;
  problem.q = p.q.data;
  problem.q_dtype = p.q.dtype;
  problem.q_row_stride = p.q.strides[0];
  problem.q_head_stride = p.q.strides[1];

  check.shape_is(p.q_packed, "q_packed", {N, H, kQueryPackedBytes}, "[N, H, 64]");
  check.dtype_in(p.q_packed, "q_packed", {DType::kUInt8});
  check.innermost_contiguous(p.q_packed, "q_packed");
  problem.packed = static_cast<uint8_t*>(p.q_packed.data);
  problem.packed_row_stride = p.q_packed.strides[0];
  problem.packed_head_stride = p.q_packed.strides[1];

  check.shape_is(p.q_scales, "q_scales", {N, H, kQueryScaleBytes}, "[N, H, 4]");
  check.dtype_in(p.q_scales, "q_scales", {DType::kUInt8});
  check.innermost_contiguous(p.q_scales, "q_scales");
  problem.scales = static_cast<uint8_t*>(p.q_scales.data);
  problem.scales_row_stride = p.q_scales.strides[0];
  problem.scales_head_stride = p.q_scales.strides[1];

  problem.rotate = p.rotate;
  problem.invalid_count = counter(check, p.invalid_count);
  check.disjoint_outputs(outputs, inputs);
  return problem;
}

}  // namespace detail

void quantize_indexer_query(const QuantizeIndexerQueryParams& params) {
  quantize_indexer_query(params, nullptr);
}

void quantize_indexer_query(const QuantizeIndexerQueryParams& params, CudaStream stream) {
  const detail::QueryQuantizeProblem problem = detail::validate_quantize_indexer_query(params);
  const Device device = params.q.device;
  if (device.is_cpu()) {
    detail::quantize_indexer_query_cpu(problem);
    return;
  }
#ifdef HDK_WITH_CUDA
  detail::quantize_indexer_query_cuda(problem, device.index, stream);
#else
  (void)stream;
  hdk::detail::throw_no_cuda_backend("hdk::dsv4::quantize_indexer_query", device);
#endif
}

}  // namespace dsv4
}  // namespace hdk
