#include "dsv4/attention/attention_validation.h"

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>

#include "core/argument_checks.h"
#include "dsv4/attention/attention_workspace.h"
#include "dsv4/kv_cache/kv_cache_validation.h"
#include "hdk/topk.h"

namespace hdk {
namespace dsv4 {
namespace detail {
namespace {

using hdk::detail::ArgumentChecks;
using hdk::detail::NamedView;

constexpr const char* kIndexTopk = "hdk::dsv4::index_topk";
constexpr const char* kSparseDecode = "hdk::dsv4::sparse_decode";

std::string text(int64_t value) {
  return std::to_string(value);
}

// The key format as the Python API spells it.
const char* key_format_name(KeyFormat format) {
  switch (format) {
    case KeyFormat::kMXFP4:
      return "mxfp4";
    case KeyFormat::kNVFP4:
      return "nvfp4";
    case KeyFormat::kFP8:
      return "fp8";
  }
  return "?";
}

// Records N, H and the view of [N, H, ...] queries whose shape and dtype were checked; at least
// one head.
template <typename Problem>
void record_queries(const ArgumentChecks& check, const TensorView& q, Problem& problem) {
  if (q.shape[1] < 1) check.fail("argument 'q' must have at least one head, got " + q.shape_str());
  problem.num_rows = q.shape[0];
  problem.num_heads = q.shape[1];
  problem.q.data = q.data;
  problem.q.dtype = q.dtype;
  problem.q.row_stride = q.strides[0];
  problem.q.head_stride = q.strides[1];
}

// [N, H, width] bf16/fp32 queries with the last dim contiguous; records N, H and the view.
template <typename Problem>
void check_queries(const ArgumentChecks& check, const TensorView& q, int64_t width,
                   const char* dims, Problem& problem) {
  check.rank_in(q, "q", {3}, dims);
  check.shape_is(q, "q", {q.shape[0], q.shape[1], width}, dims);
  check.dtype_in(q, "q", {DType::kBFloat16, DType::kFloat32});
  check.innermost_contiguous(q, "q");
  record_queries(check, q, problem);
}

// The optional workspace: 1-D contiguous uint8 on the call's device, 256-byte aligned (its size is
// checked by the entry points in attention.cpp against the size functions, which need the
// device's SM count).
void check_workspace(const ArgumentChecks& check, const TensorView& workspace, uint8_t*& data,
                     int64_t& bytes) {
  if (!workspace.defined()) return;
  check.rank_in(workspace, "workspace", {1}, "[bytes]");
  check.dtype_in(workspace, "workspace", {DType::kUInt8});
  check.innermost_contiguous(workspace, "workspace");
  if (reinterpret_cast<uintptr_t>(workspace.data) % kWorkspaceAlignment != 0) {
    check.fail("argument 'workspace' must be " + text(kWorkspaceAlignment) +
               "-byte aligned, got an address " +
               text(static_cast<int64_t>(reinterpret_cast<uintptr_t>(workspace.data) %
                                         kWorkspaceAlignment)) +
               " bytes past the boundary");
  }
  data = static_cast<uint8_t*>(workspace.data);
  bytes = workspace.shape[0];
}

// index_topk's q in one of its three forms (hdk/dsv4/attention.h), which its dtype, its last dim
// and q_scales' presence tell apart, each with the key formats it goes with: bf16/fp32 [N, H, 128]
// (exact) with mxfp4 or nvfp4 keys, uint8 E4M3 codes [N, H, 128] with fp8 keys, uint8 packed E2M1
// [N, H, 64] plus q_scales [N, H, 4] with mxfp4 keys. Records the form, N, H, q and q_scales.
void check_index_queries(const ArgumentChecks& check, const IndexerParams& p,
                         IndexerProblem& problem) {
  const TensorView& q = p.q;
  check.rank_in(q, "q", {3}, "[N, H, 128], or [N, H, 64] packed E2M1 with q_scales");
  check.dtype_in(q, "q", {DType::kBFloat16, DType::kFloat32, DType::kUInt8});
  const bool codes = q.dtype == DType::kUInt8;
  const bool scaled = p.q_scales.defined();
  const std::string format = key_format_name(p.format);
  const std::string given = std::string(dtype_name(q.dtype)) + " q " + q.shape_str();
  if (scaled && !(codes && p.format == KeyFormat::kMXFP4)) {
    check.fail(
        "argument 'q_scales' is given only with packed E2M1 q (uint8 [N, H, 64]) and "
        "format mxfp4, got " +
        given + " and format " + format);
  }
  if (p.format == KeyFormat::kFP8 && !codes) {
    check.fail(
        "format fp8 takes argument 'q' as uint8 E4M3 codes [N, H, 128] (DeepGEMM's "
        "fp8_paged_mqa_logits form: q's own scale goes into weights), got " +
        given);
  }
  if (p.format == KeyFormat::kNVFP4 && codes) {
    check.fail("format nvfp4 takes argument 'q' as bfloat16 or float32 [N, H, 128], got " + given +
               " (uint8 E4M3 q goes with format fp8, packed E2M1 q with format mxfp4)");
  }
  if (p.format == KeyFormat::kMXFP4 && codes && !scaled) {
    check.fail(
        "format mxfp4 takes argument 'q' as bfloat16 or float32 [N, H, 128], or as uint8 "
        "packed E2M1 [N, H, 64] with argument 'q_scales' [N, H, 4]; got " +
        given + " without q_scales (uint8 E4M3 codes [N, H, 128] go with format fp8)");
  }
  problem.q_form = !codes   ? IndexQueryForm::kExact
                   : scaled ? IndexQueryForm::kMXFP4
                            : IndexQueryForm::kE4M3;
  const bool packed = problem.q_form == IndexQueryForm::kMXFP4;
  check.shape_is(q, "q", {q.shape[0], q.shape[1], packed ? kIndexerKeyDim / 2 : kIndexerKeyDim},
                 packed  ? "[N, H, 64] (packed E2M1, with q_scales)"
                 : codes ? "[N, H, 128] (E4M3 codes)"
                         : "[N, H, 128]");
  check.innermost_contiguous(q, "q");
  record_queries(check, q, problem);
  if (!packed) return;
  check.shape_is(p.q_scales, "q_scales", {problem.num_rows, problem.num_heads, 4},
                 "[N, H, 4] (UE8M0, one per 32 dims)");
  check.dtype_in(p.q_scales, "q_scales", {DType::kUInt8});
  check.innermost_contiguous(p.q_scales, "q_scales");
  problem.q_scales = static_cast<const uint8_t*>(p.q_scales.data);
  problem.q_scales_row_stride = p.q_scales.strides[0];
  problem.q_scales_head_stride = p.q_scales.strides[1];
}

}  // namespace

IndexerProblem validate_index_topk(const IndexerParams& p) {
  const ArgumentChecks check(kIndexTopk);
  check.require(p.q, "q",
                "([N, H, 128] bf16 / fp32 / uint8 E4M3, or [N, H, 64] uint8 packed E2M1)");
  check.require(p.weights, "weights", "([N, H] fp32)");
  check.require(p.key_cache, "key_cache", "([num_blocks, block_size * key bytes] uint8)");
  check.require(p.block_table, "block_table", "([N, max_blocks] int32)");
  check.require(p.num_entries, "num_entries", "([N] int32/int64)");
  check.require(p.topk_indices, "topk_indices", "([N, top_k] int32)");
  const std::initializer_list<NamedView> inputs = {{&p.q, "q"},
                                                   {&p.q_scales, "q_scales"},
                                                   {&p.weights, "weights"},
                                                   {&p.key_cache, "key_cache"},
                                                   {&p.block_table, "block_table"},
                                                   {&p.num_entries, "num_entries"}};
  const std::initializer_list<NamedView> outputs = {{&p.topk_indices, "topk_indices"},
                                                    {&p.topk_scores, "topk_scores"},
                                                    {&p.topk_slots, "topk_slots"},
                                                    {&p.invalid_count, "invalid_count"},
                                                    {&p.workspace, "workspace"}};
  check.same_device(inputs, outputs);
  check_key_format(check, p.format, "format");  // then q's form against it

  IndexerProblem problem;
  check_index_queries(check, p, problem);
  const int64_t N = problem.num_rows, H = problem.num_heads;

  check.shape_is(p.weights, "weights", {N, H}, "[N, H]");
  check.dtype_in(p.weights, "weights", {DType::kFloat32});
  problem.weights = static_cast<const float*>(p.weights.data);
  problem.weights_row_stride = p.weights.strides[0];
  problem.weights_head_stride = p.weights.strides[1];

  problem.keys = paged_pool(check, p.key_cache, p.block_size, key_entry_bytes(p.format),
                            format_name(p.format), "key_cache");
  problem.format = p.format;
  if (p.format == KeyFormat::kFP8) {  // pages of fp32 scales
    const auto misaligned = static_cast<int64_t>(reinterpret_cast<uintptr_t>(p.key_cache.data) % 4);
    if (misaligned != 0 || problem.keys.page_stride % 4 != 0) {
      const std::string got = "an address " + text(misaligned) + " bytes past the boundary and " +
                              text(problem.keys.page_stride) + " bytes between pages";
      check.fail("argument 'key_cache' of fp8 keys (fp32 scales) must be 4-byte aligned with a " +
                 std::string("page stride that is a multiple of 4 bytes, got ") + got);
    }
  }

  check.rank_in(p.block_table, "block_table", {2}, "[N, max_blocks]");
  check.dtype_in(p.block_table, "block_table", {DType::kInt32});
  problem.block_table = index_view(check, p.block_table, "block_table", {N, p.block_table.shape[1]},
                                   "[N, max_blocks]");
  problem.max_blocks = p.block_table.shape[1];
  problem.num_entries = index_view(check, p.num_entries, "num_entries", {N}, "[N]");

  if (p.top_k < 1 || p.top_k > kMaxTopK) {
    check.fail("option 'top_k' must be between 1 and " + text(kMaxTopK) + ", got " + text(p.top_k));
  }
  problem.top_k = p.top_k;
  check.shape_is(p.topk_indices, "topk_indices", {N, p.top_k}, "[N, top_k]");
  check.dtype_in(p.topk_indices, "topk_indices", {DType::kInt32});
  check.innermost_contiguous(p.topk_indices, "topk_indices");
  problem.topk_indices = static_cast<int32_t*>(p.topk_indices.data);
  problem.topk_indices_row_stride = p.topk_indices.strides[0];
  if (p.topk_scores.defined()) {
    check.shape_is(p.topk_scores, "topk_scores", {N, p.top_k}, "[N, top_k]");
    check.dtype_in(p.topk_scores, "topk_scores", {DType::kFloat32});
    check.innermost_contiguous(p.topk_scores, "topk_scores");
    problem.topk_scores = static_cast<float*>(p.topk_scores.data);
    problem.topk_scores_row_stride = p.topk_scores.strides[0];
  }
  if (p.topk_slots.defined()) {
    check.shape_is(p.topk_slots, "topk_slots", {N, p.top_k}, "[N, top_k]");
    check.dtype_in(p.topk_slots, "topk_slots", {DType::kInt32});
    check.innermost_contiguous(p.topk_slots, "topk_slots");
    if (problem.keys.num_slots() > std::numeric_limits<int32_t>::max()) {
      check.fail("argument 'topk_slots' is int32, but 'key_cache' has " +
                 text(problem.keys.num_slots()) + " slots (at most 2^31 - 1 fit)");
    }
    problem.topk_slots = static_cast<int32_t*>(p.topk_slots.data);
    problem.topk_slots_row_stride = p.topk_slots.strides[0];
  }
  problem.invalid_count = counter(check, p.invalid_count);
  check_workspace(check, p.workspace, problem.workspace, problem.workspace_bytes);

  check.disjoint_outputs(outputs, inputs);
  return problem;
}

SparseDecodeProblem validate_sparse_decode(const SparseDecodeParams& p) {
  const ArgumentChecks check(kSparseDecode);
  check.require(p.q, "q", "([N, Hq, 512] bf16 or fp32)");
  check.require(p.cache, "cache", "([num_blocks, block_size * 584] uint8)");
  check.require(p.indices, "indices", "([N, L] int32/int64 flat slots)");
  check.require(p.out, "out", "([N, Hq, 512] bf16 or fp32)");
  const std::initializer_list<NamedView> inputs = {{&p.q, "q"},
                                                   {&p.cache, "cache"},
                                                   {&p.indices, "indices"},
                                                   {&p.extra_cache, "extra_cache"},
                                                   {&p.extra_indices, "extra_indices"},
                                                   {&p.sink, "sink"}};
  const std::initializer_list<NamedView> outputs = {{&p.out, "out"},
                                                    {&p.lse, "lse"},
                                                    {&p.invalid_count, "invalid_count"},
                                                    {&p.workspace, "workspace"}};
  check.same_device(inputs, outputs);

  SparseDecodeProblem problem;
  check_queries(check, p.q, kHeadDim, "[N, Hq, 512]", problem);
  const int64_t N = problem.num_rows, H = problem.num_heads;

  problem.cache = paged_pool(check, p.cache, p.block_size, kEntryBytes, "MODEL1 entries");
  check.rank_in(p.indices, "indices", {2}, "[N, L]");
  problem.num_indices = p.indices.shape[1];
  problem.indices = index_view(check, p.indices, "indices", {N, problem.num_indices}, "[N, L]");
  if (p.extra_cache.defined() != p.extra_indices.defined()) {
    check.fail(std::string("arguments 'extra_cache' and 'extra_indices' go together: got ") +
               (p.extra_cache.defined() ? "extra_cache" : "extra_indices") + " only");
  }
  if (p.extra_cache.defined()) {
    problem.extra_cache = paged_pool(check, p.extra_cache, p.extra_block_size, kEntryBytes,
                                     "MODEL1 entries", "extra_cache", "extra_block_size");
    check.rank_in(p.extra_indices, "extra_indices", {2}, "[N, L2]");
    problem.num_extra_indices = p.extra_indices.shape[1];
    problem.extra_indices = index_view(check, p.extra_indices, "extra_indices",
                                       {N, problem.num_extra_indices}, "[N, L2]");
  }

  if (p.sink.defined()) {
    check.shape_is(p.sink, "sink", {H}, "[Hq]");
    check.dtype_in(p.sink, "sink", {DType::kFloat32});
    problem.sink = static_cast<const float*>(p.sink.data);
    problem.sink_stride = p.sink.strides[0];
  }
  if (!std::isfinite(p.scale)) {
    check.fail("option 'scale' must be finite (0 means 512^-0.5), got " + std::to_string(p.scale));
  }
  problem.scale = p.scale != 0.0f ? p.scale : 1.0f / std::sqrt(static_cast<float>(kHeadDim));

  check.shape_is(p.out, "out", {N, H, kHeadDim}, "[N, Hq, 512]");
  check.dtype_in(p.out, "out", {DType::kBFloat16, DType::kFloat32});
  check.innermost_contiguous(p.out, "out");
  problem.out = p.out.data;
  problem.out_dtype = p.out.dtype;
  problem.out_row_stride = p.out.strides[0];
  problem.out_head_stride = p.out.strides[1];
  if (p.lse.defined()) {
    check.shape_is(p.lse, "lse", {N, H}, "[N, Hq]");
    check.dtype_in(p.lse, "lse", {DType::kFloat32});
    problem.lse = static_cast<float*>(p.lse.data);
    problem.lse_row_stride = p.lse.strides[0];
    problem.lse_head_stride = p.lse.strides[1];
    problem.lse_includes_sink = p.lse_includes_sink;
  }
  problem.invalid_count = counter(check, p.invalid_count);
  check_workspace(check, p.workspace, problem.workspace, problem.workspace_bytes);

  check.disjoint_outputs(outputs, inputs);
  return problem;
}

void check_indexer_indices(const IndexerProblem& p) {
  const ArgumentChecks check(kIndexTopk);
  const int64_t capacity = p.max_blocks * p.keys.block_size;
  for (int64_t n = 0; n < p.num_rows; ++n) {
    const int64_t count = p.num_entries.at(n);
    if (count < 0 || count > capacity) {
      check.fail("num_entries[" + text(n) + "] = " + text(count) + " is outside 0.." +
                 text(capacity) + " (block_table's " + text(p.max_blocks) + " pages of " +
                 text(p.keys.block_size) + " entries)");
    }
    const int64_t pages = (count + p.keys.block_size - 1) / p.keys.block_size;
    for (int64_t page = 0; page < pages; ++page) {
      const int64_t block = p.block_table.at(n, page);
      if (block < 0 || block >= p.keys.num_blocks) {
        check.fail("block_table[" + text(n) + ", " + text(page) + "] = " + text(block) +
                   " (holding entries of row " + text(n) + ") is not a block of 'key_cache', " +
                   "which has " + text(p.keys.num_blocks) + " blocks");
      }
    }
  }
}

void check_sparse_indices(const SparseDecodeProblem& p) {
  check_slots(kSparseDecode, p.indices, p.num_rows, p.num_indices, p.cache, SlotUse::kRead,
              "indices");
  if (p.num_extra_indices > 0) {
    check_slots(kSparseDecode, p.extra_indices, p.num_rows, p.num_extra_indices, p.extra_cache,
                SlotUse::kRead, "extra_indices");
  }
}

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
