// The float64 oracle of the read side (hdk/dsv4/attention.h), for tests: the spec's formulas over
// keys and entries dequantized by the write side's reference decoders (kv_cache_reference.h).
// Slow on purpose; shares only the argument validation with the backends.
#pragma once

#include <cstdint>
#include <vector>

#include "hdk/dsv4/attention.h"

namespace hdk {
namespace dsv4 {

struct IndexerReference {
  int64_t num_rows = 0;
  int64_t top_k = 0;
  std::vector<uint8_t> invalid;  // [N]: non-finite q or weights; only padding
  // Per row, over s < num_entries (empty for an invalid row): the score, and the scale of its
  // rounding error, sum_h |weights[h]| * sum_d |q[h, d] * K[s, d]| (q dequantized from its form);
  // for packed MXFP4 q, whose 32-dim group terms are exact, sum_h |weights[h]| * sum_g
  // |q[h, g] . K[s, g]| over the 4 groups g instead.
  std::vector<std::vector<double>> scores, magnitudes;
  std::vector<int32_t> indices;    // [N, top_k], -1 padding
  std::vector<double> top_scores;  // [N, top_k], -inf padding
  int64_t invalid_rows = 0;
};

// Validates like index_topk (same errors, including the CPU's entry-count and block checks) and
// computes the oracle for host tensors. Ranking: best first, ties to the lower s, NaN last.
IndexerReference index_topk_reference(const IndexerParams& params);

struct SparseDecodeReference {
  int64_t num_rows = 0;
  int64_t num_heads = 0;
  std::vector<uint8_t> invalid;  // [N]: non-finite q or a NaN result; o = 0, lse = NaN
  std::vector<double> out;       // [N, Hq, 512]
  std::vector<double> lse;       // [N, Hq]
  // Per row, the scales of the rounding errors: the largest scale * sum_i |q[h, i] * E[j, i]|
  // over heads and the list, and the largest |E[j, i]| over the list.
  std::vector<double> score_magnitude, value_magnitude;
  int64_t invalid_rows = 0;
};

// Validates like sparse_decode (same errors, including the CPU's slot check) and computes the
// oracle for host tensors.
SparseDecodeReference sparse_decode_reference(const SparseDecodeParams& params);

}  // namespace dsv4
}  // namespace hdk
