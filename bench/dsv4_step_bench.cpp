// hdk-bench dsv4-step: one DeepSeek-V4 layer's decode step as an engine runs it, every call of
// the layer captured in one CUDA graph and replayed with L2 flushed before each replay (see
// bench_device.h), next to each of its calls alone in its own graph. Layers
// (docs/dsv4-attention.md, "A whole DeepSeek-V4 decode step with hdk"):
//   swa: store_entries of the step's entry into the SWA ring, sparse_decode over the window;
//   csa: the SWA store and compress (main d = 512 and indexer d = 128, ratio 4) in one launch
//        (store_and_compress; --writes pair: the store, then both compressors in one launch;
//        --writes apart: three launches), index_topk with topk_slots, sparse_decode over the
//        window + the top-k;
//   hca: the SWA store and compress (d = 512, ratio 128) in one launch (--writes pair or apart:
//        two), sparse_decode over the window + every compressed entry;
//   moe: the router (fused gate GEMM + top-6), a row of its own.
// Every request has its own pages (shuffled), ring page and compressor state. Each row's step
// token sits at position context - 1, where a ratio-4 and a ratio-128 window both complete: the
// states hold the window's earlier tokens (put back before every replay, outside the timed span),
// so the compress calls write real entries that index_topk and sparse_decode then read.
//
// Floor = one empty-kernel graph replay + bytes / copy bandwidth, both measured at the start of
// the run; the step's floor counts one replay for the whole graph.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bench_cli.h"
#include "bench_device.h"
#include "dsv4_bench_data.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/dsv4/router.h"

#ifdef HDK_WITH_CUDA
#include "core/cuda_helpers.h"
#endif

namespace hdk {
namespace bench {
namespace {

struct StepPreset {
  const char* name;
  int64_t heads;   // sparse_decode query heads
  int64_t top_k;   // index_topk's selection, the CSA list's compressed part
  int64_t hidden;  // router input width
  int64_t experts;
  float route_scale;
};

const StepPreset kStepPresets[] = {{"flash", 64, 512, 4096, 256, 1.5f},
                                   {"pro", 128, 1024, 7168, 384, 2.5f}};

constexpr int64_t kWindow = 128;  // SWA entries, one ring page per request
constexpr int64_t kCsaRatio = 4;
constexpr int64_t kHcaRatio = 128;
constexpr int64_t kBlockSize = 64;  // pages of the compressed pools and of the key pool
constexpr int64_t kKeyBytes = dsv4::kMxfp4KeyBytes;
constexpr int64_t kRouterTopK = 6;
constexpr int64_t kMaxHeads = 128;
constexpr int64_t kMaxTopK = 1024;
constexpr uint8_t kPoison = 0xFF;  // FP8 NaN codes: what an entry the step did not write reads

constexpr int64_t kDeviceDefault = INT64_MIN;  // an option left to the device's default

const char* const kLayers[] = {"swa", "csa", "hca", "moe"};

using Buffer = std::unique_ptr<DeviceAllocation>;

// Uploads `num_blocks` pages of `page_bytes` by repeating `chunk` (whole pages): a long-context
// pool is GBs, and the kernels read bytes, not their history.
void upload_pages(BenchDevice& device, void* target, int64_t num_blocks, int64_t page_bytes,
                  const std::vector<uint8_t>& chunk) {
  const int64_t chunk_blocks = static_cast<int64_t>(chunk.size()) / page_bytes;
  for (int64_t b = 0; b < num_blocks; b += chunk_blocks) {
    const int64_t count = std::min(chunk_blocks, num_blocks - b);
    device.upload(static_cast<uint8_t*>(target) + b * page_bytes, chunk.data(),
                  static_cast<size_t>(count * page_bytes));
  }
}

// One compressor of the layer kinds (CSA main, CSA indexer, HCA) for up to max_rows requests,
// with the calls that fill its window up to the step token.
struct Compressor {
  const char* name;
  int64_t ratio = 0, dim = 0, width = 0, accumulators = 0, entry_bytes = 0;
  Buffer state, ape, norm, step_kv, step_score;
  struct Prime {
    int64_t tokens = 0;
    Buffer kv, score, positions;
  };
  // CSA: the previous window (its first-d channels feed the step's entry) and the current
  // window's first 3 tokens; HCA: the current window's first 127 tokens.
  std::vector<Prime> primes;
};

// What every point of one context shares: the pools, tables, step inputs and compressors for the
// largest N of the run. A point of N rows uses the first N of everything.
class ContextInputs {
 public:
  ContextInputs(BenchDevice& device, int64_t context, int64_t max_rows)
      : device_(device), context_(context), max_rows_(max_rows), where_(device.device()) {
    std::mt19937_64 rng(static_cast<uint64_t>(context * 31 + max_rows));
    FastRandom random(static_cast<uint64_t>(context + max_rows));
    csa_entries_ = context / kCsaRatio;
    hca_entries_ = context / kHcaRatio;
    csa_pages_ = (csa_entries_ + kBlockSize - 1) / kBlockSize;
    hca_pages_ = (hca_entries_ + kBlockSize - 1) / kBlockSize;
    const int64_t csa_blocks = max_rows * csa_pages_, hca_blocks = max_rows * hca_pages_;

    // Pools of valid random entries and keys.
    std::vector<uint8_t> chunk;
    fill_entry_pages(chunk, std::min<int64_t>(csa_blocks, 1024), kBlockSize, random);
    csa_pool_ = make(csa_blocks * kBlockSize * dsv4::kEntryBytes, nullptr);
    upload_pages(device_, csa_pool_->get(), csa_blocks, kBlockSize * dsv4::kEntryBytes, chunk);
    hca_pool_ = make(hca_blocks * kBlockSize * dsv4::kEntryBytes, nullptr);
    upload_pages(device_, hca_pool_->get(), hca_blocks, kBlockSize * dsv4::kEntryBytes, chunk);
    fill_entry_pages(chunk, max_rows, kWindow, random);
    ring_ = make(chunk.size(), chunk.data());
    fill_key_pages(chunk, std::min<int64_t>(csa_blocks, 4096), kBlockSize, random);
    key_pool_ = make(csa_blocks * kBlockSize * kKeyBytes, nullptr);
    upload_pages(device_, key_pool_->get(), csa_blocks, kBlockSize * kKeyBytes, chunk);

    // Each request's own pages and ring page, in no particular order; the window and the HCA
    // list in position order.
    csa_table_host_ = shuffled_blocks(csa_blocks, rng);
    hca_table_host_ = shuffled_blocks(hca_blocks, rng);
    ring_pages_ = shuffled_blocks(max_rows, rng);
    csa_table_ = make(csa_table_host_.size() * 4, csa_table_host_.data());
    hca_table_ = make(hca_table_host_.size() * 4, hca_table_host_.data());
    const int64_t p = step_position();
    std::vector<int32_t> window(static_cast<size_t>(max_rows * kWindow));
    std::vector<int32_t> hca_list(static_cast<size_t>(max_rows * hca_entries_));
    std::vector<int64_t> swa_slots(static_cast<size_t>(max_rows)),
        state_slots(static_cast<size_t>(max_rows));
    for (int64_t n = 0; n < max_rows; ++n) {
      for (int64_t j = 0; j < kWindow; ++j)
        window[n * kWindow + j] =
            static_cast<int32_t>(ring_pages_[n] * kWindow + (p - kWindow + 1 + j) % kWindow);
      for (int64_t s = 0; s < hca_entries_; ++s)
        hca_list[n * hca_entries_ + s] = static_cast<int32_t>(
            hca_table_host_[n * hca_pages_ + s / kBlockSize] * kBlockSize + s % kBlockSize);
      swa_slots[n] = ring_pages_[n] * kWindow + p % kWindow;
      state_slots[n] = n;
    }
    window_ = make(window.size() * 4, window.data());
    hca_list_ = make(hca_list.size() * 4, hca_list.data());
    swa_slots_ = make(swa_slots.size() * 8, swa_slots.data());
    state_slots_ = make(static_cast<size_t>(max_rows) * 8, state_slots.data());
    const std::vector<int64_t> positions(static_cast<size_t>(max_rows), p);
    positions_ = make(positions.size() * 8, positions.data());
    const std::vector<int32_t> counts(static_cast<size_t>(max_rows),
                                      static_cast<int32_t>(csa_entries_));
    num_entries_ = make(counts.size() * 4, counts.data());

    // Step inputs (bf16, as an engine's projections give them) and outputs, for the largest
    // preset.
    auto bf16 = [&](int64_t count, float sigma) {
      const std::vector<uint16_t> values = normal_bf16(rng, count, sigma);
      return make(values.size() * 2, values.data());
    };
    swa_values_ = bf16(max_rows * dsv4::kHeadDim, 1.0f);
    q_ = bf16(max_rows * kMaxHeads * dsv4::kHeadDim, 1.0f);
    index_q_ = bf16(max_rows * dsv4::kIndexerHeads * dsv4::kIndexerKeyDim, 1.0f);
    const std::vector<float> weights = normal_floats(rng, max_rows * dsv4::kIndexerHeads, 0.1f);
    index_weights_ = make(weights.size() * 4, weights.data());
    const std::vector<float> sink = normal_floats(rng, kMaxHeads, 2.0f);
    sink_ = make(sink.size() * 4, sink.data());
    out_ = make(static_cast<size_t>(max_rows * kMaxHeads * dsv4::kHeadDim * 2), nullptr);
    lse_ = make(static_cast<size_t>(max_rows * kMaxHeads * 4), nullptr);
    topk_indices_ = make(static_cast<size_t>(max_rows * kMaxTopK * 4), nullptr);
    topk_slots_ = make(static_cast<size_t>(max_rows * kMaxTopK * 4), nullptr);
    counter_ = make(8, nullptr);

    // RoPE tables up to the step's window starts; the compressors.
    std::vector<float> cos(static_cast<size_t>(context * 32)), sin(cos.size());
    for (int64_t position = 0; position < context; ++position) {
      for (int64_t i = 0; i < 32; ++i) {
        const double angle = position * std::pow(10000.0, -i / 32.0);
        cos[position * 32 + i] = static_cast<float>(std::cos(angle));
        sin[position * 32 + i] = static_cast<float>(std::sin(angle));
      }
    }
    rope_cos_ = make(cos.size() * 4, cos.data());
    rope_sin_ = make(sin.size() * 4, sin.data());
    csa_main_ = make_compressor("compress csa", kCsaRatio, dsv4::kHeadDim, rng);
    csa_index_ = make_compressor("compress index", kCsaRatio, dsv4::kIndexerKeyDim, rng);
    hca_ = make_compressor("compress hca", kHcaRatio, dsv4::kHeadDim, rng);
  }

  int64_t context() const { return context_; }
  int64_t step_position() const { return context_ - 1; }
  int64_t csa_entries() const { return csa_entries_; }
  int64_t hca_entries() const { return hca_entries_; }
  int64_t csa_capacity() const { return csa_pages_ * kBlockSize; }

  dsv4::StoreEntriesParams store(int64_t N) const {
    dsv4::StoreEntriesParams p;
    p.values = view(swa_values_, DType::kBFloat16, {N, dsv4::kHeadDim});
    p.slots = view(swa_slots_, DType::kInt64, {N});
    p.cache = view(ring_, DType::kUInt8, {max_rows_, kWindow * dsv4::kEntryBytes});
    p.block_size = kWindow;
    return p;
  }

  const Compressor& csa_main() const { return csa_main_; }
  const Compressor& csa_index() const { return csa_index_; }
  const Compressor& hca() const { return hca_; }

  // The compressor's step call (prime < 0) or one of the calls that fill its window.
  dsv4::CompressorParams compress(const Compressor& c, int64_t N, int prime = -1) const {
    const bool csa = c.ratio == kCsaRatio;
    const int64_t T = prime < 0 ? 1 : c.primes[static_cast<size_t>(prime)].tokens;
    dsv4::CompressorParams p;
    p.kv = view(prime < 0 ? c.step_kv : c.primes[static_cast<size_t>(prime)].kv, DType::kBFloat16,
                {N, T, c.width});
    p.score = view(prime < 0 ? c.step_score : c.primes[static_cast<size_t>(prime)].score,
                   DType::kBFloat16, {N, T, c.width});
    p.ape = view(c.ape, DType::kFloat32, {c.ratio, c.width});
    p.positions = view(prime < 0 ? positions_ : c.primes[static_cast<size_t>(prime)].positions,
                       DType::kInt64, {N});
    p.state_slots = view(state_slots_, DType::kInt64, {N});
    p.state = view(c.state, DType::kFloat32, {max_rows_, c.accumulators, 3, c.dim});
    p.norm_weight = view(c.norm, DType::kFloat32, {c.dim});
    p.rope_cos = view(rope_cos_, DType::kFloat32, {context_, 32});
    p.rope_sin = view(rope_sin_, DType::kFloat32, {context_, 32});
    const int64_t pages = csa ? csa_pages_ : hca_pages_;
    p.block_table = view(csa ? csa_table_ : hca_table_, DType::kInt32, {N, pages});
    const Buffer& pool = c.dim == dsv4::kIndexerKeyDim ? key_pool_ : csa ? csa_pool_ : hca_pool_;
    p.cache = view(pool, DType::kUInt8, {max_rows_ * pages, kBlockSize * c.entry_bytes});
    p.block_size = kBlockSize;
    p.ratio = c.ratio;
    p.key_format = dsv4::KeyFormat::kMXFP4;
    return p;
  }

  // Fills every compressor's window up to the step token: run before the first step and before
  // each replay of a graph holding a compress call.
  void prime(int64_t N, CudaStream stream) const {
    for (const Compressor* c : {&csa_main_, &csa_index_, &hca_}) {
      for (size_t i = 0; i < c->primes.size(); ++i)
        dsv4::compress(compress(*c, N, static_cast<int>(i)), stream);
    }
  }

  dsv4::IndexerParams index(int64_t N, int64_t top_k, const TensorView& workspace) const {
    dsv4::IndexerParams p;
    p.q = view(index_q_, DType::kBFloat16, {N, dsv4::kIndexerHeads, dsv4::kIndexerKeyDim});
    p.weights = view(index_weights_, DType::kFloat32, {N, dsv4::kIndexerHeads});
    p.key_cache = view(key_pool_, DType::kUInt8, {max_rows_ * csa_pages_, kBlockSize * kKeyBytes});
    p.block_size = kBlockSize;
    p.format = dsv4::KeyFormat::kMXFP4;
    p.block_table = view(csa_table_, DType::kInt32, {N, csa_pages_});
    p.num_entries = view(num_entries_, DType::kInt32, {N});
    p.top_k = top_k;
    p.topk_indices = view(topk_indices_, DType::kInt32, {N, top_k});
    p.topk_slots = view(topk_slots_, DType::kInt32, {N, top_k});
    p.workspace = workspace;
    return p;
  }

  // sparse_decode of a layer kind: the window over the ring (swa), plus the top-k slots (csa) or
  // every compressed entry (hca) over the layer's pool, the window then the extra list.
  dsv4::SparseDecodeParams attend(const std::string& layer, int64_t N, int64_t heads, int64_t top_k,
                                  const TensorView& workspace) const {
    dsv4::SparseDecodeParams p;
    p.q = view(q_, DType::kBFloat16, {N, heads, dsv4::kHeadDim});
    const TensorView ring = view(ring_, DType::kUInt8, {max_rows_, kWindow * dsv4::kEntryBytes});
    const TensorView window = view(window_, DType::kInt32, {N, kWindow});
    if (layer == "swa") {
      p.cache = ring;
      p.block_size = kWindow;
      p.indices = window;
    } else {
      const bool csa = layer == "csa";
      p.cache = view(csa ? csa_pool_ : hca_pool_, DType::kUInt8,
                     {max_rows_ * (csa ? csa_pages_ : hca_pages_), kBlockSize * dsv4::kEntryBytes});
      p.block_size = kBlockSize;
      p.indices = csa ? view(topk_slots_, DType::kInt32, {N, top_k})
                      : view(hca_list_, DType::kInt32, {N, hca_entries_});
      p.extra_cache = ring;
      p.extra_block_size = kWindow;
      p.extra_indices = window;
    }
    p.sink = view(sink_, DType::kFloat32, {heads});
    p.out = view(out_, DType::kBFloat16, {N, heads, dsv4::kHeadDim});
    p.lse = view(lse_, DType::kFloat32, {N, heads});
    p.workspace = workspace;
    return p;
  }

  TensorView counter() const { return view(counter_, DType::kInt64, {1}); }
  int64_t read_counter() const {
    int64_t value = 0;
    device_.download(&value, counter_->get(), 8);
    return value;
  }
  void clear_counter() const {
    const int64_t zero = 0;
    device_.upload(counter_->get(), &zero, 8);
  }

  // The value bytes of every entry the step writes for its first N rows, row by row: the SWA
  // entry (576), the CSA entry (576) and key (64), the HCA entry (576).
  std::vector<uint8_t> step_entries(int64_t N) const {
    std::vector<uint8_t> bytes;
    for_each_step_entry(N, [&](uint8_t* values, int64_t count) {
      bytes.resize(bytes.size() + static_cast<size_t>(count));
      device_.download(bytes.data() + bytes.size() - count, values, static_cast<size_t>(count));
    });
    return bytes;
  }

  void poison_step_entries(int64_t N) const {
    for_each_step_entry(N, [&](uint8_t* values, int64_t count) {
      const std::vector<uint8_t> poison(static_cast<size_t>(count), kPoison);
      device_.upload(values, poison.data(), poison.size());
    });
  }

 private:
  template <typename Visit>
  void for_each_step_entry(int64_t N, const Visit& visit) const {
    auto values = [](const Buffer& pool, int64_t page_entries, int64_t value_bytes,
                     int64_t entry_bytes, int64_t slot) {
      return static_cast<uint8_t*>(pool->get()) + slot / page_entries * page_entries * entry_bytes +
             slot % page_entries * value_bytes;
    };
    const int64_t p = step_position(), csa = csa_entries_ - 1, hca = hca_entries_ - 1;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t csa_slot =
          csa_table_host_[n * csa_pages_ + csa / kBlockSize] * kBlockSize + csa % kBlockSize;
      const int64_t hca_slot =
          hca_table_host_[n * hca_pages_ + hca / kBlockSize] * kBlockSize + hca % kBlockSize;
      const int64_t ring_slot = ring_pages_[n] * kWindow + p % kWindow;
      visit(values(ring_, kWindow, 576, dsv4::kEntryBytes, ring_slot), 576);
      visit(values(csa_pool_, kBlockSize, 576, dsv4::kEntryBytes, csa_slot), 576);
      visit(values(key_pool_, kBlockSize, 64, kKeyBytes, csa_slot), 64);
      visit(values(hca_pool_, kBlockSize, 576, dsv4::kEntryBytes, hca_slot), 576);
    }
  }

  Buffer make(size_t bytes, const void* host) {
    auto allocation = std::make_unique<DeviceAllocation>(device_, std::max<size_t>(bytes, 1));
    if (host != nullptr && bytes > 0) device_.upload(allocation->get(), host, bytes);
    return allocation;
  }

  TensorView view(const Buffer& buffer, DType dtype, std::initializer_list<int64_t> shape) const {
    return TensorView::contiguous(buffer->get(), dtype, shape, where_);
  }

  Compressor make_compressor(const char* name, int64_t ratio, int64_t dim, std::mt19937_64& rng) {
    Compressor c;
    c.name = name;
    c.ratio = ratio;
    c.dim = dim;
    c.width = ratio == kCsaRatio ? 2 * dim : dim;
    c.accumulators = dsv4::compressor_accumulators(ratio);
    c.entry_bytes = dim == dsv4::kIndexerKeyDim ? kKeyBytes : dsv4::kEntryBytes;
    const std::vector<float> state(static_cast<size_t>(max_rows_ * c.accumulators * 3 * dim), 0.f);
    c.state = make(state.size() * 4, state.data());
    const std::vector<float> ape = normal_floats(rng, ratio * c.width, 0.5f);
    c.ape = make(ape.size() * 4, ape.data());
    std::vector<float> norm = normal_floats(rng, dim, 0.1f);
    for (float& w : norm)
      w += 1.0f;
    c.norm = make(norm.size() * 4, norm.data());
    auto bf16 = [&](int64_t count) {
      const std::vector<uint16_t> values = normal_bf16(rng, count, 1.0f);
      return make(values.size() * 2, values.data());
    };
    c.step_kv = bf16(max_rows_ * c.width);
    c.step_score = bf16(max_rows_ * c.width);
    const int64_t p = step_position();
    // (first position, tokens) of each call that fills the window before the step token.
    std::vector<std::pair<int64_t, int64_t>> calls;
    if (ratio == kCsaRatio) calls.push_back({p + 1 - 2 * ratio, ratio});
    calls.push_back({p + 1 - ratio, ratio - 1});
    for (const auto& [first, tokens] : calls) {
      Compressor::Prime prime;
      prime.tokens = tokens;
      prime.kv = bf16(max_rows_ * tokens * c.width);
      prime.score = bf16(max_rows_ * tokens * c.width);
      const std::vector<int64_t> positions(static_cast<size_t>(max_rows_), first);
      prime.positions = make(positions.size() * 8, positions.data());
      c.primes.push_back(std::move(prime));
    }
    return c;
  }

  BenchDevice& device_;
  int64_t context_, max_rows_;
  Device where_;
  int64_t csa_entries_ = 0, hca_entries_ = 0, csa_pages_ = 0, hca_pages_ = 0;
  std::vector<int32_t> csa_table_host_, hca_table_host_, ring_pages_;
  Buffer csa_pool_, hca_pool_, ring_, key_pool_, csa_table_, hca_table_, window_, hca_list_,
      swa_slots_, state_slots_, positions_, num_entries_, swa_values_, q_, index_q_, index_weights_,
      sink_, out_, lse_, topk_indices_, topk_slots_, counter_, rope_cos_, rope_sin_;
  Compressor csa_main_, csa_index_, hca_;
};

// Bytes each call must move at least: its inputs read, its outputs written (the floor's bytes).
double store_bytes(int64_t N) {
  return N * (dsv4::kHeadDim * 2.0 + 8 + dsv4::kEntryBytes);  // bf16 row, slot, entry
}

double compress_bytes(const Compressor& c, int64_t N) {
  // kv + score (bf16), the state read and written (fp32), the entry written.
  return N * (2.0 * c.width * 2 + 2.0 * c.accumulators * 3 * c.dim * 4 + c.entry_bytes);
}

double index_bytes(int64_t N, int64_t entries, int64_t pages, int64_t top_k) {
  // keys, q (bf16), weights, the block table row; indices and slots written.
  return N * (entries * static_cast<double>(kKeyBytes) +
              dsv4::kIndexerHeads * dsv4::kIndexerKeyDim * 2.0 + dsv4::kIndexerHeads * 4.0 +
              pages * 4.0 + top_k * 8.0);
}

double sparse_bytes(int64_t N, int64_t heads, int64_t length) {
  // entries and their int32 slots; q and out (bf16), lse.
  return N * (length * (dsv4::kEntryBytes + 4.0) + heads * dsv4::kHeadDim * 4.0 + heads * 4.0);
}

double route_bytes(const StepPreset& preset, int64_t N) {
  // gate_weight and hidden (bf16), bias; ids and weights written.
  return preset.experts * preset.hidden * 2.0 + N * preset.hidden * 2.0 + preset.experts * 4.0 +
         N * kRouterTopK * 8.0;
}

struct Call {
  std::string kernel;
  // The call on a stream, adding its invalid rows to `counter` when that is given.
  std::function<void(CudaStream, const TensorView& counter)> run;
  double bytes = 0;
  bool compresses = false;  // consumes the compressor windows: prime before each replay
};

class StepBench {
 public:
  StepBench(BenchDevice& device, const TimingOptions& timing, const RunBaseline& baseline,
            ResultTable& table, bool use_workspace, std::string writes,
            std::vector<std::string> plain)
      : device_(device),
        timing_(timing),
        baseline_(baseline),
        table_(table),
        use_workspace_(use_workspace),
        writes_(std::move(writes)),
        plain_(std::move(plain)) {}

  int failures() const { return failures_; }

  // The three attention layers' steps for `preset` at N rows of `in`'s context.
  void layers(const ContextInputs& in, const StepPreset& preset, int64_t N,
              const std::vector<std::string>& layers) {
    const int64_t H = preset.heads, K = preset.top_k;
    int64_t workspace_bytes = 0;
    if (use_workspace_) {
      const int64_t longest = kWindow + std::max(K, in.hca_entries());
      workspace_bytes =
          std::max(dsv4::index_topk_workspace_bytes(N, in.csa_capacity(), device_.device()),
                   dsv4::sparse_decode_workspace_bytes(N, H, longest, device_.device()));
    }
    DeviceAllocation workspace(device_, static_cast<size_t>(workspace_bytes));
    const TensorView ws = workspace_bytes > 0
                              ? TensorView::contiguous(workspace.get(), DType::kUInt8,
                                                       {workspace_bytes}, device_.device())
                              : TensorView();
    const std::string ws_text =
        !use_workspace_ ? "off" : format(static_cast<double>(workspace_bytes) / (1 << 20), 2);

    const Call store{"store_entries",
                     [&in, N](CudaStream s, const TensorView& counter) {
                       dsv4::StoreEntriesParams p = in.store(N);
                       p.invalid_count = counter;
                       dsv4::store_entries(p, s);
                     },
                     store_bytes(N), false};
    auto compress = [&in, N](const Compressor& c) {
      return Call{c.name,
                  [&in, &c, N](CudaStream s, const TensorView& counter) {
                    dsv4::CompressorParams p = in.compress(c, N);
                    p.invalid_count = counter;
                    dsv4::compress(p, s);
                  },
                  compress_bytes(c, N), true};
    };
    // A CSA layer's two compressors in one launch (compress with two calls).
    auto compress_both = [&in, N](const Compressor& first, const Compressor& second) {
      return Call{"compress csa+index",
                  [&in, &first, &second, N](CudaStream s, const TensorView& counter) {
                    dsv4::CompressorParams a = in.compress(first, N);
                    dsv4::CompressorParams b = in.compress(second, N);
                    a.invalid_count = b.invalid_count = counter;
                    dsv4::compress(a, b, s);
                  },
                  compress_bytes(first, N) + compress_bytes(second, N), true};
    };
    // The store with the layer's compressors in one launch (store_and_compress); `second` may be
    // null.
    auto write_together = [&in, N](const std::string& name, const Compressor& first,
                                   const Compressor* second) {
      return Call{"store+compress " + name,
                  [&in, &first, second, N](CudaStream s, const TensorView& counter) {
                    dsv4::StoreEntriesParams ring = in.store(N);
                    dsv4::CompressorParams a = in.compress(first, N);
                    ring.invalid_count = a.invalid_count = counter;
                    if (second == nullptr) {
                      dsv4::store_and_compress(ring, a, s);
                      return;
                    }
                    dsv4::CompressorParams b = in.compress(*second, N);
                    b.invalid_count = counter;
                    dsv4::store_and_compress(ring, a, b, s);
                  },
                  store_bytes(N) + compress_bytes(first, N) +
                      (second != nullptr ? compress_bytes(*second, N) : 0.0),
                  true};
    };
    auto attend = [&in, N, H, K, ws](const std::string& layer, int64_t length) {
      return Call{"sparse_decode",
                  [&in, layer, N, H, K, ws](CudaStream s, const TensorView& counter) {
                    dsv4::SparseDecodeParams p = in.attend(layer, N, H, K, ws);
                    p.invalid_count = counter;
                    dsv4::sparse_decode(p, s);
                  },
                  sparse_bytes(N, H, length), false};
    };
    for (const std::string& layer : layers) {
      std::vector<Call> calls;
      if (layer == "swa") {
        calls = {store, attend("swa", kWindow)};
      } else if (layer == "csa") {
        const Call index{"index_topk",
                         [&in, N, K, ws](CudaStream s, const TensorView& counter) {
                           dsv4::IndexerParams p = in.index(N, K, ws);
                           p.invalid_count = counter;
                           dsv4::index_topk(p, s);
                         },
                         index_bytes(N, in.csa_entries(), in.csa_capacity() / kBlockSize, K),
                         false};
        if (writes_ == "one") {
          calls = {write_together("csa+index", in.csa_main(), &in.csa_index()), index,
                   attend("csa", kWindow + K)};
        } else if (writes_ == "pair") {
          calls = {store, compress_both(in.csa_main(), in.csa_index()), index,
                   attend("csa", kWindow + K)};
        } else {
          calls = {store, compress(in.csa_main()), compress(in.csa_index()), index,
                   attend("csa", kWindow + K)};
        }
      } else if (layer == "hca") {
        if (writes_ == "one") {
          calls = {write_together("hca", in.hca(), nullptr),
                   attend("hca", kWindow + in.hca_entries())};
        } else {
          calls = {store, compress(in.hca()), attend("hca", kWindow + in.hca_entries())};
        }
      } else {
        continue;
      }
      for (Call& call : calls)
        launch_plainly_if_named(call);
      const std::vector<std::string> key = {preset.name, std::to_string(in.context()),
                                            std::to_string(N), layer};
      try {
        std::vector<uint8_t> written;
        std::string check = check_step(in, N, layer, calls, written);
        for (const Call& call : calls) {
          const double us =
              time([&call](CudaStream s) { call.run(s, TensorView()); }, call.compresses, in, N);
          add_row(key, call.kernel, us, call.bytes, ws_text, "-");
        }
        double bytes = 0;
        bool compresses = false;
        for (const Call& call : calls) {
          bytes += call.bytes;
          compresses = compresses || call.compresses;
        }
        const double step_us = time(
            [&calls](CudaStream s) {
              for (const Call& call : calls)
                call.run(s, TensorView());
            },
            compresses, in, N);
        if (check == "ok" && in.step_entries(N) != written) {
          check = "FAIL (the replays wrote other entries than the checked step)";
        }
        if (check != "ok") ++failures_;
        add_row(key, "step", step_us, bytes, ws_text, check);
      } catch (const std::exception& error) {
        ++failures_;
        std::fprintf(stderr, "%s %s N=%lld context=%lld: %s\n", preset.name, layer.c_str(),
                     static_cast<long long>(N), static_cast<long long>(in.context()), error.what());
        table_.add_row(
            {key[0], key[1], key[2], key[3], "step", "error", "-", "-", "-", ws_text, "error"});
      }
    }
  }

  // The router (fused gate GEMM + top-6) for N rows: the MoE layers' part of a step.
  void router(const StepPreset& preset, int64_t N) {
    const std::vector<std::string> key = {preset.name, "-", std::to_string(N), "moe"};
    try {
      const int64_t E = preset.experts, D = preset.hidden, slabs = dsv4::route_workspace_slabs(N);
      std::mt19937_64 rng(static_cast<uint64_t>(N * 7919 + E));
      const std::vector<uint16_t> hidden = normal_bf16(rng, N * D, 1.0f);
      const std::vector<uint16_t> gate = normal_bf16(rng, E * D, 0.02f);
      const std::vector<float> bias = normal_floats(rng, E, 0.1f);
      DeviceAllocation d_hidden(device_, hidden.size() * 2), d_gate(device_, gate.size() * 2),
          d_bias(device_, bias.size() * 4), d_ids(device_, N * kRouterTopK * 4),
          d_weights(device_, N * kRouterTopK * 4), d_workspace(device_, slabs * N * E * 4),
          d_counter(device_, 8);
      device_.upload(d_hidden.get(), hidden.data(), hidden.size() * 2);
      device_.upload(d_gate.get(), gate.data(), gate.size() * 2);
      device_.upload(d_bias.get(), bias.data(), bias.size() * 4);
      const int64_t zero = 0;
      device_.upload(d_counter.get(), &zero, 8);
      const Device where = device_.device();
      dsv4::RouterParams p;
      p.hidden = TensorView::contiguous(d_hidden.get(), DType::kBFloat16, {N, D}, where);
      p.gate_weight = TensorView::contiguous(d_gate.get(), DType::kBFloat16, {E, D}, where);
      p.bias = TensorView::contiguous(d_bias.get(), DType::kFloat32, {E}, where);
      p.topk_ids = TensorView::contiguous(d_ids.get(), DType::kInt32, {N, kRouterTopK}, where);
      p.topk_weights =
          TensorView::contiguous(d_weights.get(), DType::kFloat32, {N, kRouterTopK}, where);
      p.logits_workspace =
          TensorView::contiguous(d_workspace.get(), DType::kFloat32, {slabs, N, E}, where);
      p.top_k = kRouterTopK;
      p.route_scale = preset.route_scale;
      dsv4::RouterParams counted = p;
      counted.invalid_count = TensorView::contiguous(d_counter.get(), DType::kInt64, {1}, where);
      dsv4::route(counted);  // errors surface here, not inside a graph capture
      int64_t invalid = 0;
      device_.download(&invalid, d_counter.get(), 8);
      const std::string check = invalid == 0 ? "ok" : "FAIL (invalid rows)";
      if (check != "ok") ++failures_;
      const double us = device_.time_us([&p](CudaStream s) { dsv4::route(p, s); }, timing_);
      add_row(key, "route", us, route_bytes(preset, N), "-", check);
    } catch (const std::exception& error) {
      ++failures_;
      std::fprintf(stderr, "%s router N=%lld: %s\n", preset.name, static_cast<long long>(N),
                   error.what());
      table_.add_row(
          {key[0], key[1], key[2], key[3], "route", "error", "-", "-", "-", "-", "error"});
    }
  }

 private:
  // Runs the layer's calls once outside a graph (errors surface here, not inside a capture),
  // counted, after poisoning the entries the step writes: "ok" when no call counted an invalid
  // row and the layer's entries (SWA; CSA entry and key; HCA entry) were written. `written` gets
  // the entries' bytes, which every replay must write again.
  std::string check_step(const ContextInputs& in, int64_t N, const std::string& layer,
                         const std::vector<Call>& calls, std::vector<uint8_t>& written) {
    in.poison_step_entries(N);
    in.prime(N, nullptr);
    in.clear_counter();
    for (const Call& call : calls)
      call.run(nullptr, in.counter());
    const int64_t invalid = in.read_counter();
    written = in.step_entries(N);
    // Entries of the other layer kinds stay poisoned: 3 per row (swa), 1 (csa), 2 (hca).
    int64_t poisoned = 0;
    for (size_t at = 0; at < written.size();) {
      const size_t count = at % 1792 == 1152 ? 64 : 576;  // the key between the CSA and HCA entries
      poisoned += std::all_of(written.begin() + at, written.begin() + at + count,
                              [](uint8_t b) { return b == kPoison; });
      at += count;
    }
    const int64_t expected = layer == "swa" ? 3 * N : layer == "csa" ? N : 2 * N;
    if (invalid != 0) return "FAIL (" + std::to_string(invalid) + " invalid rows)";
    if (poisoned != expected) return "FAIL (an entry was not written)";
    return "ok";
  }

  double time(const std::function<void(CudaStream)>& work, bool compresses, const ContextInputs& in,
              int64_t N) {
    if (!compresses) return device_.time_us(work, timing_);
    return device_.time_us(work, timing_, [&in, N](CudaStream s) { in.prime(N, s); });
  }

  // The call's kernels launched plainly when --plain names it: the process switch is off while
  // the call launches (its graph nodes keep how they were launched).
  void launch_plainly_if_named(Call& call) const {
#ifdef HDK_WITH_CUDA
    if (std::find(plain_.begin(), plain_.end(), call.kernel) == plain_.end()) return;
    call.run = [run = call.run](CudaStream s, const TensorView& counter) {
      struct Restore {  // the switch as it was, however the call ends
        bool enabled = hdk::detail::dependent_launch_enabled();
        ~Restore() { hdk::detail::set_dependent_launch(enabled); }
      } restore;
      hdk::detail::set_dependent_launch(false);
      run(s, counter);
    };
#else
    (void)call;
#endif
  }

  void add_row(const std::vector<std::string>& key, const std::string& kernel, double us,
               double bytes, const std::string& workspace, const std::string& check) {
    const double floor_us = baseline_.launch_overhead_us + bytes / (baseline_.copy_gbs * 1e9) * 1e6;
    table_.add_row({key[0], key[1], key[2], key[3], kernel, format(us, 2), format(bytes / 1e6, 3),
                    format(floor_us, 2), format(us / floor_us, 2), workspace, check});
  }

  BenchDevice& device_;
  TimingOptions timing_;
  RunBaseline baseline_;
  ResultTable& table_;
  bool use_workspace_;
  std::string writes_;  // one, pair or apart (--writes)
  // Kernels launched plainly, the others as programmatic dependents (--plain): which boundary
  // of the step a dependent launch helps or hurts.
  std::vector<std::string> plain_;
  int failures_ = 0;
};

void print_step_usage() {
  std::printf(
      "hdk-bench dsv4-step [options]\n"
      "  --preset flash,pro    flash: Hq 64, top-512, router E 256 x D 4096; pro: Hq 128,\n"
      "                        top-1024, router E 384 x D 7168\n"
      "  --N LIST              requests per step, one query token each (default 1-128 GPU,\n"
      "                        1,2 CPU)\n"
      "  --context LIST        tokens each request has seen, a multiple of 128 (default\n"
      "                        8192,65536,262144 GPU, 8192 CPU): CSA entries = context / 4,\n"
      "                        HCA entries = context / 128, the step token at context - 1\n"
      "  --layers LIST         swa,csa,hca,moe (default all; moe: the router)\n"
      "  --workspace on|off    pass index_topk and sparse_decode a workspace sized by\n"
      "                        index_topk_workspace_bytes / sparse_decode_workspace_bytes,\n"
      "                        allocated once per point and shared by the step (default on)\n"
      "  --writes M            one: a layer's SWA store and compressors in one launch\n"
      "                        (store_and_compress; default); pair: the store, then a CSA\n"
      "                        layer's two compressors in one launch (compress with two\n"
      "                        calls); apart: each write call its own launch\n"
      "  --pdl on|off          launch each kernel as a programmatic dependent of the one\n"
      "                        before it (Hopper; default on; off: plain launches)\n"
      "  --plain LIST          with --pdl on, launch these calls plainly all the same\n"
      "                        (store_entries, 'store+compress csa+index', 'store+compress\n"
      "                        hca', 'compress csa+index', 'compress csa', 'compress index',\n"
      "                        'compress hca', index_topk, sparse_decode):\n"
      "                        which boundary a dependent launch helps or hurts\n"
      "  --hot                 keep caches warm between runs (default: flushed, cold)\n"
      "  --flush-code          also evict the SMs' instruction caches before each run (the\n"
      "                        L2 flush leaves them holding the last replay's code)\n"
      "  --iterations N        timed replays per graph (median; default 100 GPU, 3 CPU)\n"
      "  --json FILE           also write results as JSON\n"
      "  --cpu                 run on the CPU even when a GPU is present\n");
}

const StepPreset& find_preset(const std::string& name) {
  for (const StepPreset& preset : kStepPresets) {
    if (name == preset.name) return preset;
  }
  throw std::runtime_error("--preset: unknown preset '" + name + "' (flash or pro)");
}

// Progress on stderr: one line rewritten in place on a terminal, plain lines otherwise.
void progress(const std::string& text) {
  if (isatty(fileno(stderr))) {
    std::fprintf(stderr, "\r%-70s", text.c_str());
  } else {
    std::fprintf(stderr, "%s\n", text.c_str());
  }
}

}  // namespace

int dsv4_step_command(Options& options) {
  if (options.flag("help")) {
    print_step_usage();
    return 0;
  }
  // Every option is read and checked before the device starts; the defaults of --N, --context
  // and --iterations depend on the device.
  const bool force_cpu = options.flag("cpu");
  const std::vector<std::string> presets = options.texts("preset", {"flash", "pro"});
  std::vector<int64_t> rows = options.integers("N", {});
  std::vector<int64_t> contexts = options.integers("context", {});
  const std::vector<std::string> layers = options.texts("layers", {"swa", "csa", "hca", "moe"});
  const std::string workspace = options.text("workspace", "on");
  const std::string dependent = options.text("pdl", "on");
  const std::string writes = options.text("writes", "one");
  const std::vector<std::string> plain = options.texts("plain", {});
  TimingOptions timing;
  timing.flush_cache = !options.flag("hot");
  timing.flush_code = options.flag("flush-code");
  const int64_t iterations = options.integer("iterations", kDeviceDefault);
  const std::string json_path = options.text("json", "");
  options.reject_unused();
  if (presets.empty()) throw std::runtime_error("--preset: give at least one preset");
  for (const std::string& name : presets)
    find_preset(name);
  for (int64_t n : rows) {
    if (n < 1) throw std::runtime_error("--N: values must be at least 1, got " + std::to_string(n));
  }
  for (int64_t c : contexts) {
    if (c < kHcaRatio || c % kHcaRatio != 0) {
      throw std::runtime_error("--context: values must be positive multiples of 128, got " +
                               std::to_string(c));
    }
  }
  if (layers.empty()) throw std::runtime_error("--layers: give at least one layer");
  for (const std::string& layer : layers) {
    if (std::find(std::begin(kLayers), std::end(kLayers), layer) == std::end(kLayers)) {
      throw std::runtime_error("--layers: unknown layer '" + layer + "' (swa, csa, hca, moe)");
    }
  }
  if (workspace != "on" && workspace != "off") {
    throw std::runtime_error("--workspace must be on or off, got '" + workspace + "'");
  }
  if (writes != "one" && writes != "pair" && writes != "apart") {
    throw std::runtime_error("--writes must be one, pair or apart, got '" + writes + "'");
  }
  if (dependent != "on" && dependent != "off") {
    throw std::runtime_error("--pdl must be on or off, got '" + dependent + "'");
  }
  static const char* const kCalls[] = {
      "store_entries", "store+compress csa+index", "store+compress hca", "compress csa+index",
      "compress csa",  "compress index",           "compress hca",       "index_topk",
      "sparse_decode"};
  for (const std::string& call : plain) {
    if (std::find(std::begin(kCalls), std::end(kCalls), call) == std::end(kCalls)) {
      std::string known;
      for (const char* name : kCalls)
        known += (known.empty() ? "" : ", ") + std::string(name);
      throw std::runtime_error("--plain: unknown call '" + call + "' (" + known + ")");
    }
  }
#ifdef HDK_WITH_CUDA
  hdk::detail::set_dependent_launch(dependent == "on");
#endif
  if (iterations != kDeviceDefault && iterations < 1) {
    throw std::runtime_error("--iterations must be at least 1, got " + std::to_string(iterations));
  }

  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<BenchDevice> device = BenchDevice::create(force_cpu);
  const bool gpu = device->device().is_cuda();
  if (rows.empty()) {
    rows = gpu ? std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128} : std::vector<int64_t>{1, 2};
  }
  if (contexts.empty()) {
    contexts = gpu ? std::vector<int64_t>{8192, 65536, 262144} : std::vector<int64_t>{8192};
  }
  timing.iterations = static_cast<int>(iterations != kDeviceDefault ? iterations : gpu ? 100 : 3);
  const RunBaseline baseline = start_run(*device, "dsv4-step", timing);
  std::printf(
      "step token of every row at position context - 1: it completes a ratio-4 window (CSA\n"
      "entry context/4 - 1, main and indexer) and a ratio-128 window (HCA entry\n"
      "context/128 - 1); the compressor states hold the window's earlier tokens (CSA:\n"
      "context - 8 .. context - 2, HCA: context - 128 .. context - 2), put back before each\n"
      "replay outside the timed span. workspace: %s, programmatic dependent launch: %s, CSA\n"
      "and HCA writes: %s\n\n",
      workspace.c_str(), gpu ? dependent.c_str() : "-", writes.c_str());
  ResultTable table({"preset", "context", "N", "layer", "kernel", "time_us", "MB", "floor_us",
                     "x_floor", "ws_MiB", "check"});
  StepBench bench(*device, timing, baseline, table, workspace == "on", writes, plain);
  const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
  const bool attention = std::any_of(layers.begin(), layers.end(),
                                     [](const std::string& layer) { return layer != "moe"; });
  for (int64_t context : attention ? contexts : std::vector<int64_t>{}) {
    progress("context " + std::to_string(context) + ": filling pools for " +
             std::to_string(max_rows) + " requests ...");
    const ContextInputs inputs(*device, context, max_rows);
    for (const std::string& name : presets) {
      for (int64_t N : rows) {
        progress(name + " context " + std::to_string(context) + " N=" + std::to_string(N) + " ...");
        bench.layers(inputs, find_preset(name), N, layers);
      }
    }
  }
  if (std::find(layers.begin(), layers.end(), "moe") != layers.end()) {
    for (const std::string& name : presets) {
      for (int64_t N : rows) {
        progress(name + " router N=" + std::to_string(N) + " ...");
        bench.router(find_preset(name), N);
      }
    }
  }
  progress(
      "done in " +
      format(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1) +
      " s");
  if (isatty(fileno(stderr))) std::fprintf(stderr, "\n");
  return finish_run(
      table,
      "time_us: median graph replay (a kernel alone in its graph; step: the layer's calls in one\n"
      "graph). MB = bytes the call must move at least: store_entries N x (bf16 row + slot +\n"
      "584 B entry); compress N x (kv + score bf16, state read + written fp32, entry written);\n"
      "store+compress: the sum of the two;\n"
      "index_topk N x (context/4 keys x 68 B + q + weights + block table row + indices and\n"
      "slots written); sparse_decode N x (L entries x (584 + 4) + q + out bf16 + lse), L = 128\n"
      "(swa), 128 + top_k (csa), 128 + context/128 (hca); route: gate_weight + hidden bf16 +\n"
      "bias + ids and weights; step: the sum of its calls. floor_us = empty-kernel replay +\n"
      "MB / copy bandwidth (the step: one replay for the whole graph); x_floor = time / floor.\n"
      "ws_MiB: the workspace of the point (off: none passed). check (step rows): every call\n"
      "counted no invalid row, the step wrote real entries over poisoned ones, and the timed\n"
      "replays left the same entry bytes as that checked run.",
      options, json_path, *device, baseline, timing, bench.failures());
}

}  // namespace bench
}  // namespace hdk
