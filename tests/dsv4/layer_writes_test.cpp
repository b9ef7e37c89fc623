// Writes of one launch against the same calls made one after the other: hdk::dsv4::compress with
// two calls, and store_and_compress (a store with one or two compressor calls). Every byte of the
// states, the caches and the shared invalid counter equal, on the CPU and on CUDA, for a CSA
// layer's main and indexer compressors and for other pairs (rows of every call mixed with
// padding, windows completing in some rows, several rows of a 128-channel call in one CTA, store
// rows over several CTAs, a store whose compressor calls have no rows). A launch in which a call
// writes what another touches, or with one bad call, is refused before anything is written, the
// error naming the call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "hdk/dsv4/kv_cache.h"
#include "support/device_memory.h"
#include "support/expect_error.h"
#include "support/kv_cache_case.h"

namespace hdk {
namespace testing {
namespace {

struct CallShape {
  int64_t dim = 512;
  int64_t ratio = 4;
  int64_t tokens = 1;  // T
  dsv4::KeyFormat format = dsv4::KeyFormat::kMXFP4;
};

constexpr int64_t kBlockSize = 4;
constexpr int64_t kMaxBlocks = 4;  // entries 0 .. 15 of a row

// One compressor call's host data: inputs drawn at random, a poisoned cache and a state of
// earlier garbage, each row on pages of its own and with a state slot of its own.
struct CallData {
  CallShape shape;
  int64_t rows = 0, width = 0, accumulators = 0, num_states = 0, num_blocks = 0;
  int64_t entry_bytes = 0, max_position = 0;
  std::vector<uint8_t> kv, score, positions, slots;
  std::vector<float> ape, norm, cos, sin, state;
  std::vector<int32_t> table;
  std::vector<uint8_t> cache;

  CallData(const CallShape& s, int64_t n, int64_t bad_row, std::mt19937_64& rng) : shape(s) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    rows = n;
    width = s.ratio == 4 ? 2 * s.dim : s.dim;
    accumulators = dsv4::compressor_accumulators(s.ratio);
    num_states = n + 2;
    num_blocks = n * kMaxBlocks + 2;
    entry_bytes = s.dim == 512 ? dsv4::kEntryBytes : dsv4::key_bytes(s.format);
    max_position = s.ratio * (kBlockSize * kMaxBlocks + 1);
    std::vector<float> kv_values(static_cast<size_t>(n * s.tokens * width)), score_values;
    for (auto& v : kv_values)
      v = normal(rng);
    score_values = kv_values;
    for (auto& v : score_values)
      v = 2.0f * normal(rng);
    kv = encode_rows(kv_values, DType::kFloat32);
    score = encode_rows(score_values, DType::kFloat32);
    for (int64_t i = 0; i < s.ratio * width; ++i)
      ape.push_back(0.5f * normal(rng));
    for (int64_t i = 0; i < s.dim; ++i)
      norm.push_back(1.0f + 0.2f * normal(rng));
    for (int64_t p = 0; p < max_position; ++p) {
      for (int64_t i = 0; i < 32; ++i) {
        const double angle =
            static_cast<double>(p) * std::pow(10000.0, -static_cast<double>(i) / 32);
        cos.push_back(static_cast<float>(std::cos(angle)));
        sin.push_back(static_cast<float>(std::sin(angle)));
      }
    }
    for (int64_t i = 0; i < num_states * accumulators * 3 * s.dim; ++i)
      state.push_back(normal(rng));
    cache.resize(static_cast<size_t>(num_blocks * kBlockSize * entry_bytes));
    for (auto& byte : cache)
      byte = static_cast<uint8_t>(rng());
    // Rows: every third one padding; the others at a position whose tokens complete a window
    // (even rows) or not (odd rows), on distinct state slots and pages.
    std::vector<int64_t> state_of(static_cast<size_t>(num_states));
    for (int64_t i = 0; i < num_states; ++i)
      state_of[i] = i;
    std::shuffle(state_of.begin(), state_of.end(), rng);
    std::vector<int64_t> position_values(n), slot_values(n);
    table.assign(static_cast<size_t>(n * kMaxBlocks), -3);
    for (int64_t r = 0; r < n; ++r) {
      const int64_t window = static_cast<int64_t>(rng() % (kBlockSize * kMaxBlocks));
      const int64_t last = window * s.ratio + s.ratio - 1;  // completes the window
      position_values[r] = r % 2 == 0 ? last - (s.tokens - 1) : window * s.ratio;
      slot_values[r] = r % 3 == 2 ? -1 : state_of[r];
      for (int64_t b = 0; b < kMaxBlocks; ++b)
        table[r * kMaxBlocks + b] = static_cast<int32_t>(r * kMaxBlocks + b);
    }
    // A row that completes a window on pages beyond the cache.
    for (int64_t b = 0; bad_row >= 0 && b < kMaxBlocks; ++b)
      table[bad_row * kMaxBlocks + b] = static_cast<int32_t>(num_blocks + 5);
    positions = index_bytes(position_values, DType::kInt64);
    slots = index_bytes(slot_values, DType::kInt32);
  }
};

// The call's data on a backend, and its params over it (the counter is the caller's).
struct CallBuffers {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;
  dsv4::CompressorParams params;

  void* put(Backend backend, const void* host, size_t bytes) {
    buffers.push_back(std::make_unique<DeviceBuffer>(backend, bytes));
    buffers.back()->upload(host, bytes);
    return buffers.back()->data();
  }
  CallBuffers(const CallData& c, Backend backend, void* counter) {
    const Device where = backend_device(backend);
    const CallShape& s = c.shape;
    const int64_t n = c.rows, T = s.tokens;
    dsv4::CompressorParams& p = params;
    p.kv = TensorView::contiguous(put(backend, c.kv.data(), c.kv.size()), DType::kFloat32,
                                  {n, T, c.width}, where);
    p.score = TensorView::contiguous(put(backend, c.score.data(), c.score.size()), DType::kFloat32,
                                     {n, T, c.width}, where);
    p.ape = TensorView::contiguous(put(backend, c.ape.data(), c.ape.size() * 4), DType::kFloat32,
                                   {s.ratio, c.width}, where);
    p.positions = TensorView::contiguous(put(backend, c.positions.data(), c.positions.size()),
                                         DType::kInt64, {n}, where);
    p.state_slots = TensorView::contiguous(put(backend, c.slots.data(), c.slots.size()),
                                           DType::kInt32, {n}, where);
    p.state =
        TensorView::contiguous(put(backend, c.state.data(), c.state.size() * 4), DType::kFloat32,
                               {c.num_states, c.accumulators, 3, s.dim}, where);
    p.norm_weight = TensorView::contiguous(put(backend, c.norm.data(), c.norm.size() * 4),
                                           DType::kFloat32, {s.dim}, where);
    p.rope_cos = TensorView::contiguous(put(backend, c.cos.data(), c.cos.size() * 4),
                                        DType::kFloat32, {c.max_position, 32}, where);
    p.rope_sin = TensorView::contiguous(put(backend, c.sin.data(), c.sin.size() * 4),
                                        DType::kFloat32, {c.max_position, 32}, where);
    p.block_table = TensorView::contiguous(put(backend, c.table.data(), c.table.size() * 4),
                                           DType::kInt32, {n, kMaxBlocks}, where);
    p.cache = TensorView::contiguous(put(backend, c.cache.data(), c.cache.size()), DType::kUInt8,
                                     {c.num_blocks, kBlockSize * c.entry_bytes}, where);
    p.block_size = kBlockSize;
    p.ratio = s.ratio;
    p.key_format = s.format;
    p.invalid_count = TensorView::contiguous(counter, DType::kInt64, {1}, where);
  }
  std::vector<uint8_t> download(const TensorView& view) const {
    for (const auto& buffer : buffers) {
      if (buffer->data() == view.data) {
        std::vector<uint8_t> bytes(buffer->size());
        buffer->download(bytes.data(), bytes.size());
        return bytes;
      }
    }
    return {};
  }
};

// A store's host data: rows with the formats' hard cases (NaN and infinity rows among them), on
// distinct slots (some negative) of a poisoned pool of its own.
struct StoreData {
  static constexpr int64_t kBlock = 8;
  int64_t rows = 0, num_blocks = 0;
  DType dtype;
  std::vector<float> floats;
  std::vector<int64_t> slot_values;
  std::vector<uint8_t> values, slots, cache;

  StoreData(int64_t n, DType value_dtype, bool bad_row, std::mt19937_64& rng)
      : rows(n), num_blocks(n / kBlock + 2), dtype(value_dtype) {
    floats = random_rows(rng, n, 512, /*special=*/true, 64);
    values = encode_rows(floats, dtype);
    slot_values = distinct_slots(rng, n, num_blocks * kBlock, /*with_skips=*/true);
    if (bad_row) slot_values[1] = num_blocks * kBlock + 3;  // beyond the pool
    slots = index_bytes(slot_values, DType::kInt64);
    cache.resize(static_cast<size_t>(num_blocks * kBlock * dsv4::kEntryBytes));
    for (auto& byte : cache)
      byte = static_cast<uint8_t>(rng());
  }
  // Rows the store counts: a NaN or infinity in a row it writes, or a slot beyond the pool.
  int64_t invalid_rows() const {
    int64_t count = 0;
    for (int64_t n = 0; n < rows; ++n) {
      const int64_t slot = slot_values[n];
      bool finite = true;
      for (int64_t i = 0; i < 512; ++i)
        finite = finite && std::isfinite(floats[n * 512 + i]);
      if (slot >= num_blocks * kBlock || (slot >= 0 && !finite)) ++count;
    }
    return count;
  }
};

struct StoreBuffers {
  DeviceBuffer values, slots, cache;
  dsv4::StoreEntriesParams params;

  StoreBuffers(const StoreData& d, Backend backend, void* counter)
      : values(backend, d.values.size()),
        slots(backend, d.slots.size()),
        cache(backend, d.cache.size()) {
    values.upload(d.values.data(), d.values.size());
    slots.upload(d.slots.data(), d.slots.size());
    cache.upload(d.cache.data(), d.cache.size());
    const Device where = backend_device(backend);
    params.values = TensorView::contiguous(values.data(), d.dtype, {d.rows, 512}, where);
    params.slots = TensorView::contiguous(slots.data(), DType::kInt64, {d.rows}, where);
    params.cache = TensorView::contiguous(
        cache.data(), DType::kUInt8, {d.num_blocks, StoreData::kBlock * dsv4::kEntryBytes}, where);
    params.block_size = StoreData::kBlock;
    params.invalid_count = TensorView::contiguous(counter, DType::kInt64, {1}, where);
  }
  std::vector<uint8_t> cache_bytes() const {
    std::vector<uint8_t> bytes(cache.size());
    cache.download(bytes.data(), bytes.size());
    return bytes;
  }
};

// The invalid counters of the calls made in turn and of the one launch, both starting at `start`.
struct CounterPair {
  DeviceBuffer sequential, launch;

  CounterPair(Backend backend, int64_t start) : sequential(backend, 8), launch(backend, 8) {
    const std::vector<uint8_t> bytes = counter_bytes(DType::kInt64, start);
    sequential.upload(bytes.data(), 8);
    launch.upload(bytes.data(), 8);
  }
  // The launch's count, after checking that the calls in turn counted the same bytes.
  int64_t equal_counts() const {
    std::vector<uint8_t> want(8), got(8);
    sequential.download(want.data(), 8);
    launch.download(got.data(), 8);
    EXPECT_EQ(want, got);
    return read_counter(got, DType::kInt64);
  }
};

struct PairCase {
  CallShape first, second;
  int64_t rows_first, rows_second;
  bool bad_rows;  // a row of each call with pages beyond its cache (CUDA: skipped and counted)
};

std::vector<PairCase> pair_cases() {
  const CallShape main{512, 4, 1, dsv4::KeyFormat::kMXFP4};
  const CallShape indexer{128, 4, 1, dsv4::KeyFormat::kMXFP4};
  const CallShape indexer_fp8{128, 4, 2, dsv4::KeyFormat::kFP8};
  const CallShape hca{512, 128, 3, dsv4::KeyFormat::kMXFP4};
  return {
      {main, indexer, 1, 1, false},     {main, indexer, 9, 9, false},
      {main, indexer_fp8, 5, 7, false}, {indexer, main, 6, 2, false},
      {hca, indexer, 3, 10, false},     {indexer, indexer_fp8, 5, 3, false},
      {main, indexer, 7, 9, true},      {hca, indexer_fp8, 6, 5, true},
  };
}

// What one launch runs: two compressor calls (compress), or a store with the first compressor
// call or with both (store_and_compress).
enum class Launch { kCompressPair, kStoreAndOne, kStoreAndPair };

class LayerWrites : public ::testing::TestWithParam<std::tuple<Backend, int, Launch>> {};

TEST_P(LayerWrites, OneLaunchEqualsTheCallsInTurn) {
  const Backend backend = std::get<0>(GetParam());
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << reason;
  const int index = std::get<1>(GetParam());
  const PairCase c = pair_cases()[static_cast<size_t>(index)];
  const Launch launch = std::get<2>(GetParam());
  if (c.bad_rows && backend == Backend::kCPU) GTEST_SKIP() << "the CPU refuses such rows";
  std::mt19937_64 rng(900 + static_cast<uint64_t>(index));
  // Bad rows complete a window (even rows that are not padding): row 0 and row 4.
  const CallData first(c.first, c.rows_first, c.bad_rows ? 0 : -1, rng);
  CallData second(c.second, c.rows_second, c.bad_rows ? 4 : -1, rng);
  // A NaN kv value in the second call's row 0 (its last channel, which enters the window that
  // row completes whatever the ratio): its entry carries NaN markers and both runs count it.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(second.kv.data() + (second.width - 1) * sizeof(float), &nan, sizeof(float));
  // Store rows past one CTA of 16 warps; bf16 and fp32 values in turn.
  const StoreData store(c.rows_first + c.rows_second + 11,
                        index % 2 == 0 ? DType::kBFloat16 : DType::kFloat32, c.bad_rows, rng);
  const bool with_store = launch != Launch::kCompressPair;
  const bool with_second = launch != Launch::kStoreAndOne;

  const CounterPair counters(backend, 2);
  CallBuffers one_a(first, backend, counters.sequential.data());
  CallBuffers one_b(second, backend, counters.sequential.data());
  StoreBuffers one_s(store, backend, counters.sequential.data());
  CallBuffers two_a(first, backend, counters.launch.data());
  CallBuffers two_b(second, backend, counters.launch.data());
  StoreBuffers two_s(store, backend, counters.launch.data());

  if (with_store) dsv4::store_entries(one_s.params);
  dsv4::compress(one_a.params);
  if (with_second) dsv4::compress(one_b.params);
  switch (launch) {
    case Launch::kCompressPair:
      dsv4::compress(two_a.params, two_b.params);
      break;
    case Launch::kStoreAndOne:
      dsv4::store_and_compress(two_s.params, two_a.params);
      break;
    case Launch::kStoreAndPair:
      dsv4::store_and_compress(two_s.params, two_a.params, two_b.params);
      break;
  }
  synchronize(backend);

  EXPECT_EQ(one_a.download(one_a.params.state), two_a.download(two_a.params.state));
  EXPECT_EQ(one_a.download(one_a.params.cache), two_a.download(two_a.params.cache));
  EXPECT_EQ(one_b.download(one_b.params.state), two_b.download(two_b.params.state));
  EXPECT_EQ(one_b.download(one_b.params.cache), two_b.download(two_b.params.cache));
  EXPECT_EQ(one_s.cache_bytes(), two_s.cache_bytes());
  const int64_t first_invalid = c.bad_rows ? 1 : 0;
  const int64_t second_invalid = with_second ? 1 + (c.bad_rows ? 1 : 0) : 0;
  const int64_t store_invalid = with_store ? store.invalid_rows() : 0;
  EXPECT_EQ(counters.equal_counts(), 2 + first_invalid + second_invalid + store_invalid);
  // The calls wrote something: a window completed in some row of each, the store wrote rows.
  EXPECT_NE(two_a.download(two_a.params.cache), first.cache);
  if (with_second) {
    EXPECT_NE(two_b.download(two_b.params.cache), second.cache);
  } else {
    EXPECT_EQ(two_b.download(two_b.params.cache), second.cache);
  }
  if (with_store) {
    EXPECT_NE(two_s.cache_bytes(), store.cache);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Grid, LayerWrites,
    ::testing::Combine(::testing::Values(Backend::kCPU, Backend::kCUDA),
                       ::testing::Range(0, static_cast<int>(pair_cases().size())),
                       ::testing::Values(Launch::kCompressPair, Launch::kStoreAndOne,
                                         Launch::kStoreAndPair)));

// What one call writes must not be what the other reads or writes; the error names both.
TEST(CompressorPairValidation, CallsThatTouchEachOthersOutputsAreRefused) {
  std::mt19937_64 rng(77);
  const CallData main(CallShape{512, 4, 1, dsv4::KeyFormat::kMXFP4}, 3, -1, rng);
  const CallData indexer(CallShape{128, 4, 1, dsv4::KeyFormat::kMXFP4}, 3, -1, rng);
  std::vector<uint8_t> counter = counter_bytes(DType::kInt64, 0);
  CallBuffers a(main, Backend::kCPU, counter.data());
  CallBuffers b(indexer, Backend::kCPU, counter.data());
  auto expect_refused = [&](const dsv4::CompressorParams& x, const dsv4::CompressorParams& y,
                            const std::string& words) {
    const std::vector<uint8_t> state_a = a.download(a.params.state);
    const std::vector<uint8_t> cache_a = a.download(a.params.cache);
    expect_error([&] { dsv4::compress(x, y); }, words);
    EXPECT_EQ(a.download(a.params.state), state_a);
    EXPECT_EQ(a.download(a.params.cache), cache_a);
  };
  // The second call's state over the first call's kv rows.
  dsv4::CompressorParams overlapping = b.params;
  overlapping.state = TensorView::contiguous(const_cast<void*>(a.params.kv.data), DType::kFloat32,
                                             {1, 3, 3, 128}, a.params.kv.device);
  expect_refused(a.params, overlapping, "'second call's state' overlaps 'first call's kv'");
  // Both calls writing one cache (the second call's keys over the first call's pages).
  dsv4::CompressorParams shared_cache = b.params;
  shared_cache.cache = TensorView::contiguous(
      a.params.cache.data, DType::kUInt8, {2, kBlockSize * dsv4::key_bytes(indexer.shape.format)},
      a.params.cache.device);
  expect_refused(a.params, shared_cache, "'first call's cache' overlaps 'second call's cache'");
  // One bad call: the error names it.
  dsv4::CompressorParams bad = b.params;
  bad.ratio = 1;
  expect_refused(a.params, bad, "hdk::dsv4::compress (second call): option 'ratio'");
  expect_refused(bad, b.params, "hdk::dsv4::compress (first call): option 'ratio'");
  // The shared counter is fine: the pair runs.
  EXPECT_NO_THROW(dsv4::compress(a.params, b.params));
}

// A step whose compressor calls have no rows still stores: the launch is the store's warps alone.
class StoreWithoutCompressorRows : public ::testing::TestWithParam<Backend> {};

TEST_P(StoreWithoutCompressorRows, StoresAndLeavesTheCompressorsAlone) {
  const Backend backend = GetParam();
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << reason;
  std::mt19937_64 rng(79);
  const CallData main(CallShape{512, 4, 1, dsv4::KeyFormat::kMXFP4}, 0, -1, rng);
  const CallData indexer(CallShape{128, 4, 1, dsv4::KeyFormat::kMXFP4}, 0, -1, rng);
  const StoreData store(9, DType::kBFloat16, false, rng);
  const CounterPair counters(backend, 0);
  StoreBuffers one(store, backend, counters.sequential.data());
  StoreBuffers two(store, backend, counters.launch.data());
  CallBuffers a(main, backend, counters.launch.data());
  CallBuffers b(indexer, backend, counters.launch.data());
  dsv4::store_entries(one.params);
  dsv4::store_and_compress(two.params, a.params, b.params);
  synchronize(backend);
  EXPECT_EQ(one.cache_bytes(), two.cache_bytes());
  EXPECT_NE(two.cache_bytes(), store.cache);
  EXPECT_EQ(a.download(a.params.state), encode_rows(main.state, DType::kFloat32));
  EXPECT_EQ(a.download(a.params.cache), main.cache);
  EXPECT_EQ(b.download(b.params.cache), indexer.cache);
  EXPECT_EQ(counters.equal_counts(), store.invalid_rows());
}

INSTANTIATE_TEST_SUITE_P(Backends, StoreWithoutCompressorRows,
                         ::testing::Values(Backend::kCPU, Backend::kCUDA));

// store_and_compress: the SWA pool must be a tensor apart from the compressors' tensors, a bad
// call is named, and the CPU's index checks of every call run before any call writes.
TEST(StoreAndCompressValidation, OverlapsBadCallsAndBadSlotsAreRefusedBeforeAnyWrite) {
  std::mt19937_64 rng(78);
  const CallData main(CallShape{512, 4, 1, dsv4::KeyFormat::kMXFP4}, 3, -1, rng);
  const CallData indexer(CallShape{128, 4, 1, dsv4::KeyFormat::kMXFP4}, 3, -1, rng);
  const StoreData store(5, DType::kFloat32, false, rng);
  std::vector<uint8_t> counter = counter_bytes(DType::kInt64, 0);
  CallBuffers a(main, Backend::kCPU, counter.data());
  CallBuffers b(indexer, Backend::kCPU, counter.data());
  StoreBuffers s(store, Backend::kCPU, counter.data());
  auto expect_refused = [&](const dsv4::StoreEntriesParams& x, const dsv4::CompressorParams& y,
                            const dsv4::CompressorParams* z, const std::string& words) {
    const std::vector<uint8_t> state_a = a.download(a.params.state);
    const std::vector<uint8_t> cache_a = a.download(a.params.cache);
    const std::vector<uint8_t> state_b = b.download(b.params.state);
    const std::vector<uint8_t> pool = s.cache_bytes();
    expect_error(
        [&] {
          if (z != nullptr) {
            dsv4::store_and_compress(x, y, *z);
          } else {
            dsv4::store_and_compress(x, y);
          }
        },
        words);
    EXPECT_EQ(a.download(a.params.state), state_a);
    EXPECT_EQ(a.download(a.params.cache), cache_a);
    EXPECT_EQ(b.download(b.params.state), state_b);
    EXPECT_EQ(s.cache_bytes(), pool);
  };
  // The SWA entries written into the main compressor's pool.
  dsv4::StoreEntriesParams inside = s.params;
  inside.cache =
      TensorView::contiguous(const_cast<void*>(a.params.cache.data), DType::kUInt8,
                             {1, StoreData::kBlock * dsv4::kEntryBytes}, a.params.cache.device);
  expect_refused(inside, a.params, nullptr, "'store's cache' overlaps 'compressor's cache'");
  expect_refused(inside, a.params, &b.params,
                 "'store's cache' overlaps 'first compressor's cache'");
  // A compressor's state over the store's values.
  dsv4::CompressorParams over_values = b.params;
  over_values.state =
      TensorView::contiguous(const_cast<void*>(s.params.values.data), DType::kFloat32,
                             {1, 3, 3, 128}, s.params.cache.device);
  expect_refused(s.params, a.params, &over_values,
                 "'second compressor's state' overlaps 'store's values'");
  // One bad call: the error names it.
  dsv4::StoreEntriesParams bad_store = s.params;
  bad_store.block_size = 3;
  expect_refused(bad_store, a.params, &b.params, "hdk::dsv4::store_and_compress (store):");
  dsv4::CompressorParams bad = b.params;
  bad.ratio = 1;
  expect_refused(s.params, a.params, &bad,
                 "hdk::dsv4::store_and_compress (second compressor): option 'ratio'");
  expect_refused(s.params, bad, nullptr,
                 "hdk::dsv4::store_and_compress (compressor): option 'ratio'");
  // A store slot beyond the pool: refused before either compressor writes its state.
  std::vector<uint8_t> beyond = store.slots;
  put_index(beyond, DType::kInt64, 2, store.num_blocks * StoreData::kBlock);
  DeviceBuffer beyond_slots(Backend::kCPU, beyond.size());
  beyond_slots.upload(beyond.data(), beyond.size());
  dsv4::StoreEntriesParams bad_slot = s.params;
  bad_slot.slots = TensorView::contiguous(beyond_slots.data(), DType::kInt64, {store.rows},
                                          s.params.slots.device);
  expect_refused(bad_slot, a.params, &b.params,
                 "hdk::dsv4::store_and_compress (store): slots[2] = ");
  // The shared counter is fine: the launch runs and writes.
  EXPECT_NO_THROW(dsv4::store_and_compress(s.params, a.params, b.params));
  EXPECT_NE(s.cache_bytes(), store.cache);
}

}  // namespace
}  // namespace testing
}  // namespace hdk
