#include "dsv4/index_topk/reference/query_quantize_reference.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/element_io.h"
#include "dsv4/index_topk/query_quantize_problem.h"
#include "dsv4/kv_cache/reference/kv_cache_reference.h"

namespace hdk {
namespace dsv4 {

void quantize_indexer_query_reference(const QuantizeIndexerQueryParams& params) {
  const detail::QueryQuantizeProblem p = detail::validate_quantize_indexer_query(params);
  int64_t invalid = 0;
  for (int64_t n = 0; n < p.num_rows; ++n) {
    for (int64_t h = 0; h < p.num_heads; ++h) {
      std::vector<double> x(kIndexerKeyDim);
      const int64_t base = n * p.q_row_stride + h * p.q_head_stride;
      for (int64_t i = 0; i < kIndexerKeyDim; ++i)
        x[i] = hdk::detail::load_float(p.q, p.q_dtype, base + i);
      if (p.rotate) x = hadamard_reference(x);
      uint8_t image[kMxfp4KeyBytes];
      invalid += encode_key_reference(x.data(), KeyFormat::kMXFP4, image) ? 1 : 0;
      std::memcpy(p.packed + n * p.packed_row_stride + h * p.packed_head_stride, image,
                  detail::kQueryPackedBytes);
      std::memcpy(p.scales + n * p.scales_row_stride + h * p.scales_head_stride,
                  image + detail::kQueryPackedBytes, detail::kQueryScaleBytes);
    }
  }
  detail::add_to_counter(p.invalid_count, invalid);
}

}  // namespace dsv4
}  // namespace hdk
