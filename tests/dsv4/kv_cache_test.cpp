// store_entries, gather_entries, store_indexer_keys and gather_indexer_keys against the bit-exact
// reference on every backend this build and machine have: fp32 and bf16 rows with the formats'
// hard cases (zero groups, values beyond FP8's range, denormal-range values, rounding ties, NaN,
// infinity), int32/int64 slots with skipped rows, block sizes 1, 3, 64 and 128, padded pages and
// poisoned caches and outputs; keys in MXFP4, NVFP4 and FP8 (one fp32 scale per key: keys of
// far-apart magnitudes in one page, NaN markers, and pages holding any fp32 scale, NaN included).
// Bytes are compared exactly, except rotated keys (fp32 Hadamard against float64), which are
// compared after decoding within the format's bound.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dsv4/kv_cache/reference/kv_cache_reference.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "support/device_memory.h"
#include "support/kv_cache_case.h"

namespace hdk {
namespace testing {
namespace {

struct StoreCase {
  int64_t N = 16;
  int64_t num_blocks = 4;
  int64_t block_size = 64;
  int64_t page_padding = 0;  // extra bytes between pages
  DType values_dtype = DType::kFloat32;
  DType slots_dtype = DType::kInt32;
  DType counter_dtype = DType::kInt32;
  bool keys = false;  // store_indexer_keys instead of store_entries
  dsv4::KeyFormat format = dsv4::KeyFormat::kMXFP4;
  bool rotate = false;
  uint64_t seed = 1;

  int64_t entry_bytes() const { return keys ? dsv4::key_bytes(format) : dsv4::kEntryBytes; }
  int64_t width() const { return keys ? dsv4::kIndexerKeyDim : dsv4::kHeadDim; }
  // The rows' special patterns fill one scale group (an FP8 key is one group of 128).
  int64_t group_size() const {
    return !keys ? 64 : format == dsv4::KeyFormat::kFP8 ? dsv4::kIndexerKeyDim : 16;
  }
  int64_t page_stride() const { return block_size * entry_bytes() + page_padding; }
  std::string describe() const {
    return std::string(keys ? key_format_name(format) : "entries") + (rotate ? " rotated" : "") +
           " N=" + std::to_string(N) + " blocks=" + std::to_string(num_blocks) +
           " block_size=" + std::to_string(block_size) + " pad=" + std::to_string(page_padding) +
           " " + dtype_name(values_dtype) + " " + dtype_name(slots_dtype) +
           " seed=" + std::to_string(seed);
  }
};

struct StoreInputs {
  std::vector<float> values;
  std::vector<uint8_t> value_bytes, slot_bytes, cache;
  std::vector<int64_t> slots;
};

StoreInputs make_store_inputs(const StoreCase& c) {
  std::mt19937_64 rng(c.seed);
  StoreInputs in;
  in.values = random_rows(rng, c.N, c.width(), true, c.group_size());
  in.value_bytes = encode_rows(in.values, c.values_dtype);
  in.slots = distinct_slots(rng, c.N, c.num_blocks * c.block_size, true);
  in.slot_bytes = index_bytes(in.slots, c.slots_dtype);
  in.cache.assign(static_cast<size_t>(c.num_blocks * c.page_stride()), 0);
  for (auto& byte : in.cache)
    byte = static_cast<uint8_t>(rng());  // poison
  return in;
}

TensorView cache_view(const StoreCase& c, void* data, Device device) {
  return TensorView::strided(data, DType::kUInt8, {c.num_blocks, c.block_size * c.entry_bytes()},
                             {c.page_stride(), 1}, device);
}

// Runs the store on `backend` and on the reference, from the same poisoned cache.
void run_store(const StoreCase& c, Backend backend) {
  SCOPED_TRACE(c.describe());
  const StoreInputs in = make_store_inputs(c);
  const Device device = backend_device(backend);
  const int64_t counter_start = 3;

  std::vector<uint8_t> want_cache = in.cache;
  std::vector<uint8_t> want_counter = counter_bytes(c.counter_dtype, counter_start);
  DeviceBuffer values(backend, in.value_bytes.size()), slots(backend, in.slot_bytes.size()),
      cache(backend, in.cache.size()), counter(backend, 8);
  values.upload(in.value_bytes.data(), in.value_bytes.size());
  slots.upload(in.slot_bytes.data(), in.slot_bytes.size());
  cache.upload(in.cache.data(), in.cache.size());
  const std::vector<uint8_t> start = counter_bytes(c.counter_dtype, counter_start);
  counter.upload(start.data(), 8);

  auto values_view = [&](void* data, Device where) {
    return TensorView::contiguous(data, c.values_dtype, {c.N, c.width()}, where);
  };
  auto slots_view = [&](void* data, Device where) {
    return TensorView::contiguous(data, c.slots_dtype, {c.N}, where);
  };
  auto counter_view = [&](void* data, Device where) {
    return TensorView::contiguous(data, c.counter_dtype, {1}, where);
  };
  std::vector<uint8_t> host_values = in.value_bytes, host_slots = in.slot_bytes;
  if (c.keys) {
    dsv4::StoreIndexerKeysParams p;
    p.block_size = c.block_size, p.format = c.format, p.rotate = c.rotate;
    p.keys = values_view(host_values.data(), Device::cpu());
    p.slots = slots_view(host_slots.data(), Device::cpu());
    p.cache = cache_view(c, want_cache.data(), Device::cpu());
    p.invalid_count = counter_view(want_counter.data(), Device::cpu());
    dsv4::store_indexer_keys_reference(p);
    p.keys = values_view(values.data(), device);
    p.slots = slots_view(slots.data(), device);
    p.cache = cache_view(c, cache.data(), device);
    p.invalid_count = counter_view(counter.data(), device);
    dsv4::store_indexer_keys(p);
  } else {
    dsv4::StoreEntriesParams p;
    p.block_size = c.block_size;
    p.values = values_view(host_values.data(), Device::cpu());
    p.slots = slots_view(host_slots.data(), Device::cpu());
    p.cache = cache_view(c, want_cache.data(), Device::cpu());
    p.invalid_count = counter_view(want_counter.data(), Device::cpu());
    dsv4::store_entries_reference(p);
    p.values = values_view(values.data(), device);
    p.slots = slots_view(slots.data(), device);
    p.cache = cache_view(c, cache.data(), device);
    p.invalid_count = counter_view(counter.data(), device);
    dsv4::store_entries(p);
  }
  synchronize(backend);
  std::vector<uint8_t> got_cache(in.cache.size()), got_counter(8);
  cache.download(got_cache.data(), got_cache.size());
  counter.download(got_counter.data(), 8);

  EXPECT_EQ(read_counter(got_counter, c.counter_dtype),
            read_counter(want_counter, c.counter_dtype));
  EXPECT_GT(read_counter(want_counter, c.counter_dtype), counter_start)
      << "no invalid rows planted";
  if (!c.rotate) {
    // Bit for bit, poison included (nothing outside the written entries changes).
    size_t mismatches = 0;
    for (size_t i = 0; i < got_cache.size(); ++i) {
      if (got_cache[i] != want_cache[i] && ++mismatches <= 5) {
        ADD_FAILURE() << "cache byte " << i << " (page " << i / c.page_stride() << ", offset "
                      << i % c.page_stride() << "): got 0x" << std::hex << int(got_cache[i])
                      << ", want 0x" << int(want_cache[i]);
      }
    }
    EXPECT_EQ(mismatches, 0u);
    return;
  }
  // Rotated keys: untouched bytes exactly, written keys within the FP4 bound of float64.
  double worst = 0;
  for (int64_t n = 0; n < c.N; ++n) {
    const int64_t slot = in.slots[n];
    if (slot < 0) continue;
    const int64_t page = slot / c.block_size, offset = slot % c.block_size;
    std::vector<double> row(in.values.begin() + n * 128, in.values.begin() + n * 128 + 128);
    for (int64_t i = 0; i < 128; ++i) {
      // What the backend read: the values after the dtype round trip.
      float value;
      if (c.values_dtype == DType::kBFloat16) {
        uint16_t bits;
        std::memcpy(&bits, in.value_bytes.data() + 2 * (n * 128 + i), 2);
        uint32_t wide = static_cast<uint32_t>(bits) << 16;
        std::memcpy(&value, &wide, 4);
      } else {
        value = in.values[n * 128 + i];
      }
      row[i] = value;
    }
    const std::vector<double> want = dsv4::hadamard_reference(row);
    const std::vector<double> got = dsv4::decode_key_reference(
        got_cache.data() + page * c.page_stride(), c.block_size, offset, c.format);
    const StoredError error = check_stored_key(got, want, 1e-5, c.format);
    EXPECT_TRUE(error.failure.empty()) << "row " << n << ": " << error.failure;
    worst = std::max(worst, error.max_relative);
  }
  std::vector<uint8_t> written(got_cache.size(), 0);
  const int64_t data_bytes = c.format == dsv4::KeyFormat::kFP8 ? 128 : 64;
  const int64_t scale_bytes = c.entry_bytes() - data_bytes;
  for (int64_t slot : in.slots) {
    if (slot < 0) continue;
    const int64_t page = slot / c.block_size * c.page_stride(), offset = slot % c.block_size;
    std::memset(&written[page + offset * data_bytes], 1, data_bytes);
    std::memset(&written[page + c.block_size * data_bytes + offset * scale_bytes], 1, scale_bytes);
  }
  for (size_t i = 0; i < got_cache.size(); ++i) {
    if (!written[i]) {
      ASSERT_EQ(got_cache[i], in.cache[i]) << "untouched byte " << i;
    }
  }
}

std::vector<StoreCase> store_cases() {
  std::vector<StoreCase> cases;
  uint64_t seed = 100;
  for (bool keys : {false, true}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      for (int64_t block_size : {1, 3, 64, 128}) {
        for (int64_t N : {1, 40, 200}) {
          StoreCase c;
          c.keys = keys, c.values_dtype = dtype, c.block_size = block_size;
          c.N = N == 1 ? 7 : N;  // every pattern up to NaN at least once
          c.num_blocks = (c.N + block_size - 1) / block_size + 2;
          c.slots_dtype = N == 40 ? DType::kInt64 : DType::kInt32;
          c.counter_dtype = block_size == 3 ? DType::kInt64 : DType::kInt32;
          c.page_padding = block_size == 3 ? 16 : 0;
          c.seed = ++seed;
          if (keys) {
            for (dsv4::KeyFormat format :
                 {dsv4::KeyFormat::kMXFP4, dsv4::KeyFormat::kNVFP4, dsv4::KeyFormat::kFP8}) {
              for (bool rotate : {false, true}) {
                c.format = format, c.rotate = rotate, c.seed = ++seed;
                cases.push_back(c);
              }
            }
          } else {
            cases.push_back(c);
          }
        }
      }
    }
  }
  return cases;
}

class KvStore : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(KvStore, MatchesReference) {
  const Backend backend = std::get<0>(GetParam());
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << backend_name(backend) << " backend skipped: " << reason;
  static const std::vector<StoreCase> cases = store_cases();
  run_store(cases[std::get<1>(GetParam())], backend);
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return std::string(backend_name(std::get<0>(info.param))) + "_case" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, KvStore,
    ::testing::Combine(::testing::Values(Backend::kCPU, Backend::kCUDA),
                       ::testing::Range(0, static_cast<int>(store_cases().size()))),
    param_name);

// ---- gather ---------------------------------------------------------------------------------

struct GatherCase {
  int64_t N = 3, L = 128;
  int64_t num_blocks = 6, block_size = 64;
  DType out_dtype = DType::kFloat32;
  DType slots_dtype = DType::kInt32;
  bool keys = false;
  dsv4::KeyFormat format = dsv4::KeyFormat::kMXFP4;
  uint64_t seed = 1;
};

void run_gather(const GatherCase& c, Backend backend) {
  SCOPED_TRACE(std::string(c.keys ? key_format_name(c.format) : "entries") + " N=" +
               std::to_string(c.N) + " L=" + std::to_string(c.L) + " " + dtype_name(c.out_dtype) +
               " block_size=" + std::to_string(c.block_size) + " seed=" + std::to_string(c.seed));
  std::mt19937_64 rng(c.seed);
  const int64_t entry_bytes = c.keys ? dsv4::key_bytes(c.format) : dsv4::kEntryBytes;
  const int64_t width = c.keys ? dsv4::kIndexerKeyDim : dsv4::kHeadDim;
  const int64_t num_slots = c.num_blocks * c.block_size;
  // Fill the cache with the reference store of random rows (special patterns included).
  std::vector<uint8_t> cache(static_cast<size_t>(num_slots * entry_bytes), 0);
  {
    const int64_t group_size = !c.keys                             ? 64
                               : c.format == dsv4::KeyFormat::kFP8 ? dsv4::kIndexerKeyDim
                                                                   : 16;
    std::vector<float> rows = random_rows(rng, num_slots, width, true, group_size);
    std::vector<int64_t> all(static_cast<size_t>(num_slots));
    for (int64_t i = 0; i < num_slots; ++i)
      all[i] = i;
    std::vector<uint8_t> slot_bytes = index_bytes(all, DType::kInt64);
    const TensorView values =
        TensorView::contiguous(rows.data(), DType::kFloat32, {num_slots, width});
    const TensorView slots = TensorView::contiguous(slot_bytes.data(), DType::kInt64, {num_slots});
    const TensorView pool = TensorView::contiguous(cache.data(), DType::kUInt8,
                                                   {c.num_blocks, c.block_size * entry_bytes});
    if (c.keys) {
      dsv4::StoreIndexerKeysParams p;
      p.keys = values, p.slots = slots, p.cache = pool, p.block_size = c.block_size;
      p.format = c.format, p.rotate = false;
      dsv4::store_indexer_keys_reference(p);
    } else {
      dsv4::StoreEntriesParams p;
      p.values = values, p.slots = slots, p.cache = pool, p.block_size = c.block_size;
      dsv4::store_entries_reference(p);
    }
  }
  std::vector<int64_t> slots(static_cast<size_t>(c.N * c.L));
  for (auto& slot : slots)
    slot = (rng() % 7 == 0) ? -1 : static_cast<int64_t>(rng() % num_slots);
  const std::vector<uint8_t> slot_bytes = index_bytes(slots, c.slots_dtype);
  const size_t out_bytes = static_cast<size_t>(c.N * c.L * width) * dtype_size(c.out_dtype);
  std::vector<uint8_t> want(out_bytes, 0xab);

  DeviceBuffer d_cache(backend, cache.size()), d_slots(backend, slot_bytes.size()),
      d_out(backend, out_bytes);
  d_cache.upload(cache.data(), cache.size());
  d_slots.upload(slot_bytes.data(), slot_bytes.size());
  d_out.fill(0xab);
  std::vector<uint8_t> host_slots = slot_bytes;
  auto bind = [&](auto& p, void* pool, void* index, void* out, Device where) {
    p.cache = TensorView::contiguous(pool, DType::kUInt8,
                                     {c.num_blocks, c.block_size * entry_bytes}, where);
    p.block_size = c.block_size;
    p.slots = TensorView::contiguous(index, c.slots_dtype, {c.N, c.L}, where);
    p.out = TensorView::contiguous(out, c.out_dtype, {c.N, c.L, width}, where);
  };
  const Device device = backend_device(backend);
  if (c.keys) {
    dsv4::GatherIndexerKeysParams p;
    p.format = c.format;
    bind(p, cache.data(), host_slots.data(), want.data(), Device::cpu());
    dsv4::gather_indexer_keys_reference(p);
    bind(p, d_cache.data(), d_slots.data(), d_out.data(), device);
    dsv4::gather_indexer_keys(p);
  } else {
    dsv4::GatherEntriesParams p;
    bind(p, cache.data(), host_slots.data(), want.data(), Device::cpu());
    dsv4::gather_entries_reference(p);
    bind(p, d_cache.data(), d_slots.data(), d_out.data(), device);
    dsv4::gather_entries(p);
  }
  synchronize(backend);
  std::vector<uint8_t> got(out_bytes);
  d_out.download(got.data(), out_bytes);
  size_t mismatches = 0;
  const size_t element = dtype_size(c.out_dtype);
  for (size_t i = 0; i < out_bytes; i += element) {
    if (std::memcmp(&got[i], &want[i], element) != 0 && ++mismatches <= 5) {
      const size_t index = i / element;
      ADD_FAILURE() << "out element [" << index / (c.L * width) << ", " << index / width % c.L
                    << ", " << index % width << "] differs from the reference";
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

class KvGather : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

std::vector<GatherCase> gather_cases() {
  std::vector<GatherCase> cases;
  uint64_t seed = 900;
  for (bool keys : {false, true}) {
    for (DType out : {DType::kFloat32, DType::kBFloat16}) {
      for (int64_t block_size : {1, 64}) {
        GatherCase c;
        c.keys = keys, c.out_dtype = out, c.block_size = block_size, c.seed = ++seed;
        c.num_blocks = block_size == 1 ? 300 : 5;
        c.slots_dtype = out == DType::kBFloat16 ? DType::kInt64 : DType::kInt32;
        c.format = block_size == 1 ? dsv4::KeyFormat::kNVFP4 : dsv4::KeyFormat::kMXFP4;
        cases.push_back(c);
        if (keys) {
          c.format = dsv4::KeyFormat::kFP8, c.seed = ++seed;
          cases.push_back(c);
        }
      }
    }
  }
  // Row counts that are no multiple of a CUDA warp's rows, and rows of one warp that span
  // several n (L < 32, and L not dividing it).
  for (const auto& [N, L] : {std::pair<int64_t, int64_t>{5, 37}, {7, 3}}) {
    GatherCase c;
    c.N = N, c.L = L, c.seed = ++seed;
    c.out_dtype = L == 3 ? DType::kBFloat16 : DType::kFloat32;
    cases.push_back(c);
  }
  return cases;
}

TEST_P(KvGather, MatchesReference) {
  const Backend backend = std::get<0>(GetParam());
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << backend_name(backend) << " backend skipped: " << reason;
  static const std::vector<GatherCase> cases = gather_cases();
  run_gather(cases[std::get<1>(GetParam())], backend);
}

INSTANTIATE_TEST_SUITE_P(
    Grid, KvGather,
    ::testing::Combine(::testing::Values(Backend::kCPU, Backend::kCUDA),
                       ::testing::Range(0, static_cast<int>(gather_cases().size()))),
    param_name);

// ---- the FP8 error bound, end to end ---------------------------------------------------------

// store_entries then gather_entries against the float64 input: every non-RoPE value within
// 2^-4 |x| + 2^-10 * scale, every RoPE value within bf16's 2^-8 |x|; the worst relative error
// seen is printed (and stays at or below kFp8RelativeErrorBound for values above 2^-6 * scale).
TEST(KvErrorBound, StoreThenGatherWithinFp8Bound) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    SCOPED_TRACE(backend_name(backend));
    std::mt19937_64 rng(77);
    const int64_t N = 256, block_size = 64, num_blocks = 4;
    std::vector<float> values = random_rows(rng, N, 512, false, 64);
    std::vector<int64_t> slots = distinct_slots(rng, N, num_blocks * block_size, false);
    std::vector<uint8_t> slot_bytes = index_bytes(slots, DType::kInt64);
    DeviceBuffer d_values(backend, values.size() * 4), d_slots(backend, slot_bytes.size()),
        d_cache(backend, num_blocks * block_size * 584), d_out(backend, N * 512 * 4);
    d_values.upload(values.data(), values.size() * 4);
    d_slots.upload(slot_bytes.data(), slot_bytes.size());
    d_cache.fill(0x5a);
    d_out.fill(0xff);
    const Device device = backend_device(backend);
    dsv4::StoreEntriesParams store;
    store.values = TensorView::contiguous(d_values.data(), DType::kFloat32, {N, 512}, device);
    store.slots = TensorView::contiguous(d_slots.data(), DType::kInt64, {N}, device);
    store.cache = TensorView::contiguous(d_cache.data(), DType::kUInt8,
                                         {num_blocks, block_size * 584}, device);
    store.block_size = block_size;
    dsv4::store_entries(store);
    dsv4::GatherEntriesParams gather;
    gather.cache = store.cache, gather.block_size = block_size;
    gather.slots = TensorView::contiguous(d_slots.data(), DType::kInt64, {1, N}, device);
    gather.out = TensorView::contiguous(d_out.data(), DType::kFloat32, {1, N, 512}, device);
    dsv4::gather_entries(gather);
    synchronize(backend);
    std::vector<float> out(N * 512);
    std::vector<uint8_t> cache(num_blocks * block_size * 584);
    d_out.download(out.data(), out.size() * 4);
    d_cache.download(cache.data(), cache.size());
    double worst_normal = 0;
    for (int64_t n = 0; n < N; ++n) {
      const int64_t slot = slots[n];
      const uint8_t* scales = cache.data() + slot / block_size * block_size * 584 +
                              block_size * 576 + slot % block_size * 8;
      std::vector<double> want(values.begin() + n * 512, values.begin() + n * 512 + 512);
      std::vector<double> got(out.begin() + n * 512, out.begin() + n * 512 + 512);
      const StoredError error = check_stored_entry(got, want, scales, 0.0);
      ASSERT_TRUE(error.failure.empty()) << "row " << n << ": " << error.failure;
      for (int64_t i = 0; i < 448; ++i) {
        const double scale = std::ldexp(1.0, scales[i / 64] - 127);
        if (std::fabs(want[i]) >= scale / 64) {
          worst_normal = std::max(worst_normal, std::fabs(got[i] - want[i]) / std::fabs(want[i]));
        }
      }
    }
    EXPECT_LE(worst_normal, dsv4::kFp8RelativeErrorBound);
    std::printf("[ %s ] FP8 store + gather: largest relative error %.5f (bound %.4f)\n",
                backend_name(backend), worst_normal, dsv4::kFp8RelativeErrorBound);
  }
}

// ---- FP8 keys: one fp32 scale per key --------------------------------------------------------

// Keys whose magnitudes lie 2^-130 .. 2^100 apart (fp32 denormals, keys below the 1e-4 scale
// floor, keys near fp32's largest value) in pages of 5, one with a NaN and one with an infinity:
// store then gather. Unrotated: the store's bytes equal the reference's (the scale is the exact
// power of two, the marked keys are 128 x 0x7F and the fp32 NaN 0x7FC00000) and so do the
// gather's values; rotated and unrotated, every value is within the FP8 bound of the float64 key
// (the worst relative error above 2^-6 x scale is printed).
TEST(KvFp8Keys, FarApartScalesStoreThenGather) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    for (bool rotate : {false, true}) {
      SCOPED_TRACE(std::string(backend_name(backend)) + (rotate ? " rotated" : ""));
      const int64_t N = 24, block_size = 5, num_blocks = 6, bytes = block_size * 132;
      std::mt19937_64 rng(rotate ? 808 : 807);
      std::vector<float> keys = normal_values(rng, N * 128, 1.0f);
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t i = 0; i < 128; ++i)
          keys[n * 128 + i] = std::ldexp(keys[n * 128 + i], static_cast<int>(-130 + 10 * n));
      }
      keys[7 * 128 + 9] = std::numeric_limits<float>::quiet_NaN();
      keys[16 * 128 + 127] = -std::numeric_limits<float>::infinity();
      std::vector<int64_t> slots = distinct_slots(rng, N, num_blocks * block_size, false);
      const std::vector<uint8_t> slot_bytes = index_bytes(slots, DType::kInt32);
      std::vector<uint8_t> want(num_blocks * bytes, 0x3c);
      std::vector<uint8_t> want_counter = counter_bytes(DType::kInt32, 0);
      DeviceBuffer d_keys(backend, keys.size() * 4), d_slots(backend, slot_bytes.size()),
          d_cache(backend, want.size()), d_counter(backend, 8), d_out(backend, N * 128 * 4);
      d_keys.upload(keys.data(), keys.size() * 4);
      d_slots.upload(slot_bytes.data(), slot_bytes.size());
      d_cache.fill(0x3c);
      d_counter.upload(want_counter.data(), 8);
      d_out.fill(0xff);
      const Device device = backend_device(backend);
      dsv4::StoreIndexerKeysParams store;
      store.block_size = block_size, store.format = dsv4::KeyFormat::kFP8, store.rotate = rotate;
      std::vector<uint8_t> host_slots = slot_bytes;
      store.keys = TensorView::contiguous(keys.data(), DType::kFloat32, {N, 128});
      store.slots = TensorView::contiguous(host_slots.data(), DType::kInt32, {N});
      store.cache = TensorView::contiguous(want.data(), DType::kUInt8, {num_blocks, bytes});
      store.invalid_count = TensorView::contiguous(want_counter.data(), DType::kInt32, {1});
      dsv4::store_indexer_keys_reference(store);
      store.keys = TensorView::contiguous(d_keys.data(), DType::kFloat32, {N, 128}, device);
      store.slots = TensorView::contiguous(d_slots.data(), DType::kInt32, {N}, device);
      store.cache =
          TensorView::contiguous(d_cache.data(), DType::kUInt8, {num_blocks, bytes}, device);
      store.invalid_count = TensorView::contiguous(d_counter.data(), DType::kInt32, {1}, device);
      dsv4::store_indexer_keys(store);
      dsv4::GatherIndexerKeysParams gather;
      gather.cache = store.cache, gather.block_size = block_size;
      gather.format = dsv4::KeyFormat::kFP8;
      gather.slots = TensorView::contiguous(d_slots.data(), DType::kInt32, {1, N}, device);
      gather.out = TensorView::contiguous(d_out.data(), DType::kFloat32, {1, N, 128}, device);
      dsv4::gather_indexer_keys(gather);
      synchronize(backend);
      std::vector<uint8_t> cache(want.size()), counter(8);
      std::vector<float> out(N * 128);
      d_cache.download(cache.data(), cache.size());
      d_counter.download(counter.data(), 8);
      d_out.download(out.data(), out.size() * 4);

      EXPECT_EQ(read_counter(counter, DType::kInt32), 2);
      EXPECT_EQ(read_counter(want_counter, DType::kInt32), 2);
      double worst = 0;
      for (int64_t n = 0; n < N; ++n) {
        const int64_t page = slots[n] / block_size, offset = slots[n] % block_size;
        const uint8_t* data = cache.data() + page * bytes + offset * 128;
        const uint8_t* scale = cache.data() + page * bytes + block_size * 128 + offset * 4;
        if (!rotate) {
          ASSERT_EQ(std::memcmp(data, want.data() + page * bytes + offset * 128, 128), 0)
              << "codes of key " << n;
          ASSERT_EQ(
              std::memcmp(scale, want.data() + page * bytes + block_size * 128 + offset * 4, 4), 0)
              << "scale of key " << n;
        }
        uint32_t scale_bits;
        std::memcpy(&scale_bits, scale, 4);
        if (n == 7 || n == 16) {
          EXPECT_EQ(scale_bits, 0x7fc00000u) << "NaN scale of key " << n;
          for (int64_t i = 0; i < 128; ++i)
            ASSERT_EQ(data[i], 0x7f) << "NaN code " << i << " of key " << n;
        } else {
          EXPECT_EQ(scale_bits & 0x807fffffu, 0u) << "a positive power of two, key " << n;
        }
        std::vector<double> row(keys.begin() + n * 128, keys.begin() + n * 128 + 128);
        if (rotate) row = dsv4::hadamard_reference(row);
        const std::vector<double> got(out.begin() + n * 128, out.begin() + n * 128 + 128);
        const StoredError error = check_stored_key(got, row, 1e-5, dsv4::KeyFormat::kFP8);
        EXPECT_TRUE(error.failure.empty()) << "key " << n << ": " << error.failure;
        float scale_value;
        std::memcpy(&scale_value, &scale_bits, 4);
        for (int64_t i = 0; i < 128 && std::isfinite(scale_value); ++i) {
          if (std::fabs(row[i]) >= scale_value / 64) {
            worst = std::max(worst, std::fabs(got[i] - row[i]) / std::fabs(row[i]));
          }
        }
      }
      EXPECT_LE(worst, dsv4::kFp8RelativeErrorBound);
      std::printf("[ %s ] FP8 keys%s store + gather: largest relative error %.5f (bound %.4f)\n",
                  backend_name(backend), rotate ? " (rotated)" : "", worst,
                  dsv4::kFp8RelativeErrorBound);
    }
  }
}

// gather_indexer_keys of FP8 pages that hold any fp32 scale (written by another engine, or
// garbage): code x scale for NaN scales (two payloads), infinities, zeros, a denormal, negative
// and non-power-of-two scales, fp32's largest and smallest normal, and codes 0x7F / 0xFF; equal
// bit for bit to the reference's decoding (one fp32 product, rounded once; the canonical NaN
// for every NaN), in fp32 and bf16. A key with a NaN scale is NaN everywhere.
TEST(KvFp8Keys, GatherDecodesAnyScale) {
  const std::vector<uint32_t> scale_bits = {0x7fc00000u, 0xffffffffu, 0x7f800000u, 0xff800000u,
                                            0x00000000u, 0x80000000u, 0x00000400u, 0x40533333u,
                                            0xbf400000u, 0x7f7fffffu, 0x00800000u, 0x3f800000u,
                                            0x35800000u, 0x4b000001u, 0x1f800000u, 0x3e9a209bu};
  const int64_t block_size = 8, num_blocks = 2, num_keys = block_size * num_blocks;
  const int64_t bytes = block_size * 132;
  std::mt19937_64 rng(99);
  std::vector<uint8_t> cache(num_blocks * bytes);
  for (auto& byte : cache)
    byte = static_cast<uint8_t>(rng());
  for (int64_t key = 0; key < num_keys; ++key) {
    const int64_t page = key / block_size, offset = key % block_size;
    std::memcpy(&cache[page * bytes + block_size * 128 + offset * 4], &scale_bits[key], 4);
    cache[page * bytes + offset * 128 + 5] = 0x7f;  // NaN codes in every key
    cache[page * bytes + offset * 128 + 77] = 0xff;
    cache[page * bytes + offset * 128 + 3] = 0x00;  // zeros (0 x infinity is NaN)
    cache[page * bytes + offset * 128 + 4] = 0x80;
  }
  // Every key once in a shuffled order, then a zero row and a repeat: [2, 9].
  std::vector<int64_t> slots(num_keys);
  for (int64_t i = 0; i < num_keys; ++i)
    slots[i] = (i * 5 + 3) % num_keys;
  slots.push_back(-1);
  slots.push_back(4);
  const int64_t columns = static_cast<int64_t>(slots.size()) / 2;
  const std::vector<uint8_t> slot_bytes = index_bytes(slots, DType::kInt64);
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      SCOPED_TRACE(std::string(backend_name(backend)) + " " + dtype_name(dtype));
      const size_t out_bytes = slots.size() * 128 * dtype_size(dtype);
      std::vector<uint8_t> want(out_bytes, 0xab), host_cache = cache, host_slots = slot_bytes;
      dsv4::GatherIndexerKeysParams p;
      p.block_size = block_size, p.format = dsv4::KeyFormat::kFP8;
      p.cache = TensorView::contiguous(host_cache.data(), DType::kUInt8, {num_blocks, bytes});
      p.slots = TensorView::contiguous(host_slots.data(), DType::kInt64, {2, columns});
      p.out = TensorView::contiguous(want.data(), dtype, {2, columns, 128});
      dsv4::gather_indexer_keys_reference(p);
      DeviceBuffer d_cache(backend, cache.size()), d_slots(backend, slot_bytes.size()),
          d_out(backend, out_bytes);
      d_cache.upload(cache.data(), cache.size());
      d_slots.upload(slot_bytes.data(), slot_bytes.size());
      d_out.fill(0xab);
      const Device device = backend_device(backend);
      p.cache = TensorView::contiguous(d_cache.data(), DType::kUInt8, {num_blocks, bytes}, device);
      p.slots = TensorView::contiguous(d_slots.data(), DType::kInt64, {2, columns}, device);
      p.out = TensorView::contiguous(d_out.data(), dtype, {2, columns, 128}, device);
      dsv4::gather_indexer_keys(p);
      synchronize(backend);
      std::vector<uint8_t> got(out_bytes);
      d_out.download(got.data(), out_bytes);
      const size_t element = dtype_size(dtype);
      size_t mismatches = 0;
      for (size_t i = 0; i < out_bytes; i += element) {
        if (std::memcmp(&got[i], &want[i], element) != 0 && ++mismatches <= 5) {
          const size_t index = i / element;
          const int64_t key = slots[index / 128];
          ADD_FAILURE() << "key " << key << " (scale bits 0x" << std::hex
                        << (key >= 0 ? scale_bits[key] : 0u) << std::dec << ") value "
                        << index % 128 << " differs from the reference";
        }
      }
      EXPECT_EQ(mismatches, 0u);
      // Keys 0 and 1 hold NaN scales: NaN everywhere, as the canonical NaN.
      for (size_t row = 0; row < slots.size(); ++row) {
        if (slots[row] != 0 && slots[row] != 1) continue;
        for (size_t i = 0; i < 128; ++i) {
          const size_t at = (row * 128 + i) * element;
          if (dtype == DType::kFloat32) {
            uint32_t bits;
            std::memcpy(&bits, &got[at], 4);
            ASSERT_EQ(bits, 0x7fc00000u) << "key " << slots[row] << " value " << i;
          } else {
            uint16_t bits;
            std::memcpy(&bits, &got[at], 2);
            ASSERT_EQ(bits, 0x7fc0u) << "key " << slots[row] << " value " << i;
          }
        }
      }
    }
  }
}

// On CUDA the FP8 pages' 4-byte code words and fp32 scales need a 4-byte aligned cache: a
// misaligned one is an hdk::Error naming 'cache', before anything is written.
TEST(KvFp8Keys, CudaRefusesAMisalignedCache) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  const Device cuda = backend_device(Backend::kCUDA);
  const std::vector<float> keys(2 * 128, 1.0f);
  const std::vector<uint8_t> slot_bytes = index_bytes({0, 1}, DType::kInt32);
  DeviceBuffer d_keys(Backend::kCUDA, keys.size() * 4), d_slots(Backend::kCUDA, 8),
      d_cache(Backend::kCUDA, 4 * 132 + 8);
  d_keys.upload(keys.data(), keys.size() * 4);
  d_slots.upload(slot_bytes.data(), 8);
  d_cache.fill(0x21);
  dsv4::StoreIndexerKeysParams p;
  p.keys = TensorView::contiguous(d_keys.data(), DType::kFloat32, {2, 128}, cuda);
  p.slots = TensorView::contiguous(d_slots.data(), DType::kInt32, {2}, cuda);
  p.cache = TensorView::contiguous(static_cast<uint8_t*>(d_cache.data()) + 2, DType::kUInt8,
                                   {1, 4 * 132}, cuda);
  p.block_size = 4, p.format = dsv4::KeyFormat::kFP8;
  try {
    dsv4::store_indexer_keys(p);
    ADD_FAILURE() << "no hdk::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what())
                  .find("argument 'cache' must be 4-byte aligned with a page "
                        "stride that is a multiple of 4 bytes on CUDA for "
                        "FP8 keys"),
              std::string::npos)
        << error.what();
  }
  synchronize(Backend::kCUDA);
  std::vector<uint8_t> cache(4 * 132 + 8);
  d_cache.download(cache.data(), cache.size());
  for (uint8_t byte : cache)
    ASSERT_EQ(byte, 0x21);
}

// ---- out-of-range slots: an error on the CPU before writing, counted rows on CUDA ------------

TEST(KvSlotsOutOfRange, CpuThrowsBeforeWriting) {
  std::vector<float> values(4 * 512, 1.0f);
  std::vector<int64_t> slots = {0, 5, 128, 2};  // 2 blocks of 64: 128 is beyond
  std::vector<uint8_t> cache(2 * 64 * 584, 0x33);
  dsv4::StoreEntriesParams p;
  p.values = TensorView::contiguous(values.data(), DType::kFloat32, {4, 512});
  p.slots = TensorView::contiguous(slots.data(), DType::kInt64, {4});
  p.cache = TensorView::contiguous(cache.data(), DType::kUInt8, {2, 64 * 584});
  p.block_size = 64;
  try {
    dsv4::store_entries(p);
    ADD_FAILURE() << "no hdk::Error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("slots[2] = 128 is beyond the cache"),
              std::string::npos)
        << error.what();
  }
  for (uint8_t byte : cache)
    ASSERT_EQ(byte, 0x33);
}

TEST(KvSlotsOutOfRange, CudaCountsAndSkips) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  const Device cuda = backend_device(Backend::kCUDA);
  std::mt19937_64 rng(5);
  std::vector<float> values = random_rows(rng, 4, 512, false, 64);
  std::vector<int64_t> slots = {0, 5, 128, 2};
  std::vector<uint8_t> slot_bytes = index_bytes(slots, DType::kInt64);
  DeviceBuffer d_values(Backend::kCUDA, values.size() * 4), d_slots(Backend::kCUDA, 32),
      d_cache(Backend::kCUDA, 2 * 64 * 584), d_counter(Backend::kCUDA, 8),
      d_out(Backend::kCUDA, 4 * 512 * 4);
  d_values.upload(values.data(), values.size() * 4);
  d_slots.upload(slot_bytes.data(), 32);
  d_cache.fill(0x33);
  const std::vector<uint8_t> zero = counter_bytes(DType::kInt32, 0);
  d_counter.upload(zero.data(), 8);
  dsv4::StoreEntriesParams p;
  p.values = TensorView::contiguous(d_values.data(), DType::kFloat32, {4, 512}, cuda);
  p.slots = TensorView::contiguous(d_slots.data(), DType::kInt64, {4}, cuda);
  p.cache = TensorView::contiguous(d_cache.data(), DType::kUInt8, {2, 64 * 584}, cuda);
  p.block_size = 64;
  p.invalid_count = TensorView::contiguous(d_counter.data(), DType::kInt32, {1}, cuda);
  dsv4::store_entries(p);
  dsv4::GatherEntriesParams g;
  g.cache = p.cache, g.block_size = 64;
  g.slots = TensorView::contiguous(d_slots.data(), DType::kInt64, {1, 4}, cuda);
  g.out = TensorView::contiguous(d_out.data(), DType::kFloat32, {1, 4, 512}, cuda);
  g.invalid_count = p.invalid_count;
  d_out.fill(0xff);
  dsv4::gather_entries(g);
  synchronize(Backend::kCUDA);
  std::vector<uint8_t> counter(8);
  d_counter.download(counter.data(), 8);
  EXPECT_EQ(read_counter(counter, DType::kInt32), 2);  // one skipped store, one zero row
  std::vector<float> out(4 * 512);
  d_out.download(out.data(), out.size() * 4);
  for (int64_t i = 0; i < 512; ++i)
    ASSERT_EQ(out[2 * 512 + i], 0.0f) << "the out-of-range slot's row is zero";

  // check_indices: the same call is an hdk::Error naming the slot, and writes nothing.
  d_cache.fill(0x44);
  p.check_indices = true;
  try {
    dsv4::store_entries(p);
    ADD_FAILURE() << "no hdk::Error with check_indices";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("slots[2] = 128 is beyond the cache"),
              std::string::npos)
        << error.what();
  }
  synchronize(Backend::kCUDA);
  std::vector<uint8_t> cache(2 * 64 * 584);
  d_cache.download(cache.data(), cache.size());
  for (uint8_t byte : cache)
    ASSERT_EQ(byte, 0x44);
}

}  // namespace
}  // namespace testing
}  // namespace hdk
