// DeepSeek-V4 KV cache, write side: quantized paged pools (FlashMLA's MODEL1 entries, the SWA
// ring), the FP4 indexer keys, and the compressor that turns every `ratio` tokens of a request
// into one compressed entry. Byte formats: docs/spec.md, "KV cache and storage formats"; the
// contract case by case, the state layout and how an engine wires the calls: docs/dsv4-kv-cache.md.
//
// Every call runs on the device its tensors live on (all on the CPU, or all on one CUDA device),
// allocates nothing, never synchronizes the host and can be captured in a CUDA graph.
#pragma once

#include <cstdint>

#include "hdk/cuda_stream.h"
#include "hdk/tensor_view.h"

namespace hdk {
namespace dsv4 {

constexpr int64_t kHeadDim = 512;        // one compressed / SWA entry: 448 + 64 values
constexpr int64_t kNopeDim = 448;        // stored as FP8 E4M3, 7 groups of 64 with UE8M0 scales
constexpr int64_t kRopeDim = 64;         // stored as bf16
constexpr int64_t kEntryBytes = 584;     // 448 FP8 + 128 bf16 + 7 scales + 1 pad
constexpr int64_t kIndexerKeyDim = 128;  // values per indexer key
constexpr int64_t kMxfp4KeyBytes = 68;   // 64 packed E2M1 + 4 UE8M0 scales (groups of 32)
constexpr int64_t kNvfp4KeyBytes = 72;   // 64 packed E2M1 + 8 E4M3 scales (groups of 16)
constexpr int64_t kFp8KeyBytes = 132;    // 128 E4M3 + one fp32 scale (DeepGEMM's Hopper layout)

// Relative error bound of one stored non-RoPE value after dequantization, |x' - x| <= 2^-4 |x|,
// for every |x| >= 2^-6 * scale of its group (FP8 E4M3 keeps 3 mantissa bits; scales are chosen
// so no value saturates); smaller values have an absolute error of at most 2^-10 * scale.
constexpr double kFp8RelativeErrorBound = 0.0625;

// ---- Compressed / SWA entries (MODEL1) ------------------------------------------------------
// A page of `block_size` entries is block_size * 584 bytes: entry i's 448 FP8 values at
// [i*576, i*576+448), its 64 bf16 RoPE values at [i*576+448, i*576+576), its 7 scale bytes and a
// zero pad byte at block_size*576 + i*8. Flat slot = block * block_size + offset.

struct StoreEntriesParams {
  TensorView
      values;  // [N, 512] fp32 or bf16: 448 non-RoPE values, then 64 RoPE; last dim contiguous
  TensorView slots;  // [N] int32/int64: flat slot, distinct; negative: the row is skipped
  TensorView cache;  // [num_blocks, block_size * 584] uint8, last dim contiguous
  int64_t block_size = 0;
  // Optional [1] or scalar int32/int64 counter; hdk adds, never clears. +1 per row that holds a
  // NaN or infinity (stored as NaN markers, see docs) and, on CUDA, per row whose slot is beyond
  // the cache (skipped; the CPU throws hdk::Error for such a slot before writing anything).
  TensorView invalid_count;
  // Debug option for CUDA tensors: copy the indices to the host first (a synchronization) and
  // throw hdk::Error for one out of range or repeated, as the CPU does. Never inside CUDA-graph
  // capture.
  bool check_indices = false;
};

void store_entries(const StoreEntriesParams& params);
void store_entries(const StoreEntriesParams& params, CudaStream stream);

struct GatherEntriesParams {
  TensorView cache;  // [num_blocks, block_size * 584] uint8, last dim contiguous
  int64_t block_size = 0;
  TensorView slots;  // [N, L] int32/int64; negative: a zero row
  TensorView out;    // [N, L, 512] fp32 or bf16, last dim contiguous: FP8 value x 2^(scale-127)
                     // for the 448 non-RoPE values, the stored bf16 for the 64 RoPE values
  // Optional counter: +1 per slot beyond the cache on CUDA (a zero row; the CPU throws).
  TensorView invalid_count;
  // Debug option for CUDA tensors: copy the indices to the host first (a synchronization) and
  // throw hdk::Error for one out of range, as the CPU does. Never inside CUDA-graph capture.
  bool check_indices = false;
};

void gather_entries(const GatherEntriesParams& params);
void gather_entries(const GatherEntriesParams& params, CudaStream stream);

// ---- Indexer keys (CSA layers) --------------------------------------------------------------
enum class KeyFormat {
  kMXFP4,  // 68 B: 64 B packed E2M1, then 4 UE8M0 scales (groups of 32); block_size*64 + i*4
  kNVFP4,  // 72 B: 64 B packed E2M1, then 8 E4M3 scales (groups of 16); block_size*64 + i*8
  // 132 B: 128 E4M3 at i*128, then one fp32 scale (a power of two when hdk stores it) at
  // block_size*128 + i*4: the page vLLM, SGLang and DeepGEMM's fp8_paged_mqa_logits use on Hopper.
  kFP8,
};

// Bytes one key takes in its page: kMxfp4KeyBytes, kNvfp4KeyBytes or kFp8KeyBytes.
int64_t key_bytes(KeyFormat format);

struct StoreIndexerKeysParams {
  TensorView keys;   // [N, 128] fp32 or bf16, last dim contiguous
  TensorView slots;  // [N] int32/int64, distinct; negative: skipped
  TensorView cache;  // [num_blocks, block_size * key_bytes(format)] uint8, last dim contiguous
  int64_t block_size = 0;
  KeyFormat format = KeyFormat::kMXFP4;
  bool rotate = true;  // apply H_128 / sqrt(128) (Sylvester order) before quantizing
  TensorView invalid_count;
  // Debug option for CUDA tensors: copy the indices to the host first (a synchronization) and
  // throw hdk::Error for one out of range or repeated, as the CPU does. Never inside CUDA-graph
  // capture.
  bool check_indices = false;
};

void store_indexer_keys(const StoreIndexerKeysParams& params);
void store_indexer_keys(const StoreIndexerKeysParams& params, CudaStream stream);

// The decoder of stored keys (what the indexer reads): out = E2M1 value x its group's scale
// (kFP8: E4M3 value x the key's fp32 scale, whatever fp32 the page holds), in the rotated basis
// (no inverse rotation); NaN markers decode to NaN.
struct GatherIndexerKeysParams {
  TensorView cache;
  int64_t block_size = 0;
  TensorView slots;  // [N, L] int32/int64; negative: a zero row
  TensorView out;    // [N, L, 128] fp32 or bf16, last dim contiguous
  KeyFormat format = KeyFormat::kMXFP4;
  TensorView invalid_count;
  // Debug option for CUDA tensors: copy the indices to the host first (a synchronization) and
  // throw hdk::Error for one out of range, as the CPU does. Never inside CUDA-graph capture.
  bool check_indices = false;
};

void gather_indexer_keys(const GatherIndexerKeysParams& params);
void gather_indexer_keys(const GatherIndexerKeysParams& params, CudaStream stream);

// ---- Compressor -----------------------------------------------------------------------------
// One call per CSA / HCA layer and compressor per decode step. For each batch row n (one
// request) and each of its T tokens (position positions[n] + t), the token's kv and score rows
// (score + ape[pos % ratio]) are folded into the request's state; when a window of `ratio`
// tokens completes ((pos + 1) % ratio == 0) the entry is formed (CSA, ratio 4: one softmax per
// channel over the previous window's first d channels and the current window's last d; other
// ratios: one softmax over the window), RMS-normalized with norm_weight, RoPE-rotated on its last
// 64 channels at the window's first position, quantized and written to compressed slot
// pos / ratio through block_table[n]: a MODEL1 entry for d = 512, an indexer key (rotated by the
// Hadamard transform when `rotate`) for d = 128.
//
// The state keeps, per channel, an online softmax (running max, sum of exponentials, weighted
// sum of kv): [num_states, A, 3, d] fp32 with A = 3 for CSA (first-d channels of even windows,
// of odd windows, last-d channels of the current window) and A = 1 otherwise. A window's
// accumulators start over at its first token, so a state slot needs no reset between requests;
// docs/dsv4-kv-cache.md has the layout.
struct CompressorParams {
  TensorView kv;           // [N, T, coff*d] or [N, coff*d] fp32/bf16; coff = 2 for ratio 4, else 1
  TensorView score;        // same shape and dtype as kv: x·W_gateᵀ without ape
  TensorView ape;          // [ratio, coff*d] fp32: added to score of the token at pos % ratio
  TensorView positions;    // [N] int32/int64: position of the row's first token
  TensorView state_slots;  // [N] int32/int64: the request's state, distinct; negative: padding
  TensorView state;        // [num_states, A, 3, d] fp32, contiguous per state slot
  TensorView norm_weight;  // [d] fp32
  TensorView rope_cos;     // [max_position, 32] fp32, row = the window's first position
  TensorView rope_sin;     // [max_position, 32] fp32
  TensorView block_table;  // [N, max_blocks] int32: the row's pages of `cache`
  TensorView cache;        // d = 512: [num_blocks, block_size*584]; d = 128: key_bytes per entry
  int64_t block_size = 0;
  int64_t ratio = 4;  // 4 (CSA, overlapping windows) or 2 .. 128 (HCA: 128)
  float norm_eps = 1e-6f;
  KeyFormat key_format = KeyFormat::kMXFP4;  // d = 128 only
  bool rotate = true;                        // d = 128 only
  // Optional counter: +1 per entry stored with NaN markers (a NaN or infinity reached it) and, on
  // CUDA, per row with a state slot, position, page or block id out of range (the whole row is
  // skipped, its state untouched; the CPU throws hdk::Error before writing anything).
  TensorView invalid_count;
  // Debug option for CUDA tensors: copy the indices to the host first (a synchronization) and
  // throw hdk::Error for one out of range, or for two rows sharing a state slot or writing one
  // cache slot, as the CPU does. Never inside CUDA-graph capture.
  bool check_indices = false;
};

void compress(const CompressorParams& params);
void compress(const CompressorParams& params, CudaStream stream);

// Two compressor calls in one launch, such as a CSA layer's main (d = 512) and indexer (d = 128)
// compressors: the same bytes and counts as compress(first) then compress(second), where on CUDA
// the second call's rows do not wait for the first's. Neither call may write memory the other
// reads or writes (an hdk::Error names the call and the argument); the two may share
// invalid_count. Every check of either call runs before anything is written.
void compress(const CompressorParams& first, const CompressorParams& second);
void compress(const CompressorParams& first, const CompressorParams& second, CudaStream stream);

// A CSA or HCA layer's cache writes of one decode step in one launch: store_entries(store) (the
// step's SWA entries) with the layer's compressor calls (HCA: one; CSA: the main and the indexer
// compressors). The same bytes and counts as store_entries(store) then compress(...), where on
// CUDA no call's rows wait for another's: the store no longer costs a launch of its own. No call
// may write memory another reads or writes, so the SWA ring must be a tensor apart from the
// compressed pools (an hdk::Error names the calls and the arguments); the calls may share
// invalid_count. Every check of every call runs before anything is written.
void store_and_compress(const StoreEntriesParams& store, const CompressorParams& compressor);
void store_and_compress(const StoreEntriesParams& store, const CompressorParams& compressor,
                        CudaStream stream);
void store_and_compress(const StoreEntriesParams& store, const CompressorParams& first,
                        const CompressorParams& second);
void store_and_compress(const StoreEntriesParams& store, const CompressorParams& first,
                        const CompressorParams& second, CudaStream stream);

// Accumulators per state slot: 3 for ratio 4 (CSA), else 1.
int64_t compressor_accumulators(int64_t ratio);

}  // namespace dsv4
}  // namespace hdk
