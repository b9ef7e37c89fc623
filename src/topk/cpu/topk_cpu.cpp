#include "topk/cpu/topk_cpu.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "core/thread_pool.h"
#include "topk/topk_key.h"

namespace hdk {
namespace detail {

void topk_cpu(const TopkProblem& p) {
  if (p.num_rows == 0 || p.k == 0) return;
  parallel_for(p.num_rows, [&](int64_t begin, int64_t end) {
    // Ranked entries are unique per row (the column is part of them), so nth_element + a sort of
    // the k winners gives exactly the full sort's first k, in O(L + k log k).
    std::vector<uint64_t> entries;
    for (int64_t n = begin; n < end; ++n) {
      const int64_t length = p.length_of(n);
      const float* row = p.values + n * p.values_row_stride;
      entries.resize(static_cast<size_t>(length));
      for (int64_t i = 0; i < length; ++i) {
        entries[i] = ranked_entry(ordered_key(row[i]), static_cast<uint32_t>(i));
      }
      const int64_t count = std::min(p.k, length);
      if (count < length) {
        std::nth_element(entries.begin(), entries.begin() + (count - 1), entries.end(),
                         std::greater<uint64_t>());
      }
      std::sort(entries.begin(), entries.begin() + count, std::greater<uint64_t>());
      float* out_values = p.out_values + n * p.out_values_row_stride;
      int32_t* out_indices = p.out_indices + n * p.out_indices_row_stride;
      for (int64_t j = 0; j < count; ++j) {
        const uint32_t column = column_of(entries[j]);
        out_values[j] = row[column];
        out_indices[j] = static_cast<int32_t>(column);
      }
      for (int64_t j = count; j < p.k; ++j) {
        out_values[j] = -std::numeric_limits<float>::infinity();
        out_indices[j] = -1;
      }
    }
  });
}

}  // namespace detail
}  // namespace hdk
