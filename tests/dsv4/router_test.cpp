// hdk::dsv4::route against the float64 oracle on every backend this build and machine have:
// both routing modes, logits (fp32, bf16) and the fused gate GEMM, E in {256, 384},
// N in {1, 7, 64, 300}, top_k in {1, 6, 8}, with planted ties, NaN rows, rows whose weights
// cannot be formed, out-of-table token ids (CUDA: counted rows; CPU: an error), strided inputs
// and poisoned outputs. Every output element is checked.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/float_convert.h"
#include "dsv4/router/reference/router_reference.h"
#include "hdk/dsv4/router.h"
#include "hdk/error.h"
#include "support/device_memory.h"

namespace hdk {
namespace testing {
namespace {

enum class Scores { kLogitsF32, kLogitsBF16, kFused };

struct RouterCase {
  int64_t N = 1, E = 256, D = 256, top_k = 6;
  Scores scores = Scores::kLogitsF32;
  bool hash = false;
  bool bias = true;
  float route_scale = 1.5f;
  int64_t vocab = 1000;
  int64_t row_padding = 0;   // extra elements between rows of logits / hidden / outputs
  bool ties = true;          // planted exact ties in s + bias
  bool special_rows = true;  // NaN rows, -inf rows, +inf logits
  bool bad_tokens = false;   // token ids outside tid2eid (CUDA contract only)
  DType token_dtype = DType::kInt32;
  DType counter_dtype = DType::kInt32;
  // The logits workspace's strides: padded by odd amounts, or rounded up to multiples of 4 floats
  // (the split GEMM then stores its partial sums 16 bytes at a time).
  bool aligned_workspace = false;
  uint64_t seed = 1;

  std::string describe() const {
    static const char* names[] = {"logits-fp32", "logits-bf16", "fused"};
    return std::string(names[static_cast<int>(scores)]) + (hash ? " hash" : " dense") +
           " N=" + std::to_string(N) + " E=" + std::to_string(E) + " D=" + std::to_string(D) +
           " k=" + std::to_string(top_k) + (bias ? " bias" : "") +
           " pad=" + std::to_string(row_padding) + (bad_tokens ? " bad-tokens" : "") +
           (aligned_workspace ? " aligned-workspace" : "") + " seed=" + std::to_string(seed);
  }
};

// Host inputs of one call, and where they go on a backend.
struct HostRouter {
  std::vector<uint8_t> logits, hidden, gate_weight, bias, token_ids, tid2eid;
  int64_t logits_stride = 0, hidden_stride = 0, out_stride = 0;
  // logits_workspace [slabs, N, E]: one slab more than required and padded strides, as when a
  // caller slices a buffer sized for its largest batch.
  int64_t workspace_slabs = 0, workspace_row_stride = 0, workspace_slab_stride = 0;
  size_t workspace_floats() const {
    return static_cast<size_t>(workspace_slabs * workspace_slab_stride);
  }
};

void put_bf16(std::vector<uint8_t>& bytes, size_t index, float value) {
  const uint16_t bits = hdk::detail::float_to_bf16(value);
  std::memcpy(bytes.data() + 2 * index, &bits, 2);
}

void put_f32(std::vector<uint8_t>& bytes, size_t index, float value) {
  std::memcpy(bytes.data() + 4 * index, &value, 4);
}

HostRouter make_inputs(const RouterCase& c) {
  std::mt19937_64 rng(c.seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  HostRouter h;
  const int64_t N = c.N, E = c.E, D = c.D;

  // Bias on a coarse grid, so equal logits of two experts with equal bias are exact key ties.
  if (c.bias && !c.hash) {
    h.bias.resize(E * 4);
    for (int64_t e = 0; e < E; ++e) {
      const float value = c.ties ? 0.25f * static_cast<float>(rng() % 4) - 0.25f : uniform(rng);
      put_f32(h.bias, e, value);
    }
    // Pairs (2i, 2i+1), i < 8, share their bias: the fused path's duplicated gate rows tie.
    for (int64_t e = 1; e < std::min<int64_t>(E, 16); e += 2) {
      float shared;
      std::memcpy(&shared, h.bias.data() + 4 * (e - 1), 4);
      put_f32(h.bias, e, shared);
    }
  }

  if (c.scores == Scores::kFused) {
    // Padded rows stay multiples of 8 elements: the CUDA gate loads 16 bytes at a time.
    h.hidden_stride = D + (c.row_padding + 7) / 8 * 8;
    h.hidden.assign(N * h.hidden_stride * 2, 0);
    h.gate_weight.assign(E * D * 2, 0);
    const float weight_scale = 2.0f / std::sqrt(static_cast<float>(D));
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t d = 0; d < D; ++d)
        put_bf16(h.gate_weight, e * D + d, uniform(rng) * weight_scale);
    }
    if (c.ties) {
      for (int64_t e = 1; e < std::min<int64_t>(E, 16); e += 2) {
        std::memcpy(h.gate_weight.data() + 2 * e * D, h.gate_weight.data() + 2 * (e - 1) * D,
                    2 * D);
      }
    }
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t d = 0; d < h.hidden_stride; ++d) {
        // Row padding holds NaN: reading it would poison the row.
        put_bf16(h.hidden, n * h.hidden_stride + d, d < D ? uniform(rng) : nan);
      }
      if (c.special_rows && n % 13 == 4) put_bf16(h.hidden, n * h.hidden_stride + (n % D), nan);
    }
  } else {
    const bool bf16 = c.scores == Scores::kLogitsBF16;
    h.logits_stride = E + c.row_padding;
    h.logits.assign(N * h.logits_stride * (bf16 ? 2 : 4), 0);
    auto put = [&](int64_t n, int64_t e, float value) {
      const size_t index = static_cast<size_t>(n * h.logits_stride + e);
      bf16 ? put_bf16(h.logits, index, value) : put_f32(h.logits, index, value);
    };
    for (int64_t n = 0; n < N; ++n) {
      const bool tie_row = c.ties && n % 3 == 1;
      for (int64_t e = 0; e < h.logits_stride; ++e) {
        float value = 4.0f * uniform(rng);
        if (tie_row) value = 0.25f * std::round(4.0f * value);  // few distinct values
        put(n, e, e < E ? value : nan);
      }
      if (c.special_rows) {
        if (n % 13 == 4) put(n, static_cast<int64_t>(rng() % E), nan);  // NaN row
        if (n % 13 == 9) {
          for (int64_t e = 0; e < E; ++e)
            put(n, e, -inf);  // s = 0 everywhere: no weights
        }
        if (n % 13 == 11) put(n, static_cast<int64_t>(rng() % E), inf);  // s = inf
        if (n % 13 == 7) put(n, static_cast<int64_t>(rng() % E), -inf);  // fine: s = 0
      }
    }
  }

  if (c.hash) {
    h.tid2eid.resize(c.vocab * c.top_k * 4);
    for (int64_t t = 0; t < c.vocab; ++t) {
      for (int64_t j = 0; j < c.top_k; ++j) {
        int32_t expert = static_cast<int32_t>(rng() % E);
        if (c.bad_tokens && t == 3 && j == c.top_k - 1) expert = static_cast<int32_t>(E);
        std::memcpy(h.tid2eid.data() + 4 * (t * c.top_k + j), &expert, 4);
      }
    }
    const size_t size = dtype_size(c.token_dtype);
    h.token_ids.resize(N * size);
    for (int64_t n = 0; n < N; ++n) {
      int64_t token = static_cast<int64_t>(rng() % c.vocab);
      if (c.bad_tokens && n % 5 == 2) token = (n % 2) ? c.vocab + n : -1 - n;
      if (c.bad_tokens && n % 5 == 3) token = 3;  // a table row with an entry out of range
      if (c.token_dtype == DType::kInt64) {
        std::memcpy(h.token_ids.data() + 8 * n, &token, 8);
      } else {
        const auto value = static_cast<int32_t>(token);
        std::memcpy(h.token_ids.data() + 4 * n, &value, 4);
      }
    }
  }
  h.out_stride = c.top_k + (c.row_padding ? 1 : 0);
  h.workspace_slabs = dsv4::route_workspace_slabs(N) + 1;
  auto round_up_4 = [](int64_t floats) { return (floats + 3) / 4 * 4; };
  h.workspace_row_stride = c.aligned_workspace ? round_up_4(E + 3) : E + 3;
  h.workspace_slab_stride = c.aligned_workspace ? round_up_4(N * h.workspace_row_stride + 5)
                                                : N * h.workspace_row_stride + 5;
  return h;
}

// The views of one call over a set of buffers (host copies or backend memory).
dsv4::RouterParams bind(const RouterCase& c, const HostRouter& h, Device device, void* logits,
                        void* hidden, void* gate_weight, void* bias, void* token_ids, void* tid2eid,
                        void* ids, void* weights, void* workspace, void* counter) {
  dsv4::RouterParams p;
  const int64_t N = c.N, E = c.E, D = c.D;
  if (c.scores == Scores::kFused) {
    p.hidden = TensorView::strided(hidden, DType::kBFloat16, {N, D}, {h.hidden_stride, 1}, device);
    p.gate_weight = TensorView::contiguous(gate_weight, DType::kBFloat16, {E, D}, device);
    p.logits_workspace =
        TensorView::strided(workspace, DType::kFloat32, {h.workspace_slabs, N, E},
                            {h.workspace_slab_stride, h.workspace_row_stride, 1}, device);
  } else {
    const DType dtype = c.scores == Scores::kLogitsBF16 ? DType::kBFloat16 : DType::kFloat32;
    p.logits = TensorView::strided(logits, dtype, {N, E}, {h.logits_stride, 1}, device);
  }
  if (!h.bias.empty()) p.bias = TensorView::contiguous(bias, DType::kFloat32, {E}, device);
  if (c.hash) {
    p.token_ids = TensorView::contiguous(token_ids, c.token_dtype, {N}, device);
    p.tid2eid = TensorView::contiguous(tid2eid, DType::kInt32, {c.vocab, c.top_k}, device);
  }
  p.topk_ids = TensorView::strided(ids, DType::kInt32, {N, c.top_k}, {h.out_stride, 1}, device);
  p.topk_weights =
      TensorView::strided(weights, DType::kFloat32, {N, c.top_k}, {h.out_stride, 1}, device);
  p.invalid_count = TensorView::contiguous(counter, c.counter_dtype, {1}, device);
  p.top_k = c.top_k;
  p.route_scale = c.route_scale;
  return p;
}

void run_case(const RouterCase& c, Backend backend) {
  SCOPED_TRACE(c.describe());
  HostRouter h = make_inputs(c);
  const int64_t N = c.N, K = c.top_k;
  const size_t out_elements = static_cast<size_t>(std::max<int64_t>(N, 1) * h.out_stride);
  const int64_t counter_start = 5;
  std::vector<uint8_t> counter_bytes(8, 0);
  if (c.counter_dtype == DType::kInt64) {
    std::memcpy(counter_bytes.data(), &counter_start, 8);
  } else {
    const auto value = static_cast<int32_t>(counter_start);
    std::memcpy(counter_bytes.data(), &value, 4);
  }

  // Oracle on the host inputs.
  std::vector<int32_t> host_ids(out_elements);
  std::vector<float> host_weights(out_elements);
  std::vector<float> host_workspace(h.workspace_floats());
  std::vector<uint8_t> host_counter = counter_bytes;
  const dsv4::RouterParams host_params =
      bind(c, h, Device::cpu(), h.logits.data(), h.hidden.data(), h.gate_weight.data(),
           h.bias.data(), h.token_ids.data(), h.tid2eid.data(), host_ids.data(),
           host_weights.data(), host_workspace.data(), host_counter.data());
  const dsv4::RouterReference reference =
      dsv4::compute_router_reference(host_params, backend == Backend::kCUDA);

  // Backend.
  auto upload = [&](const std::vector<uint8_t>& bytes) {
    DeviceBuffer buffer(backend, bytes.size());
    buffer.upload(bytes.data(), bytes.size());
    return buffer;
  };
  DeviceBuffer logits = upload(h.logits), hidden = upload(h.hidden),
               gate_weight = upload(h.gate_weight), bias = upload(h.bias),
               token_ids = upload(h.token_ids), tid2eid = upload(h.tid2eid),
               counter = upload(counter_bytes);
  DeviceBuffer ids(backend, out_elements * 4), weights(backend, out_elements * 4),
      workspace(backend, h.workspace_floats() * 4);
  ids.fill(0x7f);
  weights.fill(0xff);
  if (workspace.size() > 0) workspace.fill(0x7f);
  const dsv4::RouterParams params =
      bind(c, h, backend_device(backend), logits.data(), hidden.data(), gate_weight.data(),
           bias.data(), token_ids.data(), tid2eid.data(), ids.data(), weights.data(),
           workspace.data(), counter.data());
  dsv4::route(params);
  synchronize(backend);

  std::vector<int32_t> got_ids(out_elements);
  std::vector<float> got_weights(out_elements);
  std::vector<float> got_workspace(h.workspace_floats());
  std::vector<uint8_t> got_counter(8);
  ids.download(got_ids.data(), out_elements * 4);
  weights.download(got_weights.data(), out_elements * 4);
  workspace.download(got_workspace.data(), got_workspace.size() * 4);
  counter.download(got_counter.data(), 8);

  const dsv4::RouterCheck check = dsv4::check_route_outputs(
      reference, got_ids.data(), h.out_stride, got_weights.data(), h.out_stride,
      c.scores == Scores::kFused ? got_workspace.data() : nullptr, h.workspace_row_stride);
  EXPECT_TRUE(check.ok) << check.first_failure;
  // The padding column after each output row is never written.
  if (h.out_stride > K) {
    for (int64_t n = 0; n < N; ++n) {
      EXPECT_EQ(got_ids[n * h.out_stride + K], 0x7f7f7f7f) << "row " << n;
    }
  }
  int64_t counted = 0;
  if (c.counter_dtype == DType::kInt64) {
    std::memcpy(&counted, got_counter.data(), 8);
  } else {
    int32_t value;
    std::memcpy(&value, got_counter.data(), 4);
    counted = value;
  }
  EXPECT_EQ(counted, counter_start + reference.invalid_rows);
  if (c.special_rows && N >= 13) {
    EXPECT_GT(reference.invalid_rows, 0);
  }
}

std::vector<RouterCase> semantic_cases() {
  std::vector<RouterCase> cases;
  uint64_t seed = 300;
  auto add = [&](RouterCase c) {
    c.seed = ++seed;
    cases.push_back(c);
  };
  // The grid: E x N x k x mode x score source.
  for (int64_t E : {256, 384}) {
    for (int64_t N : {1, 7, 64, 300}) {
      for (int64_t k : {1, 6, 8}) {
        for (bool hash : {false, true}) {
          for (Scores scores : {Scores::kLogitsF32, Scores::kLogitsBF16, Scores::kFused}) {
            RouterCase c;
            c.E = E, c.N = N, c.top_k = k, c.hash = hash, c.scores = scores;
            c.D = 256;
            c.row_padding = (N == 7) ? 3 : 0;
            c.token_dtype = (N == 64) ? DType::kInt64 : DType::kInt32;
            c.counter_dtype = (k == 8) ? DType::kInt64 : DType::kInt32;
            c.route_scale = E == 256 ? 1.5f : 2.5f;
            add(c);
          }
        }
      }
    }
  }
  // The models' real gate shapes on the fused path.
  for (auto [E, D] : {std::pair<int64_t, int64_t>{256, 4096}, {384, 7168}}) {
    // 1 and 3: the CUDA-core product; 8 and 12: the cluster GEMM with 1 and 2 row tiles; 30 and
    // 64: the split GEMM with 4 and 8 row tiles (16 slabs); 300: five grid rows and 3 slabs.
    for (int64_t N : {1, 3, 8, 12, 30, 64, 300}) {
      RouterCase c;
      c.E = E, c.D = D, c.N = N, c.scores = Scores::kFused;
      c.row_padding = N == 64 ? 8 : 0;
      c.aligned_workspace = N == 30 || N == 64 || N == 300;
      add(c);
    }
  }
  {
    RouterCase c;  // no bias, no planted ties
    c.N = 33, c.bias = false, c.ties = false, c.top_k = 8;
    add(c);
  }
  {
    RouterCase c;  // top_k up to E, other sizes
    c.N = 5, c.E = 40, c.top_k = 40, c.route_scale = 1.0f;
    add(c);
    c.E = 3, c.top_k = 2, c.D = 24, c.scores = Scores::kFused;
    add(c);
    c.N = 2;  // the CUDA-core gate product with one expert per CTA and D = 3 chunks
    add(c);
    // The cluster GEMM with 63 expert tiles (more CTAs than one wave) and only 2 chunks of D, so
    // 6 of each cluster's 8 CTAs have an empty slice.
    c.E = 1000, c.top_k = 64, c.N = 9, c.D = 40, c.scores = Scores::kFused;
    add(c);
    // A long D, not a multiple of 32, E not one of 16: the cluster GEMM (6 rows) and the split
    // GEMM with 4 and 8 row tiles, whose slices take 2 and 5 passes through shared memory.
    c.E = 20, c.top_k = 4, c.N = 6, c.D = 100008, c.scores = Scores::kFused;
    add(c);
    c.N = 20;
    add(c);
    c.N = 40;
    add(c);
    // The split GEMM's edges: the last chunk of D a quarter full and slices of 1 or 2 chunks (4
    // row tiles); E not a multiple of 48 with a partial row tile (8); 21 groups of 48 experts
    // with only 2 chunks of D (2 slabs).
    c.E = 20, c.N = 24, c.D = 776;
    add(c);
    c.E = 300, c.top_k = 6, c.N = 50, c.D = 1480;
    add(c);
    c.E = 1000, c.top_k = 8, c.N = 40, c.D = 40;
    add(c);
    // The split GEMM with 11 groups of 48 experts (the last one 20) on 12 slabs, and with 32
    // grid rows on the one slab that route_workspace_slabs(2000) requires; the many-expert
    // epilogue (E > 512) after the CUDA-core product (on a 132-SM GPU; E > 4 per SM on smaller
    // ones sends it to the cluster GEMM, which the oracle checks just the same).
    c.E = 500, c.top_k = 6, c.N = 40, c.D = 392;
    add(c);
    c.E = 256, c.N = 2000, c.D = 72;
    add(c);
    // 16-byte partial-sum stores next to single ones: E = 21 in rows padded to 24 floats, so the
    // split GEMM stores experts 0 .. 19 four at a time and expert 20 (in a quad that E ends
    // inside) alone.
    c.E = 21, c.top_k = 6, c.N = 24, c.D = 776, c.aligned_workspace = true;
    add(c);
    c.aligned_workspace = false;
    c.E = 520, c.N = 3, c.D = 136;
    add(c);
  }
  {
    RouterCase c;  // DeepSeek's vocabulary in the hash table, int64 token ids
    c.hash = true, c.vocab = 129280, c.N = 16, c.token_dtype = DType::kInt64;
    add(c);
  }
  return cases;
}

class RouterSemantics : public ::testing::TestWithParam<std::tuple<Backend, int>> {};

TEST_P(RouterSemantics, MatchesReference) {
  const Backend backend = std::get<0>(GetParam());
  const std::string reason = backend_unavailable_reason(backend);
  if (!reason.empty()) GTEST_SKIP() << backend_name(backend) << " backend skipped: " << reason;
  static const std::vector<RouterCase> cases = semantic_cases();
  run_case(cases[std::get<1>(GetParam())], backend);
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<Backend, int>>& info) {
  return std::string(backend_name(std::get<0>(info.param))) + "_case" +
         std::to_string(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Grid, RouterSemantics,
    ::testing::Combine(::testing::Values(Backend::kCPU, Backend::kCUDA),
                       ::testing::Range(0, static_cast<int>(semantic_cases().size()))),
    case_name);

// Token ids outside the table: rows of -1 / 0, counted, on CUDA; an hdk::Error on the CPU.
TEST(RouterHashOutOfTable, CudaCountsRows) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  for (Scores scores : {Scores::kLogitsF32, Scores::kFused}) {
    RouterCase c;
    c.hash = true, c.bad_tokens = true, c.N = 40, c.scores = scores, c.seed = 77;
    run_case(c, Backend::kCUDA);
  }
}

TEST(RouterHashOutOfTable, CpuThrowsBeforeWriting) {
  for (int which : {0, 1, 2}) {
    RouterCase c;
    c.hash = true, c.N = 4, c.seed = 91;
    HostRouter h = make_inputs(c);
    int32_t* tokens = reinterpret_cast<int32_t*>(h.token_ids.data());
    int32_t* table = reinterpret_cast<int32_t*>(h.tid2eid.data());
    std::string fragment;
    if (which == 0) tokens[2] = static_cast<int32_t>(c.vocab), fragment = "token_ids[2] = 1000";
    if (which == 1) tokens[1] = -4, fragment = "token_ids[1] = -4";
    if (which == 2) {
      table[tokens[3] * c.top_k + 1] = -1;
      fragment = ", 1] = -1 (used by token_ids[3]) is not an expert id";
    }
    std::vector<int32_t> ids(c.N * h.out_stride, 12345);
    std::vector<float> weights(c.N * h.out_stride, 7.0f);
    int32_t counter[2] = {0, 0};
    const dsv4::RouterParams p =
        bind(c, h, Device::cpu(), h.logits.data(), nullptr, nullptr, h.bias.data(),
             h.token_ids.data(), h.tid2eid.data(), ids.data(), weights.data(), nullptr, counter);
    try {
      dsv4::route(p);
      ADD_FAILURE() << "no hdk::Error for case " << which;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
    for (int32_t id : ids)
      EXPECT_EQ(id, 12345);  // nothing written
    EXPECT_EQ(counter[0], 0);
  }
}

// The CPU fused path without a workspace computes the same thing.
TEST(RouterFused, CpuWithoutWorkspace) {
  RouterCase c;
  c.scores = Scores::kFused, c.N = 9, c.D = 96, c.seed = 5;
  HostRouter h = make_inputs(c);
  std::vector<int32_t> ids(c.N * h.out_stride);
  std::vector<float> weights(c.N * h.out_stride), workspace(h.workspace_floats());
  int32_t counter[2] = {0, 0};
  dsv4::RouterParams p =
      bind(c, h, Device::cpu(), nullptr, h.hidden.data(), h.gate_weight.data(), h.bias.data(),
           nullptr, nullptr, ids.data(), weights.data(), workspace.data(), counter);
  const dsv4::RouterReference reference = dsv4::compute_router_reference(p);
  p.logits_workspace = TensorView();
  dsv4::route(p);
  const dsv4::RouterCheck check = dsv4::check_route_outputs(
      reference, ids.data(), h.out_stride, weights.data(), h.out_stride, nullptr, 0);
  EXPECT_TRUE(check.ok) << check.first_failure;
}

// What the CUDA fused gate needs beyond the shared validation: D a multiple of 8 and 16-byte
// aligned rows. Each violation is a named error before any launch.
TEST(RouterCudaCapabilities, FusedGateAlignment) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  const Device cuda = backend_device(Backend::kCUDA);
  const int64_t N = 2, E = 16, D = 64;
  DeviceBuffer hidden(Backend::kCUDA, N * D * 2 + 16), gate(Backend::kCUDA, E * D * 2 + 16),
      ids(Backend::kCUDA, N * 6 * 4), weights(Backend::kCUDA, N * 6 * 4),
      workspace(Backend::kCUDA, dsv4::route_workspace_slabs(N) * N * E * 4);
  auto call = [&](int64_t d, int64_t hidden_offset, const char* fragment) {
    dsv4::RouterParams p;
    p.hidden = TensorView::contiguous(static_cast<char*>(hidden.data()) + hidden_offset,
                                      DType::kBFloat16, {N, d}, cuda);
    p.gate_weight = TensorView::contiguous(gate.data(), DType::kBFloat16, {E, d}, cuda);
    p.topk_ids = TensorView::contiguous(ids.data(), DType::kInt32, {N, 6}, cuda);
    p.topk_weights = TensorView::contiguous(weights.data(), DType::kFloat32, {N, 6}, cuda);
    p.logits_workspace = TensorView::contiguous(workspace.data(), DType::kFloat32,
                                                {dsv4::route_workspace_slabs(N), N, E}, cuda);
    try {
      dsv4::route(p);
      ADD_FAILURE() << "no hdk::Error for '" << fragment << "'";
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
  };
  call(60, 0, "multiple of 8");
  call(D, 2, "'hidden' must be 16-byte aligned");
}

// No rows: a valid call that writes nothing.
TEST(RouterEdges, ZeroTokens) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    for (Scores scores : {Scores::kLogitsF32, Scores::kFused}) {
      RouterCase c;
      c.N = 0, c.scores = scores;
      SCOPED_TRACE(backend_name(backend));
      run_case(c, backend);
    }
  }
}

// Repeated calls on fresh inputs: the backend keeps no state between calls.
TEST(RouterRepeated, FreshInputsEachCall) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    // Seeds 5 and 6 reach the MMA gate kernel's 4 and 8 row tiles, so that racecheck, which runs
    // this test, sees its shared and distributed shared memory at every D-group layout.
    const int64_t rows[] = {4, 5, 6, 7, 24, 40};
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      RouterCase c;
      c.N = rows[seed - 1];
      c.scores = seed % 2 || seed > 4 ? Scores::kFused : Scores::kLogitsF32;
      c.E = 384, c.D = 512, c.seed = 4000 + seed;
      SCOPED_TRACE(backend_name(backend));
      run_case(c, backend);
    }
  }
}

// The split GEMM with 48 experts per CTA (rows of hidden copied by every lane) over a slice of D
// longer than one pass through shared memory: each CTA refills its rows once, so racecheck, which
// runs this test, sees the copies of the second pass land where the first pass's rows were read.
TEST(RouterRepeated, SplitGemmTwoPasses) {
  for (Backend backend : {Backend::kCPU, Backend::kCUDA}) {
    if (!backend_unavailable_reason(backend).empty()) continue;
    RouterCase c;
    c.N = 40, c.E = 384, c.D = 25000, c.scores = Scores::kFused, c.seed = 4100;
    c.aligned_workspace = true;
    SCOPED_TRACE(backend_name(backend));
    run_case(c, backend);
  }
}

}  // namespace
}  // namespace testing
}  // namespace hdk
