// hdk::topk against a full sort (the float64 reference), on every backend this build and machine
// have, bit for bit: random rows with planted ties, NaN, +-inf and +-0, row lengths below, at and
// past L (and negative), strided rows, poisoned outputs. Then every invalid call's message.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hdk/error.h"
#include "hdk/topk.h"
#include "support/device_memory.h"
#include "topk/reference/topk_reference.h"

namespace hdk {
namespace testing {
namespace {

enum class Lengths { kNone, kInt32, kInt64 };

struct TopkCase {
  int64_t N = 1, L = 1, k = 1;
  Lengths lengths = Lengths::kNone;
  int64_t row_padding = 0;  // extra elements between rows of values
  double tie_fraction = 0;  // rows drawn from a few distinct values
  double nan_fraction = 0;  // entries set to NaN
  uint64_t seed = 1;

  std::string describe() const {
    return "N=" + std::to_string(N) + " L=" + std::to_string(L) + " k=" + std::to_string(k) +
           " lengths=" + std::to_string(static_cast<int>(lengths)) +
           " pad=" + std::to_string(row_padding) + " ties=" + std::to_string(tie_fraction) +
           " nan=" + std::to_string(nan_fraction) + " seed=" + std::to_string(seed);
  }
};

struct HostTopk {
  std::vector<float> values;
  std::vector<int64_t> lengths;
  int64_t row_stride = 0;
};

HostTopk make_inputs(const TopkCase& c) {
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uniform(-4.0f, 4.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  HostTopk host;
  host.row_stride = c.L + c.row_padding;
  host.values.assign(static_cast<size_t>(c.N * host.row_stride), 0.0f);
  const float specials[] = {
      0.0f, -0.0f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
      1.0f, -1.0f};
  for (int64_t n = 0; n < c.N; ++n) {
    float* row = &host.values[n * host.row_stride];
    const bool ties = unit(rng) < c.tie_fraction;
    for (int64_t i = 0; i < c.L; ++i) {
      float v = uniform(rng);
      // Tie rows: a handful of values, so ties straddle every threshold.
      if (ties) v = std::round(v) * 0.5f;
      if (unit(rng) < 0.002) v = specials[rng() % 6];
      if (unit(rng) < c.nan_fraction) v = std::numeric_limits<float>::quiet_NaN();
      row[i] = v;
    }
    // Padding between rows holds values that would win if they were read.
    for (int64_t i = c.L; i < host.row_stride; ++i)
      row[i] = 1e30f;
    if (n % 11 == 5) {
      for (int64_t i = 0; i < c.L; ++i)  // a row of NaN only
        row[i] = std::numeric_limits<float>::quiet_NaN();
    }
  }
  if (c.lengths != Lengths::kNone) {
    for (int64_t n = 0; n < c.N; ++n) {
      // Below k, around k, full, past L, negative.
      const int64_t choice = static_cast<int64_t>(rng() % 6);
      int64_t length = static_cast<int64_t>(rng() % static_cast<uint64_t>(c.L + 1));
      if (choice == 0) length = std::min(c.L, c.k / 2);
      if (choice == 1) length = std::min(c.L, c.k + static_cast<int64_t>(rng() % 3));
      if (choice == 2) length = c.L;
      if (choice == 3) length = c.L + 7;
      if (choice == 4 && n % 3 == 0) length = -3;
      host.lengths.push_back(length);
    }
  }
  return host;
}

void run_case(const TopkCase& c, Backend backend) {
  SCOPED_TRACE(c.describe());
  const HostTopk host = make_inputs(c);
  const Device device = backend_device(backend);
  const DType length_dtype = c.lengths == Lengths::kInt64 ? DType::kInt64 : DType::kInt32;
  std::vector<uint8_t> length_bytes;
  for (int64_t length : host.lengths) {
    if (length_dtype == DType::kInt64) {
      const auto* bytes = reinterpret_cast<const uint8_t*>(&length);
      length_bytes.insert(length_bytes.end(), bytes, bytes + 8);
    } else {
      const auto value = static_cast<int32_t>(length);
      const auto* bytes = reinterpret_cast<const uint8_t*>(&value);
      length_bytes.insert(length_bytes.end(), bytes, bytes + 4);
    }
  }

  // Oracle on host copies.
  const TensorView host_values = TensorView::strided(
      const_cast<float*>(host.values.data()), DType::kFloat32, {c.N, c.L}, {host.row_stride, 1});
  TensorView host_lengths;
  if (c.lengths != Lengths::kNone) {
    host_lengths = TensorView::contiguous(length_bytes.data(), length_dtype, {c.N});
  }
  std::vector<float> want_values(static_cast<size_t>(c.N * c.k));
  std::vector<int32_t> want_indices(static_cast<size_t>(c.N * c.k));
  topk_reference(
      host_values, c.k, TensorView::contiguous(want_values.data(), DType::kFloat32, {c.N, c.k}),
      TensorView::contiguous(want_indices.data(), DType::kInt32, {c.N, c.k}), host_lengths);

  // Backend, with poisoned outputs.
  DeviceBuffer values(backend, host.values.size() * 4);
  values.upload(host.values.data(), host.values.size() * 4);
  DeviceBuffer lengths(backend, length_bytes.size());
  lengths.upload(length_bytes.data(), length_bytes.size());
  DeviceBuffer out_values(backend, want_values.size() * 4);
  DeviceBuffer out_indices(backend, want_indices.size() * 4);
  if (out_values.size() > 0) {
    out_values.fill(0x7f);
    out_indices.fill(0x7f);
  }
  TensorView lengths_view;
  if (c.lengths != Lengths::kNone) {
    lengths_view = TensorView::contiguous(lengths.data(), length_dtype, {c.N}, device);
  }
  topk(
      TensorView::strided(values.data(), DType::kFloat32, {c.N, c.L}, {host.row_stride, 1}, device),
      c.k, TensorView::contiguous(out_values.data(), DType::kFloat32, {c.N, c.k}, device),
      TensorView::contiguous(out_indices.data(), DType::kInt32, {c.N, c.k}, device), lengths_view);
  synchronize(backend);
  std::vector<float> got_values(want_values.size());
  std::vector<int32_t> got_indices(want_indices.size());
  out_values.download(got_values.data(), got_values.size() * 4);
  out_indices.download(got_indices.data(), got_indices.size() * 4);

  int64_t reported = 0;
  for (size_t i = 0; i < want_values.size(); ++i) {
    uint32_t want_bits, got_bits;
    std::memcpy(&want_bits, &want_values[i], 4);
    std::memcpy(&got_bits, &got_values[i], 4);
    if (want_indices[i] != got_indices[i] || want_bits != got_bits) {
      if (++reported <= 5) {
        ADD_FAILURE() << "row " << i / c.k << " slot " << i % c.k << ": got (" << got_indices[i]
                      << ", " << got_values[i] << "), full sort says (" << want_indices[i] << ", "
                      << want_values[i] << ")";
      }
    }
  }
  EXPECT_EQ(reported, 0) << "mismatched slots";
}

std::vector<TopkCase> semantic_cases() {
  std::vector<TopkCase> cases;
  uint64_t seed = 500;
  auto add = [&](TopkCase c) {
    c.seed = ++seed;
    cases.push_back(c);
  };
  // The grid: L in {1, 100, 4096, 262144}, k up to 2048, with row lengths.
  for (int64_t L : {1, 100, 4096}) {
    for (int64_t k : {1, 6, 8, 100, 512, 2048}) {
      for (Lengths lengths : {Lengths::kNone, Lengths::kInt32, Lengths::kInt64}) {
        TopkCase c;
        c.N = L == 4096 ? 9 : 13;
        c.L = L, c.k = k, c.lengths = lengths;
        c.tie_fraction = 0.3;
        c.nan_fraction = 0.01;
        c.row_padding = lengths == Lengths::kInt32 ? 3 : 0;
        add(c);
      }
    }
  }
  for (int64_t k : {1, 512, 2048}) {
    TopkCase c;
    c.N = 3, c.L = 262144, c.k = k;
    c.lengths = k == 512 ? Lengths::kNone : Lengths::kInt64;
    c.tie_fraction = 0.34;
    c.nan_fraction = 0.001;
    add(c);
  }
  {
    TopkCase c;  // the indexer's decode shape: many rows, several CTAs per row on CUDA
    c.N = 64, c.L = 65536, c.k = 512;
    c.tie_fraction = 0.2;
    c.nan_fraction = 0.0005;
    add(c);
  }
  {
    TopkCase c;  // many short rows
    c.N = 300, c.L = 100, c.k = 8;
    c.lengths = Lengths::kInt32;
    c.tie_fraction = 0.5;
    c.nan_fraction = 0.05;
    add(c);
  }
  {
    TopkCase c;  // k past L, odd L, strided
    c.N = 7, c.L = 777, c.k = 1000;
    c.row_padding = 5;
    c.tie_fraction = 0.5;
    add(c);
  }
  {
    TopkCase c;  // L past the CUDA backend's per-row cache: the uncached passes
    c.N = 2, c.L = 300001, c.k = 2048;
    c.tie_fraction = 0.5;
    c.nan_fraction = 0.01;
    c.lengths = Lengths::kInt32;
    add(c);
  }
  return cases;
}

class TopkSemantics : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(TopkSemantics, MatchesFullSort) {
  const Backend backend = std::get<0>(GetParam());
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << backend_name(backend) << " backend skipped: " << reason;
  static const std::vector<TopkCase> cases = semantic_cases();
  run_case(cases[std::get<1>(GetParam())], backend);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return std::string(backend_name(std::get<0>(info.param))) + "_case" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, TopkSemantics,
    ::testing::Combine(::testing::Values(Backend::kCPU, Backend::kCUDA),
                       ::testing::Range(0, static_cast<int>(semantic_cases().size()))),
    case_name);

// Edge shapes: no rows, k = 0, L = 0, all handled without touching memory out of range.
TEST(TopkEdges, EmptyShapes) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    SCOPED_TRACE(backend_name(backend));
    for (auto [N, L, k] : {std::tuple<int64_t, int64_t, int64_t>{0, 5, 3}, {3, 5, 0}, {2, 0, 4}}) {
      TopkCase c;
      c.N = N, c.L = L, c.k = k;
      run_case(c, backend);
    }
  }
}

// Small rows the CUDA backend still splits over a cluster of CTAs (few rows, L >= 8192): the
// distributed-histogram and remote-append paths at a size the sanitizers can afford.
TEST(TopkCluster, SmallRowsSplitAcrossCtas) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    SCOPED_TRACE(backend_name(backend));
    TopkCase c;
    c.N = 2, c.L = 16384, c.k = 100, c.seed = 4242;
    c.lengths = Lengths::kInt32;
    c.tie_fraction = 0.5;
    c.nan_fraction = 0.01;
    run_case(c, backend);
    c.N = 1, c.L = 20000, c.k = 2048, c.lengths = Lengths::kNone, c.seed = 4243;
    run_case(c, backend);
  }
}

// Repeated calls on fresh inputs: the backend keeps no state between calls.
TEST(TopkRepeated, FreshInputsEachCall) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    for (uint64_t seed = 1; seed <= 4; ++seed) {
      TopkCase c;
      c.N = 5, c.L = 3000 + 17 * static_cast<int64_t>(seed), c.k = 64;
      c.lengths = Lengths::kInt32;
      c.tie_fraction = 0.5;
      c.seed = 9000 + seed;
      SCOPED_TRACE(backend_name(backend));
      run_case(c, backend);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Validation: every invalid call is an hdk::Error naming the argument, expected and given.

struct TopkCall {
  std::vector<float> values = std::vector<float>(4 * 10, 1.0f);
  std::vector<float> out_values = std::vector<float>(4 * 3);
  std::vector<int32_t> out_indices = std::vector<int32_t>(4 * 3);
  std::vector<int32_t> lengths = std::vector<int32_t>(4, 5);
  TensorView v = TensorView::contiguous(values.data(), DType::kFloat32, {4, 10});
  TensorView ov = TensorView::contiguous(out_values.data(), DType::kFloat32, {4, 3});
  TensorView oi = TensorView::contiguous(out_indices.data(), DType::kInt32, {4, 3});
  TensorView rl = TensorView::contiguous(lengths.data(), DType::kInt32, {4});
  int64_t k = 3;
};

void expect_topk_error(const TopkCall& call, const std::vector<std::string>& fragments) {
  try {
    topk(call.v, call.k, call.ov, call.oi, call.rl);
    ADD_FAILURE() << "no hdk::Error thrown; expected one mentioning '" << fragments.front() << "'";
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("hdk::topk"), std::string::npos) << message;
    for (const std::string& fragment : fragments) {
      EXPECT_NE(message.find(fragment), std::string::npos)
          << "message lacks '" << fragment << "': " << message;
    }
  }
}

TEST(TopkValidation, ValidCallPasses) {
  TopkCall call;
  EXPECT_NO_THROW(topk(call.v, call.k, call.ov, call.oi, call.rl));
  EXPECT_NO_THROW(topk(call.v, call.k, call.ov, call.oi));
}

TEST(TopkValidation, DevicesAndSelfOverlap) {
  {
    TopkCall call;
    call.v.device = Device::cuda(0);
    expect_topk_error(call, {"argument 'values' is on cuda:0 but row_lengths, out_values, "
                             "out_indices are on cpu"});
  }
  {
    TopkCall call;  // every row's selection in one place
    call.oi.strides[0] = 0;
    expect_topk_error(call, {"'out_indices'", "stride 0 in dim 0"});
  }
  {
    TopkCall call;  // rows two apart with k = 3: row n's last column is row n + 1's first
    call.ov.strides[0] = 2;
    expect_topk_error(call, {"'out_values'", "may reach one element"});
  }
}

TEST(TopkValidation, Arguments) {
  {
    TopkCall call;
    call.v = TensorView();
    expect_topk_error(call, {"'values'", "required"});
  }
  {
    TopkCall call;
    call.oi = TensorView();
    expect_topk_error(call, {"'out_indices'", "required"});
  }
  {
    TopkCall call;
    call.v.ndim = 1;
    expect_topk_error(call, {"'values'", "rank 2", "[N, L]", "got rank 1"});
  }
  {
    TopkCall call;
    call.v.dtype = DType::kBFloat16;
    expect_topk_error(call, {"'values'", "float32", "bfloat16"});
  }
  {
    TopkCall call;
    call.v.strides[1] = 2;
    call.v.shape[1] = 5;
    expect_topk_error(call, {"'values'", "contiguous in its last dimension"});
  }
  {
    TopkCall call;
    call.k = 2049;
    expect_topk_error(call, {"'k'", "0..2048", "2049"});
  }
  {
    TopkCall call;
    call.k = -1;
    expect_topk_error(call, {"'k'", "got -1"});
  }
  {
    TopkCall call;
    call.k = 4;
    expect_topk_error(call, {"'out_values'", "[N, k] = [4, 4]", "got [4, 3]"});
  }
  {
    TopkCall call;
    call.oi.dtype = DType::kInt64;
    expect_topk_error(call, {"'out_indices'", "int32", "int64"});
  }
  {
    TopkCall call;
    call.ov.dtype = DType::kFloat16;
    expect_topk_error(call, {"'out_values'", "float32", "float16"});
  }
  {
    TopkCall call;
    call.rl.shape[0] = 3;
    expect_topk_error(call, {"'row_lengths'", "[N] = [4]", "got [3]"});
  }
  {
    TopkCall call;
    call.rl.dtype = DType::kFloat32;
    expect_topk_error(call, {"'row_lengths'", "int32 or int64", "float32"});
  }
  {
    TopkCall call;
    call.ov.device = Device::cuda(0);
    expect_topk_error(call, {"'out_values'", "cuda:0", "one device"});
  }
  {
    TopkCall call;  // out_values over values
    call.ov.data = call.values.data();
    expect_topk_error(call, {"'out_values'", "overlaps 'values'"});
  }
  {
    TopkCall call;  // out_indices over out_values
    call.oi.data = call.out_values.data();
    expect_topk_error(call, {"'out_indices'", "overlaps"});
  }
  {
    TopkCall call;  // more columns than int32 indices can name; no data is read
    call.v.shape[1] = int64_t{1} << 31;
    call.v.shape[0] = 1;
    call.ov.shape[0] = call.oi.shape[0] = call.rl.shape[0] = 1;
    expect_topk_error(call, {"'values'", "L = 2147483648", "int32"});
  }
}

}  // namespace
}  // namespace testing
}  // namespace hdk
