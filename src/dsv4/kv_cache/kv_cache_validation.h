// The one place that checks the KV cache operations' calls (kv_cache.h); every backend and the
// reference call it. Each function checks ranks, shapes, dtypes, strides, devices, options and
// aliasing, throws hdk::Error naming the argument, the expectation and what was given, and reads
// no tensor data. The check_* functions are the CPU's data checks (index ranges), run on the host
// before anything is written; the CUDA backend counts such rows in invalid_count instead.
#pragma once

#include <array>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/argument_checks.h"
#include "dsv4/kv_cache/kv_cache_problem.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/tensor_view.h"

namespace hdk {
namespace dsv4 {
namespace detail {

StoreEntriesProblem validate_store_entries(const StoreEntriesParams& params,
                                           const char* operation = "hdk::dsv4::store_entries");
GatherEntriesProblem validate_gather_entries(const GatherEntriesParams& params);
StoreKeysProblem validate_store_indexer_keys(const StoreIndexerKeysParams& params);
GatherKeysProblem validate_gather_indexer_keys(const GatherIndexerKeysParams& params);
// How errors name compressor call i of `count` (1 or 2) in one launch, with or without a store
// (store_and_compress), and that launch's store.
const char* compress_operation(int count, int i, bool with_store = false);
constexpr const char* kStoreAndCompressStore = "hdk::dsv4::store_and_compress (store)";
CompressorProblem validate_compress(const CompressorParams& params,
                                    const char* operation = "hdk::dsv4::compress");
// Two calls of one launch: each validated as a call of its own (errors name it "first" or
// "second"), both on one device, and neither writing memory the other reads or writes (the
// invalid counter may be shared).
std::array<CompressorProblem, 2> validate_compress_pair(const CompressorParams& first,
                                                        const CompressorParams& second);

// store_and_compress: the store and `count` (1 or 2) compressor calls, each validated as a call
// of its own (errors name it), all on one device, and no call writing memory another reads or
// writes (the invalid counter may be shared).
LayerWritesProblem validate_store_and_compress(const StoreEntriesParams& store,
                                               const CompressorParams* const* compressors,
                                               int count);

// Pieces of the checks above that the read side (attention_validation.cpp) shares.
// `name`: [num_blocks, block_size * entry_bytes] uint8, last dim contiguous; `format` names the
// entries in the message, `block_size_name` the option that gave block_size.
PagedPool paged_pool(const hdk::detail::ArgumentChecks& check, const TensorView& cache,
                     int64_t block_size, int64_t entry_bytes, const char* format,
                     const char* name = "cache", const char* block_size_name = "block_size");
// An int32/int64 index tensor of exactly `shape`.
IndexView index_view(const hdk::detail::ArgumentChecks& check, const TensorView& view,
                     const char* name, const std::vector<int64_t>& shape, const char* dims);
// The optional invalid_count: [1] or scalar int32/int64.
Counter counter(const hdk::detail::ArgumentChecks& check, const TensorView& view);
const char* format_name(KeyFormat format);
// `format` (the option called `name`) is one of the three KeyFormats.
void check_key_format(const hdk::detail::ArgumentChecks& check, KeyFormat format, const char* name);

// Whether a call reads the slots it is given or writes them: two rows writing one slot race on
// CUDA and leave whichever wrote last, so the slots a call writes must be distinct.
enum class SlotUse { kRead, kWrite };

// Slot [row, column] of `slots` (called `name` in the message) must be negative or below
// pool.num_slots(); with SlotUse::kWrite no two of them may be one slot.
void check_slots(const char* operation, const IndexView& slots, int64_t rows, int64_t columns,
                 const PagedPool& pool, SlotUse use, const char* name = "slots");
// Positions, pages and slots every live token of the call will use; no two rows may share a state
// slot or write one cache entry.
void check_compressor_indices(const CompressorProblem& host_problem,
                              const char* operation = "hdk::dsv4::compress");

}  // namespace detail
}  // namespace dsv4
}  // namespace hdk
