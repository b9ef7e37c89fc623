// hdk-bench kv: the DeepSeek-V4 KV cache's write side on the decode path. store_entries and
// gather_entries (MODEL1 entries) over N rows and L slots per row, and a full decode step of the
// compressor (every CSA layer's main and indexer compressors and every HCA layer's, Flash or Pro
// layer counts, every row completing a window: the worst case). Times are CUDA-graph replays with
// caches flushed before each (see bench_device.h); %copy = bytes moved / time against the copy
// bandwidth measured in the same run. --verify checks store and gather bytes against the
// bit-exact reference.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "bench_cli.h"
#include "bench_device.h"
#include "dsv4/kv_cache/reference/kv_cache_reference.h"
#include "hdk/dsv4/kv_cache.h"

namespace hdk {
namespace bench {
namespace {

struct KvPreset {
  const char* name;
  int64_t csa_layers;
  int64_t hca_layers;
};

// Layer kinds from the spec: Flash 43 layers (0-1 SWA only, then CSA even / HCA odd), Pro 61
// (0-1 HCA, then CSA even / HCA odd).
const KvPreset kKvPresets[] = {{"flash", 21, 20}, {"pro", 30, 31}};

constexpr int64_t kBlockSize = 64;
// --verify checks gathers of up to this many rows (the host reference of larger ones takes
// longer than the whole benchmark).
constexpr int64_t kMaxVerifiedGatherRows = 64 * 2048;

// Random MODEL1 pages: FP8 codes of every value but NaN, RoPE bf16 values of magnitude below 4,
// UE8M0 scales 2^-17 .. 2^13.
void fill_random_entries(std::vector<uint8_t>& cache, int64_t blocks, std::mt19937_64& rng) {
  for (size_t i = 0; i < cache.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(&cache[i], &word, std::min<size_t>(8, cache.size() - i));
  }
  for (int64_t block = 0; block < blocks; ++block) {
    uint8_t* page = cache.data() + block * kBlockSize * 584;
    for (int64_t e = 0; e < kBlockSize; ++e) {
      uint8_t* data = page + e * 576;
      for (int i = 0; i < 448; ++i) {
        if ((data[i] & 0x7f) == 0x7f) data[i] ^= 1;
      }
      for (int i = 448; i < 576; i += 2)
        data[i + 1] &= 0xbf;  // bf16 high byte: exponent below 0x80
      uint8_t* scales = page + kBlockSize * 576 + e * 8;
      for (int g = 0; g < 7; ++g)
        scales[g] = static_cast<uint8_t>(110 + scales[g] % 31);
    }
  }
}

struct Point {
  std::string what;
  int64_t N = 0, L = 0;
  double time_us = 0, bytes = 0;
  std::string check = "-";
};

class KvBench {
 public:
  KvBench(BenchDevice& device, const TimingOptions& timing, bool verify)
      : device_(device), timing_(timing), verify_(verify) {}

  Point store(int64_t N) {
    std::mt19937_64 rng(static_cast<uint64_t>(N));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t blocks = (N + kBlockSize - 1) / kBlockSize + 1;
    std::vector<float> values(N * 512);
    for (auto& v : values)
      v = normal(rng);
    std::vector<int64_t> slots(N);
    for (int64_t n = 0; n < N; ++n)
      slots[n] = n;
    std::shuffle(slots.begin(), slots.end(), rng);
    DeviceAllocation d_values(device_, values.size() * 4), d_slots(device_, N * 8),
        d_cache(device_, blocks * kBlockSize * 584);
    device_.upload(d_values.get(), values.data(), values.size() * 4);
    device_.upload(d_slots.get(), slots.data(), N * 8);
    const Device where = device_.device();
    dsv4::StoreEntriesParams p;
    p.values = TensorView::contiguous(d_values.get(), DType::kFloat32, {N, 512}, where);
    p.slots = TensorView::contiguous(d_slots.get(), DType::kInt64, {N}, where);
    p.cache =
        TensorView::contiguous(d_cache.get(), DType::kUInt8, {blocks, kBlockSize * 584}, where);
    p.block_size = kBlockSize;
    Point point{"store_entries", N, 0};
    if (verify_) {
      std::vector<uint8_t> got(blocks * kBlockSize * 584, 0), want(got.size(), 0);
      device_.upload(d_cache.get(), got.data(), got.size());
      dsv4::store_entries(p);
      device_.download(got.data(), d_cache.get(), got.size());
      dsv4::StoreEntriesParams host = p;
      host.values = TensorView::contiguous(values.data(), DType::kFloat32, {N, 512});
      host.slots = TensorView::contiguous(slots.data(), DType::kInt64, {N});
      host.cache = TensorView::contiguous(want.data(), DType::kUInt8, {blocks, kBlockSize * 584});
      dsv4::store_entries_reference(host);
      point.check = got == want ? "ok" : "FAIL";
    }
    point.time_us = device_.time_us([&](CudaStream s) { dsv4::store_entries(p, s); }, timing_);
    point.bytes = N * (512.0 * 4 + 8 + 584);
    return point;
  }

  Point gather(int64_t N, int64_t L) {
    std::mt19937_64 rng(static_cast<uint64_t>(N * 131 + L));
    // Every row reads L entries of its own (a request's pages), so each entry comes from DRAM
    // once: rows that shared entries would be served from L2 and flatter the bandwidth.
    const int64_t entries = std::max<int64_t>(N * L, 1);
    const int64_t blocks = (entries + kBlockSize - 1) / kBlockSize;
    std::vector<uint8_t> cache(blocks * kBlockSize * 584);
    fill_random_entries(cache, blocks, rng);
    // Row n reads entries n * L .. n * L + L - 1 in a random order.
    std::vector<int32_t> slots(N * L);
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t l = 0; l < L; ++l)
        slots[n * L + l] = static_cast<int32_t>(n * L + l);
      std::shuffle(slots.begin() + n * L, slots.begin() + (n + 1) * L, rng);
    }
    DeviceAllocation d_cache(device_, cache.size()), d_slots(device_, slots.size() * 4),
        d_out(device_, N * L * 512 * 2);
    device_.upload(d_cache.get(), cache.data(), cache.size());
    device_.upload(d_slots.get(), slots.data(), slots.size() * 4);
    const Device where = device_.device();
    dsv4::GatherEntriesParams p;
    p.cache =
        TensorView::contiguous(d_cache.get(), DType::kUInt8, {blocks, kBlockSize * 584}, where);
    p.block_size = kBlockSize;
    p.slots = TensorView::contiguous(d_slots.get(), DType::kInt32, {N, L}, where);
    p.out = TensorView::contiguous(d_out.get(), DType::kBFloat16, {N, L, 512}, where);
    Point point{"gather_entries", N, L};
    if (verify_ && N * L <= kMaxVerifiedGatherRows) {
      dsv4::gather_entries(p);
      std::vector<uint8_t> got(N * L * 512 * 2), want(got.size());
      device_.download(got.data(), d_out.get(), got.size());
      dsv4::GatherEntriesParams host = p;
      host.cache = TensorView::contiguous(cache.data(), DType::kUInt8, {blocks, kBlockSize * 584});
      host.slots = TensorView::contiguous(slots.data(), DType::kInt32, {N, L});
      host.out = TensorView::contiguous(want.data(), DType::kBFloat16, {N, L, 512});
      dsv4::gather_entries_reference(host);
      point.check = got == want ? "ok" : "FAIL";
    }
    point.time_us = device_.time_us([&](CudaStream s) { dsv4::gather_entries(p, s); }, timing_);
    point.bytes = N * L * (584.0 + 4 + 512 * 2);
    return point;
  }

  // All compressor calls of one decode step for N rows, one token each, every row completing a
  // window; layers share buffers (the bytes per call are the same as with their own).
  Point compress_step(const KvPreset& preset, int64_t N) {
    struct Layer {
      int64_t ratio, dim;
    };
    const std::vector<Layer> kinds = {{4, 512}, {4, 128}, {128, 512}};
    std::mt19937_64 rng(static_cast<uint64_t>(N * 17));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    struct Buffers {
      std::unique_ptr<DeviceAllocation> kv, score, ape, positions, slots, state, norm, cos, sin,
          table, cache;
      dsv4::CompressorParams params;
      double bytes = 0;
    };
    std::vector<Buffers> layers(kinds.size());
    const Device where = device_.device();
    const int64_t max_position = 1024;
    for (size_t k = 0; k < kinds.size(); ++k) {
      const int64_t m = kinds[k].ratio, d = kinds[k].dim, width = m == 4 ? 2 * d : d;
      const int64_t A = dsv4::compressor_accumulators(m);
      const int64_t entry_bytes =
          d == 512 ? dsv4::kEntryBytes : dsv4::key_bytes(dsv4::KeyFormat::kMXFP4);
      Buffers& b = layers[k];
      auto make = [&](size_t bytes, const void* host) {
        auto allocation = std::make_unique<DeviceAllocation>(device_, bytes);
        if (host != nullptr) device_.upload(allocation->get(), host, bytes);
        return allocation;
      };
      std::vector<float> kv(N * width), ape(m * width), norm(d, 1.0f), table_cos(max_position * 32),
          table_sin(max_position * 32), state(N * A * 3 * d, 0.0f);
      for (auto* v : {&kv, &ape, &table_cos, &table_sin})
        for (auto& x : *v)
          x = normal(rng);
      std::vector<int64_t> positions(N, m * 3 + m - 1), slots(N);
      std::vector<int32_t> table(N * 4);
      for (int64_t n = 0; n < N; ++n) {
        slots[n] = n;
        for (int64_t j = 0; j < 4; ++j)
          table[n * 4 + j] = static_cast<int32_t>(n);
      }
      b.kv = make(kv.size() * 4, kv.data());
      b.score = make(kv.size() * 4, kv.data());
      b.ape = make(ape.size() * 4, ape.data());
      b.positions = make(N * 8, positions.data());
      b.slots = make(N * 8, slots.data());
      b.state = make(state.size() * 4, state.data());
      b.norm = make(d * 4, norm.data());
      b.cos = make(table_cos.size() * 4, table_cos.data());
      b.sin = make(table_sin.size() * 4, table_sin.data());
      b.table = make(table.size() * 4, table.data());
      b.cache = make(N * kBlockSize * entry_bytes, nullptr);
      dsv4::CompressorParams& p = b.params;
      p.kv = TensorView::contiguous(b.kv->get(), DType::kFloat32, {N, 1, width}, where);
      p.score = TensorView::contiguous(b.score->get(), DType::kFloat32, {N, 1, width}, where);
      p.ape = TensorView::contiguous(b.ape->get(), DType::kFloat32, {m, width}, where);
      p.positions = TensorView::contiguous(b.positions->get(), DType::kInt64, {N}, where);
      p.state_slots = TensorView::contiguous(b.slots->get(), DType::kInt64, {N}, where);
      p.state = TensorView::contiguous(b.state->get(), DType::kFloat32, {N, A, 3, d}, where);
      p.norm_weight = TensorView::contiguous(b.norm->get(), DType::kFloat32, {d}, where);
      p.rope_cos = TensorView::contiguous(b.cos->get(), DType::kFloat32, {max_position, 32}, where);
      p.rope_sin = TensorView::contiguous(b.sin->get(), DType::kFloat32, {max_position, 32}, where);
      p.block_table = TensorView::contiguous(b.table->get(), DType::kInt32, {N, 4}, where);
      p.cache = TensorView::contiguous(b.cache->get(), DType::kUInt8, {N, kBlockSize * entry_bytes},
                                       where);
      p.block_size = kBlockSize;
      p.ratio = m;
      // Inputs, state read and written, the entry written.
      b.bytes = N * (2.0 * width * 4 + 2.0 * A * 3 * d * 4 + entry_bytes);
    }
    const int64_t calls[] = {preset.csa_layers, preset.csa_layers, preset.hca_layers};
    Point point{std::string("compress step (") +
                    std::to_string(2 * preset.csa_layers + preset.hca_layers) + " calls)",
                N, 0};
    for (size_t k = 0; k < kinds.size(); ++k)
      point.bytes += calls[k] * layers[k].bytes;
    point.time_us = device_.time_us(
        [&](CudaStream s) {
          for (size_t k = 0; k < kinds.size(); ++k) {
            for (int64_t layer = 0; layer < calls[k]; ++layer)
              dsv4::compress(layers[k].params, s);
          }
        },
        timing_);
    return point;
  }

 private:
  BenchDevice& device_;
  TimingOptions timing_;
  bool verify_;
};

void print_kv_usage() {
  std::printf(
      "hdk-bench kv [options]\n"
      "  --preset flash,pro    layer counts of the compressor step (21 CSA + 20 HCA, 30 + 31)\n"
      "  --N LIST              rows per call (default 1-512, powers of two)\n"
      "  --L LIST              slots per row for gather_entries (default 128-2048)\n"
      "  --ops LIST            store,gather,compress (default all)\n"
      "  --hot                 keep caches warm between runs (default: flushed, cold)\n"
      "  --iterations N        timed runs per point (median)\n"
      "  --verify              check store and gather bytes against the bit-exact reference\n"
      "  --json FILE           also write results as JSON\n"
      "  --cpu                 run on the CPU even when a GPU is present\n");
}

}  // namespace

int kv_command(Options& options) {
  if (options.flag("help")) {
    print_kv_usage();
    return 0;
  }
  std::unique_ptr<BenchDevice> device = BenchDevice::create(options.flag("cpu"));
  const bool gpu = device->device().is_cuda();
  const std::vector<std::string> presets = options.texts("preset", {"flash", "pro"});
  const std::vector<int64_t> rows =
      options.integers("N", gpu ? std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128, 256, 512}
                                : std::vector<int64_t>{1, 8, 64});
  const std::vector<int64_t> lengths =
      options.integers("L", gpu ? std::vector<int64_t>{128, 512, 2048} : std::vector<int64_t>{128});
  const std::vector<std::string> ops = options.texts("ops", {"store", "gather", "compress"});
  const bool verify = options.flag("verify");
  TimingOptions timing;
  timing.flush_cache = !options.flag("hot");
  timing.iterations = static_cast<int>(options.integer("iterations", gpu ? 100 : 5));
  const std::string json_path = options.text("json", "");
  options.reject_unused();

  const RunBaseline baseline = start_run(*device, "kv", timing);
  ResultTable table({"op", "preset", "N", "L", "time_us", "GB/s", "%copy", "check"});
  KvBench bench(*device, timing, verify);
  int failures = 0;
  auto add = [&](const Point& point, const std::string& preset) {
    const double gbs = point.bytes / (point.time_us * 1e-6) / 1e9;
    if (point.check == "FAIL") ++failures;
    table.add_row({point.what, preset, std::to_string(point.N),
                   point.L ? std::to_string(point.L) : "-", format(point.time_us, 2),
                   format(gbs, 1), format(100.0 * gbs / baseline.copy_gbs, 1), point.check});
  };
  auto has = [&](const char* op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
  // store and gather do not depend on the preset (every layer's entries are 512 wide).
  for (int64_t N : rows) {
    if (has("store")) add(bench.store(N), "any");
    if (has("gather")) {
      for (int64_t L : lengths)
        add(bench.gather(N, L), "any");
    }
  }
  if (has("compress")) {
    for (const std::string& name : presets) {
      const KvPreset* preset = nullptr;
      for (const KvPreset& candidate : kKvPresets) {
        if (name == candidate.name) preset = &candidate;
      }
      if (preset == nullptr) throw std::runtime_error("unknown preset '" + name + "'");
      for (int64_t N : rows)
        add(bench.compress_step(*preset, N), preset->name);
    }
  }
  return finish_run(table,
                    "GB/s = bytes moved / time: store N x (512 fp32 in + 8 slot + 584 out);"
                    "\ngather N x L x (584 in + 4 slot + 1024 bf16 out); compress step: per call"
                    "\nN x (kv + score in, state read + written, one entry written), all calls;"
                    "\n%copy = GB/s / copy bandwidth of this run",
                    options, json_path, *device, baseline, timing, failures);
}

}  // namespace bench
}  // namespace hdk
