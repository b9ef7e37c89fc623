// hdk::dsv4::quantize_indexer_query on every backend this build and machine have: each [n, h]
// vector of q (fp32 / bf16, the KV cache tests' hard rows: zero groups, values beyond FP8's
// range, denormal-range values, exact E2M1 rounding ties, NaN, infinity) becomes exactly the 68
// bytes store_indexer_keys writes for the same vector as a kMXFP4 key on the same backend
// (rotated or not), and, unrotated, exactly the float64 reference's bytes; rotated vectors
// decode within the FP4 bound of the float64 rotation. q and the outputs are strided with
// padding that must stay poisoned; non-finite vectors are counted. Every bad argument is an
// hdk::Error naming it, with every buffer untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dsv4/index_topk/reference/query_quantize_reference.h"
#include "dsv4/kv_cache/reference/kv_cache_reference.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "support/device_memory.h"
#include "support/expect_error.h"
#include "support/kv_cache_case.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hdk {
namespace testing {
namespace {

struct QueryCase {
  int64_t N = 3, H = 4;
  DType dtype = DType::kFloat32;
  DType counter_dtype = DType::kInt32;
  bool rotate = true;
  int64_t q_head_pad = 0;       // elements between heads of q beyond 128
  int64_t packed_head_pad = 0;  // bytes between vectors of q_packed beyond 64
  int64_t scales_head_pad = 0;  // bytes between vectors of q_scales beyond 4
  int64_t out_offset = 0;       // bytes from the buffers' start to q_packed / q_scales
  uint64_t seed = 1;

  int64_t q_head_stride() const { return 128 + q_head_pad; }
  int64_t q_row_stride() const { return H * q_head_stride() + 8; }
  int64_t packed_head_stride() const { return 64 + packed_head_pad; }
  int64_t packed_row_stride() const { return H * packed_head_stride() + 2 * packed_head_pad; }
  int64_t scales_head_stride() const { return 4 + scales_head_pad; }
  int64_t scales_row_stride() const { return H * scales_head_stride() + scales_head_pad; }
  size_t packed_bytes() const { return static_cast<size_t>(out_offset + N * packed_row_stride()); }
  size_t scales_bytes() const { return static_cast<size_t>(out_offset + N * scales_row_stride()); }
  std::string describe() const {
    return "N=" + std::to_string(N) + " H=" + std::to_string(H) + " " + dtype_name(dtype) +
           (rotate ? " rotated" : "") + " pads=" + std::to_string(q_head_pad) + "/" +
           std::to_string(packed_head_pad) + "/" + std::to_string(scales_head_pad) +
           " offset=" + std::to_string(out_offset) + " seed=" + std::to_string(seed);
  }
};

// The [n, h] vectors of a case as rows [N * H, 128] (fp32, before the dtype round trip).
std::vector<float> case_rows(const QueryCase& c) {
  std::mt19937_64 rng(c.seed);
  return random_rows(rng, c.N * c.H, 128, true, 32);
}

// q as `dtype` bytes at its strides, the padding poisoned.
std::vector<uint8_t> q_bytes(const QueryCase& c, const std::vector<float>& rows) {
  const size_t element = dtype_size(c.dtype);
  std::vector<uint8_t> bytes(static_cast<size_t>(c.N * c.q_row_stride()) * element, 0xee);
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t h = 0; h < c.H; ++h) {
      for (int64_t i = 0; i < 128; ++i) {
        put_float(bytes, c.dtype,
                  static_cast<size_t>(n * c.q_row_stride() + h * c.q_head_stride() + i),
                  rows[(n * c.H + h) * 128 + i]);
      }
    }
  }
  return bytes;
}

// What the backend read: the vector after the dtype round trip, as float64.
std::vector<double> read_back(const QueryCase& c, const std::vector<uint8_t>& q, int64_t n,
                              int64_t h) {
  std::vector<double> x(128);
  for (int64_t i = 0; i < 128; ++i) {
    const size_t index = static_cast<size_t>(n * c.q_row_stride() + h * c.q_head_stride() + i);
    if (c.dtype == DType::kBFloat16) {
      uint16_t bits;
      std::memcpy(&bits, q.data() + 2 * index, 2);
      const uint32_t wide = static_cast<uint32_t>(bits) << 16;
      float value;
      std::memcpy(&value, &wide, 4);
      x[i] = value;
    } else {
      float value;
      std::memcpy(&value, q.data() + 4 * index, 4);
      x[i] = value;
    }
  }
  return x;
}

TensorView q_view(const QueryCase& c, void* data, Device device) {
  return TensorView::strided(data, c.dtype, {c.N, c.H, 128},
                             {c.q_row_stride(), c.q_head_stride(), 1}, device);
}
TensorView packed_view(const QueryCase& c, void* buffer, Device device) {
  return TensorView::strided(static_cast<uint8_t*>(buffer) + c.out_offset, DType::kUInt8,
                             {c.N, c.H, 64}, {c.packed_row_stride(), c.packed_head_stride(), 1},
                             device);
}
TensorView scales_view(const QueryCase& c, void* buffer, Device device) {
  return TensorView::strided(static_cast<uint8_t*>(buffer) + c.out_offset, DType::kUInt8,
                             {c.N, c.H, 4}, {c.scales_row_stride(), c.scales_head_stride(), 1},
                             device);
}

constexpr uint8_t kPackedPoison = 0xa5;
constexpr uint8_t kScalesPoison = 0x5a;
constexpr int64_t kCounterStart = 5;

void run_case(const QueryCase& c, Backend backend) {
  SCOPED_TRACE(c.describe());
  const Device device = backend_device(backend);
  const std::vector<float> rows = case_rows(c);
  std::vector<uint8_t> q = q_bytes(c, rows);
  const int64_t V = c.N * c.H;

  // quantize_indexer_query on the backend.
  DeviceBuffer d_q(backend, q.size()), d_packed(backend, c.packed_bytes()),
      d_scales(backend, c.scales_bytes()), d_counter(backend, 8);
  d_q.upload(q.data(), q.size());
  d_packed.fill(kPackedPoison);
  d_scales.fill(kScalesPoison);
  const std::vector<uint8_t> start = counter_bytes(c.counter_dtype, kCounterStart);
  d_counter.upload(start.data(), 8);
  dsv4::QuantizeIndexerQueryParams p;
  p.q = q_view(c, d_q.data(), device);
  p.q_packed = packed_view(c, d_packed.data(), device);
  p.q_scales = scales_view(c, d_scales.data(), device);
  p.rotate = c.rotate;
  p.invalid_count = TensorView::contiguous(d_counter.data(), c.counter_dtype, {1}, device);
  dsv4::quantize_indexer_query(p);

  // store_indexer_keys of the same vectors as kMXFP4 keys, one a page, on the same backend.
  const std::vector<uint8_t> key_bytes = encode_rows(rows, c.dtype);
  std::vector<int64_t> slots(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v)
    slots[v] = v;
  const std::vector<uint8_t> slot_bytes = index_bytes(slots, DType::kInt64);
  DeviceBuffer d_keys(backend, std::max<size_t>(key_bytes.size(), 1)),
      d_slots(backend, std::max<size_t>(slot_bytes.size(), 1)),
      d_cache(backend, static_cast<size_t>(std::max<int64_t>(V, 1) * 68)),
      d_key_counter(backend, 8);
  d_keys.upload(key_bytes.data(), key_bytes.size());
  d_slots.upload(slot_bytes.data(), slot_bytes.size());
  d_cache.fill(0x33);
  d_key_counter.upload(start.data(), 8);
  dsv4::StoreIndexerKeysParams store;
  store.keys = TensorView::contiguous(d_keys.data(), c.dtype, {V, 128}, device);
  store.slots = TensorView::contiguous(d_slots.data(), DType::kInt64, {V}, device);
  store.cache = TensorView::contiguous(d_cache.data(), DType::kUInt8, {V, 68}, device);
  store.block_size = 1;
  store.format = dsv4::KeyFormat::kMXFP4;
  store.rotate = c.rotate;
  store.invalid_count = TensorView::contiguous(d_key_counter.data(), c.counter_dtype, {1}, device);
  dsv4::store_indexer_keys(store);
  synchronize(backend);

  std::vector<uint8_t> packed(c.packed_bytes()), scales(c.scales_bytes()), counter(8),
      cache(static_cast<size_t>(V * 68)), key_counter(8);
  d_packed.download(packed.data(), packed.size());
  d_scales.download(scales.data(), scales.size());
  d_counter.download(counter.data(), 8);
  d_cache.download(cache.data(), cache.size());
  d_key_counter.download(key_counter.data(), 8);

  // The float64 reference on host copies of the same buffers.
  std::vector<uint8_t> want_packed(c.packed_bytes(), kPackedPoison),
      want_scales(c.scales_bytes(), kScalesPoison),
      want_counter = counter_bytes(c.counter_dtype, kCounterStart);
  dsv4::QuantizeIndexerQueryParams r;
  r.q = q_view(c, q.data(), Device::cpu());
  r.q_packed = packed_view(c, want_packed.data(), Device::cpu());
  r.q_scales = scales_view(c, want_scales.data(), Device::cpu());
  r.rotate = c.rotate;
  r.invalid_count = TensorView::contiguous(want_counter.data(), c.counter_dtype, {1});
  dsv4::quantize_indexer_query_reference(r);

  const int64_t got_count = read_counter(counter, c.counter_dtype);
  EXPECT_EQ(got_count, read_counter(want_counter, c.counter_dtype));
  EXPECT_EQ(got_count, read_counter(key_counter, c.counter_dtype));
  if (V >= 8) {
    EXPECT_GT(got_count, kCounterStart) << "no non-finite vectors planted";
  }

  std::vector<uint8_t> written_packed(packed.size(), 0), written_scales(scales.size(), 0);
  double worst = 0;
  for (int64_t n = 0; n < c.N; ++n) {
    for (int64_t h = 0; h < c.H; ++h) {
      const int64_t v = n * c.H + h;
      const size_t at_packed = static_cast<size_t>(c.out_offset + n * c.packed_row_stride() +
                                                   h * c.packed_head_stride());
      const size_t at_scales = static_cast<size_t>(c.out_offset + n * c.scales_row_stride() +
                                                   h * c.scales_head_stride());
      std::fill(written_packed.begin() + at_packed, written_packed.begin() + at_packed + 64, 1);
      std::fill(written_scales.begin() + at_scales, written_scales.begin() + at_scales + 4, 1);
      // The same bytes as the key store on this backend.
      ASSERT_EQ(std::memcmp(&packed[at_packed], &cache[v * 68], 64), 0)
          << "q_packed[" << n << ", " << h << "] differs from store_indexer_keys' codes";
      ASSERT_EQ(std::memcmp(&scales[at_scales], &cache[v * 68 + 64], 4), 0)
          << "q_scales[" << n << ", " << h << "] differs from store_indexer_keys' scales";
      if (!c.rotate) {
        ASSERT_EQ(std::memcmp(&packed[at_packed], &want_packed[at_packed], 64), 0)
            << "q_packed[" << n << ", " << h << "] differs from the reference";
        ASSERT_EQ(std::memcmp(&scales[at_scales], &want_scales[at_scales], 4), 0)
            << "q_scales[" << n << ", " << h << "] differs from the reference";
        continue;
      }
      // Rotated: within the FP4 bound of the float64 rotation of what the backend read.
      uint8_t image[68];
      std::memcpy(image, &packed[at_packed], 64);
      std::memcpy(image + 64, &scales[at_scales], 4);
      const std::vector<double> got =
          dsv4::decode_key_reference(image, 1, 0, dsv4::KeyFormat::kMXFP4);
      const std::vector<double> want = dsv4::hadamard_reference(read_back(c, q, n, h));
      const StoredError error = check_stored_key(got, want, 1e-5);
      ASSERT_TRUE(error.failure.empty()) << "[" << n << ", " << h << "]: " << error.failure;
      worst = std::max(worst, error.max_relative);
    }
  }
  for (size_t i = 0; i < packed.size(); ++i) {
    if (!written_packed[i]) {
      ASSERT_EQ(packed[i], kPackedPoison) << "q_packed padding byte " << i;
    }
  }
  for (size_t i = 0; i < scales.size(); ++i) {
    if (!written_scales[i]) {
      ASSERT_EQ(scales[i], kScalesPoison) << "q_scales padding byte " << i;
    }
  }
}

std::vector<QueryCase> query_cases() {
  std::vector<QueryCase> cases;
  uint64_t seed = 4400;
  struct Shape {
    int64_t N, H, q_pad, packed_pad, scales_pad, offset;
  };
  // Flash's 64 heads contiguous; padded strides; odd pads and offsets (unaligned loads and
  // stores on CUDA); more vectors than a CTA's warps, in several CTAs.
  const Shape shapes[] = {{1, 64, 0, 0, 0, 0}, {3, 4, 8, 4, 4, 0},  {5, 7, 1, 1, 3, 1},
                          {2, 16, 4, 0, 0, 0}, {33, 3, 0, 0, 0, 0}, {4, 5, 3, 2, 1, 3},
                          {1, 1, 0, 0, 0, 0},  {0, 64, 0, 0, 0, 0}};
  for (const Shape& shape : shapes) {
    for (bool rotate : {false, true}) {
      QueryCase c;
      c.N = shape.N, c.H = shape.H, c.rotate = rotate;
      c.q_head_pad = shape.q_pad, c.packed_head_pad = shape.packed_pad;
      c.scales_head_pad = shape.scales_pad, c.out_offset = shape.offset;
      c.dtype = (cases.size() / 2) % 2 ? DType::kBFloat16 : DType::kFloat32;
      c.counter_dtype = (cases.size() % 3) == 0 ? DType::kInt64 : DType::kInt32;
      c.seed = ++seed;
      cases.push_back(c);
    }
  }
  return cases;
}

class QueryQuantize : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(QueryQuantize, MatchesKeyStoreAndReference) {
  const Backend backend = std::get<0>(GetParam());
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << backend_name(backend) << " backend skipped: " << reason;
  static const std::vector<QueryCase> cases = query_cases();
  run_case(cases[std::get<1>(GetParam())], backend);
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return std::string(backend_name(std::get<0>(info.param))) + "_case" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, QueryQuantize,
    ::testing::Combine(::testing::Values(Backend::kCPU, Backend::kCUDA),
                       ::testing::Range(0, static_cast<int>(query_cases().size()))),
    param_name);

// A NaN or an infinity in one group of an unrotated vector marks that group only (UE8M0 0xFF,
// codes 0); rotated, it reaches every value, so all four groups are marked. Each such vector
// adds 1 to the counter.
TEST(QueryQuantizeNonfinite, MarkedAndCounted) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    SCOPED_TRACE(backend_name(backend));
    const Device device = backend_device(backend);
    std::mt19937_64 rng(31);
    std::vector<float> q = normal_values(rng, 3 * 128, 2.0f);
    q[1 * 128 + 40] = std::numeric_limits<float>::quiet_NaN();  // group 1 of vector 1
    q[2 * 128 + 3] = std::numeric_limits<float>::infinity();    // vector 2
    for (bool rotate : {false, true}) {
      DeviceBuffer d_q(backend, q.size() * 4), d_packed(backend, 3 * 64), d_scales(backend, 3 * 4),
          d_counter(backend, 8);
      d_q.upload(q.data(), q.size() * 4);
      d_packed.fill(kPackedPoison);
      d_scales.fill(kScalesPoison);
      const std::vector<uint8_t> zero = counter_bytes(DType::kInt64, 0);
      d_counter.upload(zero.data(), 8);
      dsv4::QuantizeIndexerQueryParams p;
      p.q = TensorView::contiguous(d_q.data(), DType::kFloat32, {3, 1, 128}, device);
      p.q_packed = TensorView::contiguous(d_packed.data(), DType::kUInt8, {3, 1, 64}, device);
      p.q_scales = TensorView::contiguous(d_scales.data(), DType::kUInt8, {3, 1, 4}, device);
      p.rotate = rotate;
      p.invalid_count = TensorView::contiguous(d_counter.data(), DType::kInt64, {}, device);
      dsv4::quantize_indexer_query(p);
      synchronize(backend);
      std::vector<uint8_t> packed(3 * 64), scales(3 * 4), counter(8);
      d_packed.download(packed.data(), packed.size());
      d_scales.download(scales.data(), scales.size());
      d_counter.download(counter.data(), 8);
      EXPECT_EQ(read_counter(counter, DType::kInt64), 2);
      for (int g = 0; g < 4; ++g) {
        EXPECT_NE(scales[g], 0xff) << "vector 0 is finite";
        const bool marked = rotate || g == 1;      // vector 1: its NaN is in group 1
        const bool marked_inf = rotate || g == 0;  // vector 2: its infinity in group 0
        EXPECT_EQ(scales[4 + g] == 0xff, marked) << "vector 1, group " << g;
        EXPECT_EQ(scales[8 + g] == 0xff, marked_inf) << "vector 2, group " << g;
        for (int j = 0; j < 16; ++j) {
          if (marked) {
            EXPECT_EQ(packed[64 + 16 * g + j], 0) << "vector 1, group " << g;
          }
          if (marked_inf) {
            EXPECT_EQ(packed[128 + 16 * g + j], 0) << "vector 2, group " << g;
          }
        }
      }
    }
  }
}

// Captured in a CUDA graph and replayed with new q values copied into the captured buffer: the
// same bytes and count as eager calls.
TEST(QueryQuantizeCudaGraph, ReplaysLikeEagerCalls) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
#ifdef HDK_WITH_CUDA
  const Device cuda = backend_device(Backend::kCUDA);
  const int64_t N = 4, H = 64, V = N * H;
  DeviceBuffer d_q(Backend::kCUDA, V * 128 * 2), d_packed(Backend::kCUDA, V * 64),
      d_scales(Backend::kCUDA, V * 4), d_counter(Backend::kCUDA, 8),
      e_packed(Backend::kCUDA, V * 64), e_scales(Backend::kCUDA, V * 4),
      e_counter(Backend::kCUDA, 8);
  const std::vector<uint8_t> zero = counter_bytes(DType::kInt32, 0);
  d_counter.upload(zero.data(), 8);
  e_counter.upload(zero.data(), 8);
  auto params = [&](void* packed, void* scales, void* counter) {
    dsv4::QuantizeIndexerQueryParams p;
    p.q = TensorView::contiguous(d_q.data(), DType::kBFloat16, {N, H, 128}, cuda);
    p.q_packed = TensorView::contiguous(packed, DType::kUInt8, {N, H, 64}, cuda);
    p.q_scales = TensorView::contiguous(scales, DType::kUInt8, {N, H, 4}, cuda);
    p.invalid_count = TensorView::contiguous(counter, DType::kInt32, {1}, cuda);
    return p;
  };
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  dsv4::quantize_indexer_query(params(d_packed.data(), d_scales.data(), d_counter.data()), stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  std::mt19937_64 rng(12);
  for (int replay = 0; replay < 3; ++replay) {
    const std::vector<uint8_t> q =
        encode_rows(random_rows(rng, V, 128, true, 32), DType::kBFloat16);
    d_q.upload(q.data(), q.size());
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    dsv4::quantize_indexer_query(params(e_packed.data(), e_scales.data(), e_counter.data()));
    synchronize(Backend::kCUDA);
    std::vector<uint8_t> got(V * 68), want(V * 68), got_count(8), want_count(8);
    d_packed.download(got.data(), V * 64);
    d_scales.download(got.data() + V * 64, V * 4);
    e_packed.download(want.data(), V * 64);
    e_scales.download(want.data() + V * 64, V * 4);
    d_counter.download(got_count.data(), 8);
    e_counter.download(want_count.data(), 8);
    EXPECT_EQ(got, want) << "replay " << replay;
    EXPECT_EQ(read_counter(got_count, DType::kInt32), read_counter(want_count, DType::kInt32));
    EXPECT_GT(read_counter(got_count, DType::kInt32), 0);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
#endif
}

// ---- validation ------------------------------------------------------------------------------

struct ValidationBuffers {
  std::vector<float> q = std::vector<float>(2 * 3 * 128, 1.0f);
  std::vector<uint8_t> packed = std::vector<uint8_t>(2 * 3 * 64, kPackedPoison);
  std::vector<uint8_t> scales = std::vector<uint8_t>(2 * 3 * 4, kScalesPoison);
  std::vector<int32_t> counter = {9, 9};
  dsv4::QuantizeIndexerQueryParams params() {
    dsv4::QuantizeIndexerQueryParams p;
    p.q = TensorView::contiguous(q.data(), DType::kFloat32, {2, 3, 128});
    p.q_packed = TensorView::contiguous(packed.data(), DType::kUInt8, {2, 3, 64});
    p.q_scales = TensorView::contiguous(scales.data(), DType::kUInt8, {2, 3, 4});
    p.invalid_count = TensorView::contiguous(counter.data(), DType::kInt32, {1});
    return p;
  }
  bool untouched() const {
    return std::all_of(packed.begin(), packed.end(),
                       [](uint8_t x) { return x == kPackedPoison; }) &&
           std::all_of(scales.begin(), scales.end(),
                       [](uint8_t x) { return x == kScalesPoison; }) &&
           counter[0] == 9 && counter[1] == 9;
  }
};

TEST(QueryQuantizeValidation, NamesTheArgumentAndTouchesNothing) {
  ValidationBuffers b;
  const std::vector<std::pair<std::function<void(dsv4::QuantizeIndexerQueryParams&)>, std::string>>
      cases = {
          {[](auto& p) { p.q = TensorView(); }, "argument 'q' is required"},
          {[](auto& p) { p.q_packed = TensorView(); }, "argument 'q_packed' is required"},
          {[](auto& p) { p.q_scales = TensorView(); }, "argument 'q_scales' is required"},
          {[&](auto& p) {
             p.q = TensorView::contiguous(b.q.data(), DType::kFloat32, {6, 128});
           },
           "argument 'q' must have rank 3 ([N, H, 128]), got rank 2"},
          {[&](auto& p) {
             p.q = TensorView::contiguous(b.q.data(), DType::kFloat32, {2, 6, 64});
           },
           "argument 'q' must have shape [N, H, 128] = [2, 6, 128], got [2, 6, 64]"},
          {[](auto& p) { p.q.dtype = DType::kInt32; },
           "argument 'q' must have dtype float32 or bfloat16, got int32"},
          {[&](auto& p) {
             p.q = TensorView::strided(b.q.data(), DType::kFloat32, {2, 1, 128}, {384, 128, 2});
           },
           "argument 'q' must be contiguous in its last dimension"},
          {[&](auto& p) {
             p.q_packed = TensorView::contiguous(b.packed.data(), DType::kUInt8, {2, 3, 32});
           },
           "argument 'q_packed' must have shape [N, H, 64] = [2, 3, 64], got [2, 3, 32]"},
          {[&](auto& p) {
             p.q_packed = TensorView::contiguous(b.packed.data(), DType::kUInt8, {2, 2, 64});
           },
           "argument 'q_packed' must have shape [N, H, 64] = [2, 3, 64], got [2, 2, 64]"},
          {[](auto& p) { p.q_packed.dtype = DType::kInt32; },
           "argument 'q_packed' must have dtype uint8, got int32"},
          {[&](auto& p) {
             p.q_scales = TensorView::contiguous(b.scales.data(), DType::kUInt8, {2, 3, 8});
           },
           "argument 'q_scales' must have shape [N, H, 4] = [2, 3, 4], got [2, 3, 8]"},
          {[](auto& p) { p.q_scales.dtype = DType::kFloat32; },
           "argument 'q_scales' must have dtype uint8, got float32"},
          {[](auto& p) { p.q_scales.strides[2] = 2; },
           "argument 'q_scales' must be contiguous in its last dimension"},
          {[](auto& p) { p.q_packed.strides[1] = 0; }, "argument 'q_packed' has stride 0 in dim 1"},
          {[&](auto& p) {
             p.q_scales = TensorView::contiguous(b.packed.data() + 8, DType::kUInt8, {2, 3, 4});
           },
           "argument 'q_packed' overlaps 'q_scales' in memory"},
          {[&](auto& p) {
             p.q_packed = TensorView::contiguous(b.q.data(), DType::kUInt8, {2, 3, 64});
           },
           "argument 'q_packed' overlaps 'q'"},
          {[&](auto& p) {
             p.invalid_count = TensorView::contiguous(b.counter.data(), DType::kInt32, {2});
           },
           "argument 'invalid_count' must be a scalar or have shape [1], got [2]"},
          {[](auto& p) { p.invalid_count.dtype = DType::kFloat32; },
           "argument 'invalid_count' must have dtype int32 or int64, got float32"},
          {[](auto& p) { p.q.device = Device::cuda(0); },
           "argument 'q' is on cuda:0 but q_packed, q_scales, invalid_count are on cpu"},
      };
  for (const auto& [edit, message] : cases) {
    SCOPED_TRACE(message);
    auto p = b.params();
    edit(p);
    expect_error([&] { dsv4::quantize_indexer_query(p); }, "hdk::dsv4::quantize_indexer_query: ");
    expect_error([&] { dsv4::quantize_indexer_query(p); }, message);
    EXPECT_TRUE(b.untouched());
  }
  dsv4::quantize_indexer_query(b.params());  // the unedited call is valid
  EXPECT_FALSE(b.untouched());
  EXPECT_EQ(b.counter[0], 9);
  EXPECT_EQ(b.counter[1], 9);
}

}  // namespace
}  // namespace testing
}  // namespace hdk
