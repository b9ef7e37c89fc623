// index_topk's test cases, shared by the tests of its backends (dsv4/index_topk_test.cpp) and of
// its CUDA workspace path (dsv4/index_topk_workspace_test.cpp): random keys stored by
// store_indexer_keys into shuffled pages (exact q) or written there as random bytes (the quantized
// q forms), poisoned outputs and a counter that starts at 3, the comparison with the float64
// reference (index_topk_test.cpp's file comment has the tolerances), and the call on the CPU or on
// a CUDA device.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <random>
#include <string>
#include <vector>

#include "dsv4/attention/reference/attention_reference.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dtype.h"
#include "hdk/tensor_view.h"
#include "support/device_memory.h"
#include "support/kv_cache_case.h"

namespace hdk {
namespace testing {

// The form of index_topk's q (hdk/dsv4/attention.h): bf16/fp32 values (kMXFP4 or kNVFP4 keys),
// E4M3 codes (kFP8 keys) or packed E2M1 with UE8M0 q_scales (kMXFP4 keys).
enum class IndexQuery { kExact, kE4M3, kMXFP4 };

const char* index_query_name(IndexQuery form);

struct IndexCase {
  std::vector<int64_t> counts;  // num_entries per row
  int64_t heads = dsv4::kIndexerHeads;
  int64_t top_k = 512;
  int64_t block_size = 64;
  dsv4::KeyFormat format = dsv4::KeyFormat::kMXFP4;
  // The exact form's dtype; the quantized forms' q is uint8 (and `format` must be theirs: kFP8
  // for kE4M3, kMXFP4 for kMXFP4).
  DType q_dtype = DType::kBFloat16;
  IndexQuery q_form = IndexQuery::kExact;
  DType count_dtype = DType::kInt32;
  int64_t distinct_keys = 0;  // > 0: every key is one of this many (exact ties)
  // Exact q: keys of entry e scaled by 2^(e % 17 - 8): stored scales from about 2^-10 to 2^6,
  // both sides of the 2 where the warpgroup kernel's MXFP4 decode takes a second multiply.
  // Quantized q: kFP8 keys' scales 2^(e % 61 - 30); kMXFP4 keys' and q's group scales
  // 2^-40 .. 2^40, drawn per group (instead of 2^-4 .. 2^4 and fp8 scales 2^-6 .. 2^6).
  bool spread_key_scales = false;
  // kFP8 keys of every other 64-entry tile (from the second) with scales of either sign and zero
  // (entry e negative where e % 5 == 1, zero where e % 7 == 3): relu(q . code x scale) takes the
  // scale's sign, so no kernel may move the scale past the relu; tiles of only positive scales
  // next to them.
  bool signed_key_scales = false;
  // Quantized q: keys stored by store_indexer_keys from normal values (as for exact q) instead
  // of written as random bytes.
  bool stored_keys = false;
  bool scores = true;         // pass topk_scores
  bool slots = true;          // pass topk_slots
  bool misaligned_q = false;  // q (and q_scales) one element past a 16-byte boundary
  uint64_t seed = 1;

  DType q_view_dtype() const { return q_form == IndexQuery::kExact ? q_dtype : DType::kUInt8; }
  int64_t q_width() const { return q_form == IndexQuery::kMXFP4 ? 64 : dsv4::kIndexerKeyDim; }
  int64_t q_pad_bytes() const { return misaligned_q ? dtype_size(q_view_dtype()) : 0; }

  std::string describe() const {
    std::string counts_text;
    for (int64_t c : counts)
      counts_text += std::to_string(c) + ",";
    const char* format_text = format == dsv4::KeyFormat::kMXFP4   ? " mxfp4 "
                              : format == dsv4::KeyFormat::kNVFP4 ? " nvfp4 "
                                                                  : " fp8 ";
    return "counts=" + counts_text + " H=" + std::to_string(heads) +
           " top_k=" + std::to_string(top_k) + " bs=" + std::to_string(block_size) + format_text +
           (q_form == IndexQuery::kExact ? dtype_name(q_dtype) : index_query_name(q_form)) +
           " distinct=" + std::to_string(distinct_keys) + (spread_key_scales ? " spread" : "") +
           (signed_key_scales ? " signed" : "") + (stored_keys ? " stored" : "") +
           (misaligned_q ? " misaligned" : "") + " seed=" + std::to_string(seed);
  }
};

struct IndexInputs {
  int64_t N = 0, max_blocks = 0, num_blocks = 0;
  std::vector<float> q, weights;  // q: the exact form's values (empty for the other forms)
  // q as passed (q_pad_bytes() of padding first); q_scales likewise, for packed MXFP4 q only.
  std::vector<uint8_t> q_bytes, q_scales, cache, counts;
  std::vector<int32_t> block_table;
  std::vector<int32_t> indices;  // poisoned output
  std::vector<float> scores;     // poisoned output
  std::vector<int32_t> slots;    // poisoned output
  std::vector<uint8_t> counter = counter_bytes(DType::kInt32, 3);

  dsv4::IndexerParams params(const IndexCase& c) {
    dsv4::IndexerParams p;
    p.q = TensorView::contiguous(q_bytes.data() + c.q_pad_bytes(), c.q_view_dtype(),
                                 {N, c.heads, c.q_width()});
    if (c.q_form == IndexQuery::kMXFP4) {
      p.q_scales =
          TensorView::contiguous(q_scales.data() + c.q_pad_bytes(), DType::kUInt8, {N, c.heads, 4});
    }
    p.weights = TensorView::contiguous(weights.data(), DType::kFloat32, {N, c.heads});
    p.key_cache = TensorView::contiguous(cache.data(), DType::kUInt8,
                                         {num_blocks, c.block_size * dsv4::key_bytes(c.format)});
    p.block_size = c.block_size;
    p.format = c.format;
    p.block_table = TensorView::contiguous(block_table.data(), DType::kInt32, {N, max_blocks});
    p.num_entries = TensorView::contiguous(counts.data(), c.count_dtype, {N});
    p.top_k = c.top_k;
    p.topk_indices = TensorView::contiguous(indices.data(), DType::kInt32, {N, c.top_k});
    if (c.scores)
      p.topk_scores = TensorView::contiguous(scores.data(), DType::kFloat32, {N, c.top_k});
    if (c.slots) p.topk_slots = TensorView::contiguous(slots.data(), DType::kInt32, {N, c.top_k});
    p.invalid_count = TensorView::contiguous(counter.data(), DType::kInt32, {1});
    return p;
  }
};

// Keys of every row's entries in shuffled pages; unused block table columns hold -1 (never read).
// Exact q: random normal keys stored by store_indexer_keys, q and weights normal. Quantized q:
// keys written as bytes (E4M3 codes other than NaN with an fp32 scale per key, or random E2M1
// nibbles with UE8M0 scales; stored_keys: as for exact q), q random E4M3 codes (no NaN) or E2M1
// nibbles with UE8M0 q_scales.
IndexInputs make_index_inputs(const IndexCase& c);

// Writes key `image` (key_bytes(c.format): data, then scales, as in a page of block size 1) at
// `slot` of in.cache.
void place_key_bytes(const IndexCase& c, IndexInputs& in, int64_t slot, const uint8_t* image);

// Checks the outputs against the reference within the tolerances of index_topk_test.cpp's file
// comment.
void check_index_outputs(const IndexCase& c, const IndexInputs& in,
                         const dsv4::IndexerReference& ref, double relative_tolerance = 1e-5);

// Where index_topk runs: the CPU backend, or the CUDA kernel scoring on tensor cores (its
// default: warpgroups up to 64 heads, warps above), on the warp kernel at any head count, or on
// CUDA cores (its plain cross-check path).
enum class IndexBackend { kCPU, kCudaTensorCore, kCudaWarpMma, kCudaCore };

const char* index_backend_name(IndexBackend backend);
// How gtest prints the parameters in a failure's "where GetParam() = ...".
void PrintTo(IndexBackend backend, std::ostream* os);
void PrintTo(IndexQuery form, std::ostream* os);
Backend memory_of(IndexBackend backend);
// The relative score tolerance of the file comment for a backend and exact query dtype.
double index_tolerance(IndexBackend backend, DType q_dtype);
// ... for a backend and a case of any q form (relative to the reference's magnitudes, which for
// packed MXFP4 q sum the exact group terms).
double index_tolerance(IndexBackend backend, const IndexCase& c);

// Forces the CUDA kernel's scoring path for one scope and puts the default back, so a failing
// test cannot leave later tests on the cross-check path.
class ScorePathScope {
 public:
  explicit ScorePathScope(IndexBackend backend);
  ~ScorePathScope();
  ScorePathScope(const ScorePathScope&) = delete;
  ScorePathScope& operator=(const ScorePathScope&) = delete;
};

// index_topk's arguments of `in` as copies on a backend's memory (the poisoned outputs and the
// counter included), and its outputs back.
class IndexDeviceCall {
 public:
  IndexDeviceCall(const IndexCase& c, const IndexInputs& in, Backend memory);
  dsv4::IndexerParams params;  // pointing at the copies
  // Uploads in's outputs and counter again, for another run from the same poison.
  void reset_outputs(const IndexInputs& in);
  // in.indices, in.scores, in.slots and in.counter from the copies.
  void download(IndexInputs& in) const;

 private:
  Backend memory_;
  DeviceBuffer q_, q_scales_, weights_, cache_, table_, counts_, indices_, scores_, slots_,
      counter_;
};

// index_topk of `in` on `backend`; in.indices, in.scores, in.slots and in.counter receive the
// outputs.
void run_index_topk(const IndexCase& c, IndexInputs& in, IndexBackend backend);

// A case against the reference on `backend`.
void run_index_case(const IndexCase& c, IndexBackend backend);

}  // namespace testing
}  // namespace hdk
