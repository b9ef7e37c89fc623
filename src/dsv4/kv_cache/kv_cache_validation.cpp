#include "dsv4/kv_cache/kv_cache_validation.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "core/argument_checks.h"

namespace hdk {
namespace dsv4 {
namespace detail {

using hdk::detail::ArgumentChecks;
using hdk::detail::NamedView;
using hdk::detail::NamedViews;
using hdk::detail::shape_string;

namespace {

std::string text(int64_t value) {
  return std::to_string(value);
}

}  // namespace

PagedPool paged_pool(const ArgumentChecks& check, const TensorView& cache, int64_t block_size,
                     int64_t entry_bytes, const char* format, const char* name,
                     const char* block_size_name) {
  const std::string size_name = block_size_name;
  if (block_size < 1) {
    check.fail("option '" + size_name + "' must be at least 1, got " + text(block_size));
  }
  check.rank_in(cache, name, {2}, ("[num_blocks, " + size_name + " * entry bytes]").c_str());
  check.dtype_in(cache, name, {DType::kUInt8});
  check.innermost_contiguous(cache, name);
  if (cache.shape[1] != block_size * entry_bytes) {
    check.fail(std::string("argument '") + name + "' must have " + size_name + " * " +
               text(entry_bytes) + " = " + text(block_size * entry_bytes) + " bytes per page (" +
               format + ", " + size_name + " = " + text(block_size) + "), got shape " +
               cache.shape_str());
  }
  PagedPool pool;
  pool.data = static_cast<uint8_t*>(cache.data);
  pool.num_blocks = cache.shape[0];
  pool.block_size = block_size;
  pool.page_stride = cache.shape[0] > 1 ? cache.strides[0] : cache.shape[1];
  return pool;
}

IndexView index_view(const ArgumentChecks& check, const TensorView& view, const char* name,
                     const std::vector<int64_t>& shape, const char* dims) {
  check.shape_is(view, name, shape, dims);
  check.dtype_in(view, name, {DType::kInt32, DType::kInt64});
  IndexView index;
  index.data = view.data;
  index.dtype = view.dtype;
  index.row_stride = view.strides[0];
  index.column_stride = view.ndim > 1 ? view.strides[1] : 0;
  return index;
}

Counter counter(const ArgumentChecks& check, const TensorView& view) {
  Counter result;
  if (!view.defined()) return result;
  if (!(view.ndim == 0 || (view.ndim == 1 && view.shape[0] == 1))) {
    check.fail("argument 'invalid_count' must be a scalar or have shape [1], got " +
               view.shape_str());
  }
  check.dtype_in(view, "invalid_count", {DType::kInt32, DType::kInt64});
  result.data = view.data;
  result.dtype = view.dtype;
  return result;
}

const char* format_name(KeyFormat format) {
  switch (format) {
    case KeyFormat::kMXFP4:
      return "MXFP4 indexer keys";
    case KeyFormat::kNVFP4:
      return "NVFP4 indexer keys";
    case KeyFormat::kFP8:
      return "FP8 indexer keys";
  }
  return "indexer keys";
}

void check_key_format(const ArgumentChecks& check, KeyFormat format, const char* name) {
  if (format != KeyFormat::kMXFP4 && format != KeyFormat::kNVFP4 && format != KeyFormat::kFP8) {
    check.fail(std::string("option '") + name +
               "' must be KeyFormat::kMXFP4, kNVFP4 or kFP8, got " +
               text(static_cast<int64_t>(format)));
  }
}

namespace {

// [N, width] fp32/bf16 rows, last dim contiguous.
void check_rows(const ArgumentChecks& check, const TensorView& view, const char* name,
                int64_t width, const char* dims) {
  check.rank_in(view, name, {2}, dims);
  check.shape_is(view, name, {view.shape[0], width}, dims);
  check.dtype_in(view, name, {DType::kFloat32, DType::kBFloat16});
  check.innermost_contiguous(view, name);
}

// What both gathers check and record: slots [N, L] int32/int64, out [N, L, width] fp32/bf16 (last
// dim contiguous), the counter, and that out and the counter overlap no input. `problem` is a
// GatherEntriesProblem or a GatherKeysProblem.
template <typename Problem>
void validate_gather(const ArgumentChecks& check, const TensorView& cache, const TensorView& slots,
                     const TensorView& out, const TensorView& invalid_count, int64_t width,
                     const char* dims, Problem& problem) {
  check.rank_in(slots, "slots", {2}, "[N, L]");
  check.shape_is(out, "out", {slots.shape[0], slots.shape[1], width}, dims);
  check.dtype_in(out, "out", {DType::kFloat32, DType::kBFloat16});
  check.innermost_contiguous(out, "out");
  problem.num_rows = slots.shape[0];
  problem.num_columns = slots.shape[1];
  problem.slots =
      index_view(check, slots, "slots", {problem.num_rows, problem.num_columns}, "[N, L]");
  problem.out = out.data;
  problem.out_dtype = out.dtype;
  problem.out_row_stride = out.strides[0];
  problem.out_column_stride = out.strides[1];
  problem.invalid_count = counter(check, invalid_count);
  check.disjoint_outputs({{&out, "out"}, {&invalid_count, "invalid_count"}},
                         {{&cache, "cache"}, {&slots, "slots"}});
}

}  // namespace

namespace {

std::array<NamedView, 2> store_inputs(const StoreEntriesParams& p) {
  return {{{&p.values, "values"}, {&p.slots, "slots"}}};
}
std::array<NamedView, 2> store_outputs(const StoreEntriesParams& p) {
  return {{{&p.cache, "cache"}, {&p.invalid_count, "invalid_count"}}};
}

}  // namespace

StoreEntriesProblem validate_store_entries(const StoreEntriesParams& p, const char* operation) {
  const ArgumentChecks check(operation);
  check.require(p.values, "values", "([N, 512] fp32 or bf16)");
  check.require(p.slots, "slots", "([N] int32/int64)");
  check.require(p.cache, "cache", "([num_blocks, block_size * 584] uint8)");
  const std::array<NamedView, 2> inputs = store_inputs(p);
  const std::array<NamedView, 2> outputs = store_outputs(p);
  check.same_device(inputs, outputs);
  StoreEntriesProblem problem;
  check_rows(check, p.values, "values", kHeadDim, "[N, 512]");
  problem.num_rows = p.values.shape[0];
  problem.values = p.values.data;
  problem.values_dtype = p.values.dtype;
  problem.values_row_stride = p.values.strides[0];
  problem.slots = index_view(check, p.slots, "slots", {problem.num_rows}, "[N]");
  problem.cache = paged_pool(check, p.cache, p.block_size, kEntryBytes, "MODEL1 entries");
  problem.invalid_count = counter(check, p.invalid_count);
  check.disjoint_outputs(outputs, inputs);
  return problem;
}

GatherEntriesProblem validate_gather_entries(const GatherEntriesParams& p) {
  const ArgumentChecks check("hdk::dsv4::gather_entries");
  check.require(p.cache, "cache", "([num_blocks, block_size * 584] uint8)");
  check.require(p.slots, "slots", "([N, L] int32/int64)");
  check.require(p.out, "out", "([N, L, 512] fp32 or bf16)");
  check.same_device({{&p.cache, "cache"}, {&p.slots, "slots"}},
                    {{&p.out, "out"}, {&p.invalid_count, "invalid_count"}});
  GatherEntriesProblem problem;
  problem.cache = paged_pool(check, p.cache, p.block_size, kEntryBytes, "MODEL1 entries");
  validate_gather(check, p.cache, p.slots, p.out, p.invalid_count, kHeadDim, "[N, L, 512]",
                  problem);
  return problem;
}

StoreKeysProblem validate_store_indexer_keys(const StoreIndexerKeysParams& p) {
  const ArgumentChecks check("hdk::dsv4::store_indexer_keys");
  check.require(p.keys, "keys", "([N, 128] fp32 or bf16)");
  check.require(p.slots, "slots", "([N] int32/int64)");
  check.require(p.cache, "cache", "([num_blocks, block_size * key bytes] uint8)");
  const std::initializer_list<NamedView> inputs = {{&p.keys, "keys"}, {&p.slots, "slots"}};
  const std::initializer_list<NamedView> outputs = {{&p.cache, "cache"},
                                                    {&p.invalid_count, "invalid_count"}};
  check.same_device(inputs, outputs);
  check_key_format(check, p.format, "format");
  StoreKeysProblem problem;
  check_rows(check, p.keys, "keys", kIndexerKeyDim, "[N, 128]");
  problem.num_rows = p.keys.shape[0];
  problem.keys = p.keys.data;
  problem.keys_dtype = p.keys.dtype;
  problem.keys_row_stride = p.keys.strides[0];
  problem.slots = index_view(check, p.slots, "slots", {problem.num_rows}, "[N]");
  problem.cache =
      paged_pool(check, p.cache, p.block_size, key_entry_bytes(p.format), format_name(p.format));
  problem.format = p.format;
  problem.rotate = p.rotate;
  problem.invalid_count = counter(check, p.invalid_count);
  check.disjoint_outputs(outputs, inputs);
  return problem;
}

GatherKeysProblem validate_gather_indexer_keys(const GatherIndexerKeysParams& p) {
  const ArgumentChecks check("hdk::dsv4::gather_indexer_keys");
  check.require(p.cache, "cache", "([num_blocks, block_size * key bytes] uint8)");
  check.require(p.slots, "slots", "([N, L] int32/int64)");
  check.require(p.out, "out", "([N, L, 128] fp32 or bf16)");
  check.same_device({{&p.cache, "cache"}, {&p.slots, "slots"}},
                    {{&p.out, "out"}, {&p.invalid_count, "invalid_count"}});
  check_key_format(check, p.format, "format");
  GatherKeysProblem problem;
  problem.cache =
      paged_pool(check, p.cache, p.block_size, key_entry_bytes(p.format), format_name(p.format));
  problem.format = p.format;
  validate_gather(check, p.cache, p.slots, p.out, p.invalid_count, kIndexerKeyDim, "[N, L, 128]",
                  problem);
  return problem;
}

namespace {

// What a compressor call reads and what it writes, by name: its validation's device and aliasing
// checks, and a pair's check of each call against the other's arguments.
std::array<NamedView, 9> compressor_inputs(const CompressorParams& p) {
  return {{{&p.kv, "kv"},
           {&p.score, "score"},
           {&p.ape, "ape"},
           {&p.positions, "positions"},
           {&p.state_slots, "state_slots"},
           {&p.norm_weight, "norm_weight"},
           {&p.rope_cos, "rope_cos"},
           {&p.rope_sin, "rope_sin"},
           {&p.block_table, "block_table"}}};
}
std::array<NamedView, 3> compressor_outputs(const CompressorParams& p) {
  return {{{&p.state, "state"}, {&p.cache, "cache"}, {&p.invalid_count, "invalid_count"}}};
}

}  // namespace

CompressorProblem validate_compress(const CompressorParams& p, const char* operation) {
  const ArgumentChecks check(operation);
  check.require(p.kv, "kv", "([N, T, coff*d] fp32 or bf16)");
  check.require(p.score, "score", "(same shape and dtype as kv)");
  check.require(p.ape, "ape", "([ratio, coff*d] fp32)");
  check.require(p.positions, "positions", "([N] int32/int64)");
  check.require(p.state_slots, "state_slots", "([N] int32/int64)");
  check.require(p.state, "state", "([num_states, A, 3, d] fp32)");
  check.require(p.norm_weight, "norm_weight", "([d] fp32)");
  check.require(p.rope_cos, "rope_cos", "([max_position, 32] fp32)");
  check.require(p.rope_sin, "rope_sin", "([max_position, 32] fp32)");
  check.require(p.block_table, "block_table", "([N, max_blocks] int32)");
  check.require(p.cache, "cache", "([num_blocks, block_size * entry bytes] uint8)");
  const std::array<NamedView, 9> inputs = compressor_inputs(p);
  const std::array<NamedView, 3> outputs = compressor_outputs(p);
  check.same_device(inputs, outputs);

  CompressorProblem problem;
  if (p.ratio < 2 || p.ratio > 128) {
    check.fail("option 'ratio' must be 4 (CSA) or between 2 and 128 (HCA: 128), got " +
               text(p.ratio));
  }
  problem.ratio = p.ratio;
  problem.overlap = p.ratio == 4;
  const int64_t coff = problem.overlap ? 2 : 1;

  check.rank_in(p.kv, "kv", {2, 3}, "[N, T, coff*d] or [N, coff*d]");
  check.dtype_in(p.kv, "kv", {DType::kFloat32, DType::kBFloat16});
  check.innermost_contiguous(p.kv, "kv");
  const int64_t N = p.kv.shape[0];
  const int64_t T = p.kv.ndim == 3 ? p.kv.shape[1] : 1;
  const int64_t width = p.kv.shape[p.kv.ndim - 1];
  if (width != coff * 512 && width != coff * 128) {
    check.fail("argument 'kv' must have a last dimension of coff * d = " + text(coff * 512) +
               " (d = 512, entries) or " + text(coff * 128) + " (d = 128, indexer keys) for " +
               "ratio " + text(p.ratio) + " (coff = " + text(coff) + "), got shape " +
               p.kv.shape_str());
  }
  const int64_t d = width / coff;
  if (T < 1 || T > p.ratio) {
    check.fail("argument 'kv' must have 1 <= T <= ratio = " + text(p.ratio) +
               " tokens per row (at most one window completes per row and call), got shape " +
               p.kv.shape_str());
  }
  std::vector<int64_t> input_shape = {N, T, width};
  if (p.kv.ndim == 2) input_shape = {N, width};
  check.shape_is(p.score, "score", input_shape, p.kv.ndim == 3 ? "[N, T, coff*d]" : "[N, coff*d]");
  check.same_dtype(p.score, "score", p.kv, "kv");
  check.innermost_contiguous(p.score, "score");
  for (int dim = 0; dim + 1 < p.kv.ndim; ++dim) {
    if (p.score.strides[dim] != p.kv.strides[dim]) {
      check.fail("argument 'score' must have the strides of 'kv' " + p.kv.strides_str() + ", got " +
                 p.score.strides_str());
    }
  }
  problem.num_rows = N;
  problem.num_tokens = T;
  problem.dim = d;
  problem.kv = p.kv.data;
  problem.score = p.score.data;
  problem.input_dtype = p.kv.dtype;
  problem.input_row_stride = p.kv.strides[0];
  problem.input_token_stride = p.kv.ndim == 3 ? p.kv.strides[1] : 0;

  check.shape_is(p.ape, "ape", {p.ratio, width}, "[ratio, coff*d]");
  check.dtype_in(p.ape, "ape", {DType::kFloat32});
  check.innermost_contiguous(p.ape, "ape");
  problem.ape = static_cast<const float*>(p.ape.data);
  problem.ape_row_stride = p.ape.strides[0];

  problem.positions = index_view(check, p.positions, "positions", {N}, "[N]");
  problem.state_slots = index_view(check, p.state_slots, "state_slots", {N}, "[N]");

  const int64_t A = problem.accumulators();
  check.rank_in(p.state, "state", {4}, "[num_states, A, 3, d]");
  check.shape_is(
      p.state, "state", {p.state.shape[0], A, 3, d},
      problem.overlap ? "[num_states, A = 3 (CSA), 3, d]" : "[num_states, A = 1 (HCA), 3, d]");
  check.dtype_in(p.state, "state", {DType::kFloat32});
  if (p.state.strides[3] != 1 || p.state.strides[2] != d || p.state.strides[1] != 3 * d) {
    check.fail("argument 'state' must be contiguous within each state slot (strides [*, " +
               text(3 * d) + ", " + text(d) + ", 1]), got strides " + p.state.strides_str());
  }
  problem.state = static_cast<float*>(p.state.data);
  problem.num_states = p.state.shape[0];
  problem.state_slot_stride = p.state.strides[0];

  check.shape_is(p.norm_weight, "norm_weight", {d}, "[d]");
  check.dtype_in(p.norm_weight, "norm_weight", {DType::kFloat32});
  problem.norm_weight = static_cast<const float*>(p.norm_weight.data);
  problem.norm_weight_stride = p.norm_weight.strides[0];

  check.rank_in(p.rope_cos, "rope_cos", {2}, "[max_position, 32]");
  const int64_t max_position = p.rope_cos.shape[0];
  check.shape_is(p.rope_cos, "rope_cos", {max_position, kRopeDim / 2}, "[max_position, 32]");
  check.shape_is(p.rope_sin, "rope_sin", {max_position, kRopeDim / 2}, "[max_position, 32]");
  check.dtype_in(p.rope_cos, "rope_cos", {DType::kFloat32});
  check.dtype_in(p.rope_sin, "rope_sin", {DType::kFloat32});
  check.innermost_contiguous(p.rope_cos, "rope_cos");
  check.innermost_contiguous(p.rope_sin, "rope_sin");
  problem.rope_cos = static_cast<const float*>(p.rope_cos.data);
  problem.rope_sin = static_cast<const float*>(p.rope_sin.data);
  problem.rope_cos_row_stride = p.rope_cos.strides[0];
  problem.rope_sin_row_stride = p.rope_sin.strides[0];
  problem.max_position = max_position;

  check.rank_in(p.block_table, "block_table", {2}, "[N, max_blocks]");
  check.shape_is(p.block_table, "block_table", {N, p.block_table.shape[1]}, "[N, max_blocks]");
  check.dtype_in(p.block_table, "block_table", {DType::kInt32});
  problem.block_table.data = p.block_table.data;
  problem.block_table.dtype = DType::kInt32;
  problem.block_table.row_stride = p.block_table.strides[0];
  problem.block_table.column_stride = p.block_table.strides[1];
  problem.max_blocks = p.block_table.shape[1];

  if (d == kHeadDim) {
    problem.cache =
        paged_pool(check, p.cache, p.block_size, kEntryBytes, "MODEL1 entries, d = 512");
  } else {
    check_key_format(check, p.key_format, "key_format");
    problem.cache = paged_pool(check, p.cache, p.block_size, key_entry_bytes(p.key_format),
                               format_name(p.key_format));
  }
  problem.key_format = p.key_format;
  problem.rotate = p.rotate;
  if (!(p.norm_eps >= 0.0f) || p.norm_eps == INFINITY) {
    check.fail("option 'norm_eps' must be finite and >= 0, got " + std::to_string(p.norm_eps));
  }
  problem.norm_eps = p.norm_eps;
  problem.invalid_count = counter(check, p.invalid_count);

  check.disjoint_outputs(outputs, inputs);
  return problem;
}

const char* compress_operation(int count, int i, bool with_store) {
  if (with_store) {
    if (count == 1) return "hdk::dsv4::store_and_compress (compressor)";
    return i == 0 ? "hdk::dsv4::store_and_compress (first compressor)"
                  : "hdk::dsv4::store_and_compress (second compressor)";
  }
  if (count == 1) return "hdk::dsv4::compress";
  return i == 0 ? "hdk::dsv4::compress (first call)" : "hdk::dsv4::compress (second call)";
}

namespace {

// One call of a launch that runs several, as the check below sees it: what it reads and writes
// (views of arrays the caller keeps).
struct LaunchedCall {
  const char* name;  // "first call", "store", ...
  NamedViews inputs, outputs;
  const TensorView* counter;  // one of `outputs`: calls may share their counters
  Device device;
};

// A compressor call's argument lists, kept while a LaunchedCall refers to them.
struct CompressorViews {
  std::array<NamedView, 9> inputs{};
  std::array<NamedView, 3> outputs{};
};

CompressorViews compressor_views(const CompressorParams& p) {
  return {compressor_inputs(p), compressor_outputs(p)};
}

LaunchedCall launched_compressor(const CompressorViews& views, const CompressorParams& p,
                                 const char* name) {
  return {name,
          {views.inputs.data(), views.inputs.size()},
          {views.outputs.data(), views.outputs.size()},
          &p.invalid_count,
          p.state.device};
}

// The calls of one launch run at once: all on one device, and no call writing memory another
// reads or writes (the shared invalid counter aside). Allocates nothing unless it throws.
void check_calls_apart(const ArgumentChecks& check, const LaunchedCall* calls, size_t count) {
  for (size_t c = 1; c < count; ++c) {
    if (!(calls[c].device == calls[0].device)) {
      check.fail("the calls must be on one device, got " + calls[0].device.str() + " (" +
                 calls[0].name + ") and " + calls[c].device.str() + " (" + calls[c].name + ")");
    }
  }
  for (size_t a = 0; a < count; ++a) {
    for (size_t b = 0; b < count; ++b) {
      if (a == b) continue;
      const LaunchedCall& own = calls[a];
      const LaunchedCall& other = calls[b];
      for (const NamedView& out : own.outputs) {
        for (const NamedViews seen_views : {other.inputs, other.outputs}) {
          for (const NamedView& seen : seen_views) {
            if (out.view == own.counter && seen.view == other.counter) continue;
            check.no_overlap(own.name, out, other.name, seen);
          }
        }
      }
    }
  }
}

}  // namespace

std::array<CompressorProblem, 2> validate_compress_pair(const CompressorParams& first,
                                                        const CompressorParams& second) {
  const std::array<CompressorProblem, 2> problems = {
      validate_compress(first, compress_operation(2, 0)),
      validate_compress(second, compress_operation(2, 1))};
  const CompressorViews first_views = compressor_views(first);
  const CompressorViews second_views = compressor_views(second);
  const std::array<LaunchedCall, 2> calls = {
      launched_compressor(first_views, first, "first call"),
      launched_compressor(second_views, second, "second call")};
  check_calls_apart(ArgumentChecks("hdk::dsv4::compress"), calls.data(), calls.size());
  return problems;
}

LayerWritesProblem validate_store_and_compress(const StoreEntriesParams& store,
                                               const CompressorParams* const* compressors,
                                               int count) {
  LayerWritesProblem problem;
  problem.store = validate_store_entries(store, kStoreAndCompressStore);
  const std::array<NamedView, 2> inputs = store_inputs(store);
  const std::array<NamedView, 2> outputs = store_outputs(store);
  std::array<LaunchedCall, 3> calls = {};
  calls[0] = {"store",
              {inputs.data(), inputs.size()},
              {outputs.data(), outputs.size()},
              &store.invalid_count,
              store.cache.device};
  std::array<CompressorViews, 2> views;
  for (int i = 0; i < count; ++i) {
    problem.compressors[i] =
        validate_compress(*compressors[i], compress_operation(count, i, /*with_store=*/true));
    views[i] = compressor_views(*compressors[i]);
    calls[1 + i] = launched_compressor(views[i], *compressors[i],
                                       count == 1 ? "compressor"
                                       : i == 0   ? "first compressor"
                                                  : "second compressor");
  }
  check_calls_apart(ArgumentChecks("hdk::dsv4::store_and_compress"), calls.data(),
                    static_cast<size_t>(1 + count));
  return problem;
}

namespace {

// "name[n]" for a one-column index tensor, "name[n, l]" otherwise.
std::string index_position(const char* name, const IndexView& index, int64_t columns, int64_t row,
                           int64_t column) {
  const bool one_column = columns == 1 && index.column_stride == 0;
  return name + (one_column ? "[" + text(row) + "]" : shape_string({row, column}));
}

}  // namespace

void check_slots(const char* operation, const IndexView& slots, int64_t rows, int64_t columns,
                 const PagedPool& pool, SlotUse use, const char* name) {
  const ArgumentChecks check(operation);
  // (slot, flat position) of every slot the call writes, to find one written twice.
  std::vector<std::pair<int64_t, int64_t>> written;
  for (int64_t n = 0; n < rows; ++n) {
    for (int64_t l = 0; l < columns; ++l) {
      const int64_t slot = slots.at(n, l);
      if (slot >= pool.num_slots()) {
        check.fail(index_position(name, slots, columns, n, l) + " = " + text(slot) +
                   " is beyond the cache, which has " + text(pool.num_blocks) + " blocks of " +
                   text(pool.block_size) + " entries (expected a negative value or 0.." +
                   text(pool.num_slots() - 1) + ")");
      }
      if (use == SlotUse::kWrite && slot >= 0) written.emplace_back(slot, n * columns + l);
    }
  }
  std::sort(written.begin(), written.end());
  for (size_t i = 1; i < written.size(); ++i) {
    if (written[i].first != written[i - 1].first) continue;
    const int64_t first = written[i - 1].second;
    const int64_t second = written[i].second;
    check.fail(index_position(name, slots, columns, second / columns, second % columns) + " = " +
               text(written[i].first) + " repeats " +
               index_position(name, slots, columns, first / columns, first % columns) +
               ": the slots one call writes must be distinct (two rows writing one slot race on "
               "CUDA)");
  }
}

void check_compressor_indices(const CompressorProblem& p, const char* operation) {
  const ArgumentChecks check(operation);
  // (state slot, row) and (cache slot, row) of every live row, to find two rows sharing one.
  std::vector<std::pair<int64_t, int64_t>> state_users;
  std::vector<std::pair<int64_t, int64_t>> entry_writers;
  for (int64_t n = 0; n < p.num_rows; ++n) {
    const int64_t state_slot = p.state_slots.at(n);
    if (state_slot < 0) continue;
    if (state_slot >= p.num_states) {
      check.fail("state_slots[" + text(n) + "] = " + text(state_slot) +
                 " is beyond 'state', which has " + text(p.num_states) + " slots");
    }
    state_users.emplace_back(state_slot, n);
    const int64_t first = p.positions.at(n);
    if (first < 0) {
      check.fail("positions[" + text(n) + "] = " + text(first) + " is negative");
    }
    for (int64_t t = 0; t < p.num_tokens; ++t) {
      const int64_t position = first + t;
      if ((position + 1) % p.ratio != 0) continue;
      const int64_t entry = position / p.ratio;
      const int64_t window_start = entry * p.ratio;
      if (window_start >= p.max_position) {
        check.fail("positions[" + text(n) + "] + " + text(t) +
                   " completes the window starting at " + text(window_start) +
                   ", beyond the RoPE tables' " + text(p.max_position) + " rows");
      }
      const int64_t page = entry / p.cache.block_size;
      if (page >= p.max_blocks) {
        check.fail("row " + text(n) + " writes entry " + text(entry) + " on page " + text(page) +
                   " of its block table, which has " + text(p.max_blocks) + " columns");
      }
      const int64_t block = p.block_table.at(n, page);
      if (block < 0 || block >= p.cache.num_blocks) {
        check.fail("block_table[" + text(n) + ", " + text(page) + "] = " + text(block) +
                   " (for entry " + text(entry) + ") is not a block of 'cache', which has " +
                   text(p.cache.num_blocks) + " blocks");
      }
      entry_writers.emplace_back(block * p.cache.block_size + entry % p.cache.block_size, n);
    }
  }
  std::sort(state_users.begin(), state_users.end());
  for (size_t i = 1; i < state_users.size(); ++i) {
    if (state_users[i].first != state_users[i - 1].first) continue;
    check.fail("state_slots[" + text(state_users[i].second) + "] = " + text(state_users[i].first) +
               " repeats state_slots[" + text(state_users[i - 1].second) +
               "]: the rows of one call must have distinct state slots (two rows updating one "
               "state race on CUDA)");
  }
  std::sort(entry_writers.begin(), entry_writers.end());
  for (size_t i = 1; i < entry_writers.size(); ++i) {
    if (entry_writers[i].first != entry_writers[i - 1].first) continue;
    check.fail("rows " + text(entry_writers[i - 1].second) + " and " +
               text(entry_writers[i].second) + " both write cache slot " +
               text(entry_writers[i].first) +
               " (through their block tables): the slots one call writes must be distinct (two "
               "rows writing one slot race on CUDA)");
  }
}

}  // namespace detail

int64_t key_bytes(KeyFormat format) {
  return detail::key_entry_bytes(format);
}

int64_t compressor_accumulators(int64_t ratio) {
  return ratio == 4 ? 3 : 1;
}

}  // namespace dsv4
}  // namespace hdk
