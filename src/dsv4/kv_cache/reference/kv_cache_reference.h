// The float64 / bit-exact oracle of the KV cache operations (hdk/dsv4/kv_cache.h), for tests and
// `hdk-bench kv --verify`. The byte formats are encoded by searching the nearest representable
// value (no bit tricks), the compressor keeps the spec's raw rows and takes the softmax over them
// in float64. Slow on purpose; shares no semantics code with the backends.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace dsv4 {

// Same contracts as the public functions for CPU tensors (validated first; out-of-range slots
// are an hdk::Error as on the CPU backend).
void store_entries_reference(const StoreEntriesParams& params);
void gather_entries_reference(const GatherEntriesParams& params);
void store_indexer_keys_reference(const StoreIndexerKeysParams& params);
void gather_indexer_keys_reference(const GatherIndexerKeysParams& params);

// One entry's bytes, laid out as in a page of block_size 1 (584 bytes), from float64 values.
// Returns true when the entry holds a NaN or infinity (stored as NaN markers).
bool encode_entry_reference(const double* values, uint8_t* entry_bytes);
// One key's bytes (68, 72 or 132 = key_bytes(format): data then scales, as in a page of
// block_size 1; kFP8: 128 E4M3 codes, then the little-endian fp32 scale) from 128 values already
// rotated as wanted. Returns true for a non-finite key.
bool encode_key_reference(const double* values, KeyFormat format, uint8_t* key_bytes);
// H_128 / sqrt(128) x, Sylvester order, in float64.
std::vector<double> hadamard_reference(const std::vector<double>& x);

// Decoded values of one stored entry / key (NaN where the format marks NaN).
std::vector<double> decode_entry_reference(const uint8_t* page, int64_t block_size, int64_t offset);
std::vector<double> decode_key_reference(const uint8_t* page, int64_t block_size, int64_t offset,
                                         KeyFormat format);

// The compressor over whole sequences, in float64, keeping the spec's rows. One instance follows
// the state slots of one layer and compressor across calls.
class CompressorReference {
 public:
  CompressorReference(int64_t ratio, int64_t dim);

  struct Entry {
    int64_t state_slot = 0;
    int64_t row = 0;             // batch row of the call that completed it
    int64_t index = 0;           // compressed slot within the request (position / ratio)
    int64_t slot = 0;            // flat slot in the cache
    std::vector<double> value;   // d values after RMSNorm and RoPE (before rotation / quantizing)
    std::vector<double> stored;  // what is quantized: value, or its Hadamard rotation (rotate)
    bool nonfinite = false;
  };

  // Runs one call over host tensors: updates the rows, writes every completed entry's bytes
  // (reference encoders) into params.cache, adds to params.invalid_count, and returns the entries.
  std::vector<Entry> run(const CompressorParams& params);

  // The state slot's accumulators in hdk's layout ([A, 3, d] floats, docs/dsv4-kv-cache.md) for a
  // request whose next position is `next_position`, from the rows seen so far; lets a backend
  // continue a sequence the reference started.
  std::vector<float> export_state(int64_t state_slot, int64_t next_position) const;

 private:
  struct Rows {
    // Per window index: kv and score (ape added) rows of its tokens, [ratio][width].
    std::map<int64_t, std::vector<std::vector<double>>> kv, score;
  };
  int64_t ratio_, dim_;
  bool overlap_;
  std::map<int64_t, Rows> rows_;  // by state slot
};

}  // namespace dsv4
}  // namespace hdk
