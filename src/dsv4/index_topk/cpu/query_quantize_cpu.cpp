#include "dsv4/index_topk/cpu/query_quantize_cpu.h"

#include <atomic>
#include <cstdint>

#include "core/element_io.h"
#include "core/thread_pool.h"
#include "dsv4/kv_cache/cpu/key_encode.h"

namespace hdk {
namespace dsv4 {
namespace detail {

void quantize_indexer_query_cpu(const QueryQuantizeProblem& p) {
  std::atomic<int64_t> invalid{0};
  hdk::detail::parallel_for(p.num_vectors(), [&](int64_t begin, int64_t end) {
    float x[kIndexerKeyDim];
    int64_t local = 0;
    for (int64_t v = begin; v < end; ++v) {
      const int64_t n = v / p.num_heads, h = v % p.num_heads;
      hdk::detail::load_floats(p.q, p.q_dtype, n * p.q_row_stride + h * p.q_head_stride,
                               kIndexerKeyDim, x);
      uint8_t* packed = p.packed + n * p.packed_row_stride + h * p.packed_head_stride;
      uint8_t* scales = p.scales + n * p.scales_row_stride + h * p.scales_head_stride;
      local += encode_key(x, KeyFormat::kMXFP4, p.rotate, packed, scales) ? 1 : 0;
    }
    invalid += local;
  });
  add_to_counter(p.invalid_count, invalid.load());
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
