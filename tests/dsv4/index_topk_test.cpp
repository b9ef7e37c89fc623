// index_topk (the CPU backend and the CUDA kernel with each of its two scoring paths, tensor
// cores and CUDA cores; CUDA cases skip only without a GPU) against the float64 reference, on
// random keys written by the write side's store_indexer_keys into shuffled pages (the quantized
// q forms: keys written there as random bytes), with poisoned outputs and counters that start
// at 3.
//
// Tolerances, and why:
// - index_topk scores: fp32 dot products over 128 values and a sum over H heads. Keys are exact
//   in fp32 (E2M1 x scale) and bf16/fp32 queries are exact too, so the only error is fp32
//   accumulation: |score - ref| <= 1e-5 x sum_h |w_h| sum_d |q_hd K_d| (about 2^-24 x (128 + 64)
//   x the magnitude, with slack). The CUDA tensor-core path feeds fp32 queries to the mma as two
//   bf16 parts (q = hi + lo within 2^-16 |q|), so with fp32 q it gets 1e-5 + 1.6e-5 instead;
//   bf16 queries and keys enter it exactly. The selection may differ from the reference's only
//   between entries whose reference scores are within those tolerances (checked pairwise along
//   the returned order, so a swap beyond them fails); exact ties must go to the lower s. With few
//   distinct keys (exact ties everywhere) the indices must equal the reference's.
// - E4M3 q over fp8 keys: q's codes are exact in fp32 and so are the keys (code x a power-of-two
//   scale; a scale with a full mantissa rounds each value once, 2^-24 relative), so the exact
//   form's 1e-5 x sum_h |w_h| sum_d |q_hd K_d| holds.
// - Packed MXFP4 q over mxfp4 keys: each 32-dim group's term 2^(qs + ks - 254) x (E2M1 dot) is
//   exact in fp32 (the dot is a multiple of 0.25 below 1152 in magnitude, the scale a power of
//   two), so the only error is summing the 4 H terms over groups and heads and the H products
//   with the weights: at most (H + 3) 2^-24 x M to first order, in any order of summation, with
//   M = sum_h |w_h| sum_g |group term_hg| (the reference's magnitude for this form, below the
//   per-product one). The tests take (H + 8) 2^-24 x M: for H = 64, 4.3e-6 x M, and M is about
//   a quarter of the per-product magnitude on random codes, so about 10x tighter than the exact
//   form's bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "dsv4/attention/reference/attention_reference.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "support/device_memory.h"
#include "support/expect_error.h"
#include "support/index_topk_case.h"
#include "support/kv_cache_case.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>

#include "dsv4/index_topk/cuda/index_topk_cuda.h"
#endif

namespace hdk {
namespace testing {
namespace {

using dsv4::KeyFormat;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

class IndexTopk : public ::testing::TestWithParam<IndexBackend> {
 protected:
  void SetUp() override {
    const std::string reason = backend_unavailable_reason(memory_of(GetParam()));
    if (!reason.empty()) {
      GTEST_SKIP() << index_backend_name(GetParam()) << " backend skipped: " << reason;
    }
  }
  IndexBackend backend() const { return GetParam(); }
};

TEST_P(IndexTopk, FlashShapeRaggedRows) {
  IndexCase c;
  c.counts = std::vector<int64_t>{0, 1, 300, 700, 1100};
  run_index_case(c, backend());
}

TEST_P(IndexTopk, ProShapeNvfp4Fp32Queries) {
  IndexCase c;
  c.counts = std::vector<int64_t>{2048, 1500, 17, 1024};
  c.top_k = 1024;
  c.block_size = 32;
  c.format = KeyFormat::kNVFP4;
  c.q_dtype = DType::kFloat32;
  c.count_dtype = DType::kInt64;
  c.seed = 2;
  run_index_case(c, backend());
}

TEST_P(IndexTopk, SmallShapes) {
  const int64_t heads[] = {1, 3, 64};
  const int64_t block_sizes[] = {1, 3, 16};
  const int64_t top_ks[] = {1, 5, 40};
  uint64_t seed = 10;
  for (int64_t H : heads) {
    for (int64_t bs : block_sizes) {
      for (int64_t k : top_ks) {
        IndexCase c;
        c.heads = H;
        c.block_size = bs;
        c.top_k = k;
        c.counts = std::vector<int64_t>{static_cast<int64_t>(seed % 7), 0, 50, k, k + 1};
        c.format = seed % 2 ? KeyFormat::kMXFP4 : KeyFormat::kNVFP4;
        c.q_dtype = seed % 3 ? DType::kBFloat16 : DType::kFloat32;
        c.scores = seed % 4 != 0;
        c.slots = seed % 5 != 0;
        c.seed = seed++;
        run_index_case(c, backend());
      }
    }
  }
}

// q one element past a 16-byte boundary: the CUDA kernels stage it without vector loads.
TEST_P(IndexTopk, QueriesOffTheSixteenByteGrid) {
  uint64_t seed = 45;
  for (DType q_dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (int64_t H : {64, 24}) {
      IndexCase c;
      c.heads = H;
      c.counts = {700, 3000, 64};
      c.q_dtype = q_dtype;
      c.misaligned_q = true;
      c.seed = seed++;
      run_index_case(c, backend());
    }
  }
}

// Heads that are not a multiple of the kernel's 16-head tiles, and more than 64.
TEST_P(IndexTopk, OddHeadCounts) {
  uint64_t seed = 50;
  for (int64_t H : {17, 40, 128}) {
    IndexCase c;
    c.heads = H;
    c.counts = std::vector<int64_t>{900, 2500};
    c.q_dtype = H == 40 ? DType::kFloat32 : DType::kBFloat16;
    c.seed = seed++;
    run_index_case(c, backend());
  }
}

// Key scales far apart within a tile (some warps of the warpgroup kernel take its two-multiply
// MXFP4 decode, some not), both formats and query dtypes.
TEST_P(IndexTopk, KeyScalesFarApart) {
  uint64_t seed = 90;
  for (KeyFormat format : {KeyFormat::kMXFP4, KeyFormat::kNVFP4}) {
    for (DType q_dtype : {DType::kBFloat16, DType::kFloat32}) {
      IndexCase c;
      c.counts = std::vector<int64_t>{3000, 641};
      c.format = format;
      c.q_dtype = q_dtype;
      c.spread_key_scales = true;
      c.seed = seed++;
      run_index_case(c, backend());
    }
  }
}

// A decode batch: 64 rows of ragged lengths, some shorter than top_k.
TEST_P(IndexTopk, SixtyFourRaggedRows) {
  std::mt19937_64 rng(60);
  for (int64_t k : {512, 2048}) {
    IndexCase c;
    for (int n = 0; n < 64; ++n)
      c.counts.push_back(static_cast<int64_t>(rng() % 6000));
    c.counts[5] = 0;
    c.counts[6] = k;
    c.top_k = k;
    c.seed = static_cast<uint64_t>(61 + k);
    run_index_case(c, backend());
  }
}

// Row counts whose clusters on an H100 are not a power of two (cudaOccupancyMaxActiveClusters
// there: 39, 30, 22, 17 clusters of 3, 4, 5, 6 at once; launch plan test): 16 rows spread over
// clusters of 6, 20 over 5, 33 over 3, so the CTAs' segments (ceil(capacity / C) entries) and the
// cluster select run with 3, 5 and 6 CTAs. Ragged rows, one of 9000 entries.
TEST_P(IndexTopk, RowCountsBetweenThePowersOfTwoOfClusters) {
  std::mt19937_64 rng(90);
  for (int rows : {16, 20, 33}) {
    IndexCase c;
    for (int n = 0; n < rows; ++n)
      c.counts.push_back(static_cast<int64_t>(rng() % 9000));
    c.counts[1] = 9000;
    c.counts[2] = 0;
    c.counts[3] = 700;  // fewer than top_k
    c.seed = static_cast<uint64_t>(91 + rows);
    run_index_case(c, backend());
  }
}

// More rows than an H100 runs clusters of 8 at once (15), with one row whose scores need 8 CTAs
// (140000 entries): the plan weighs waves of wider clusters, and on an H100 runs 3 waves of
// clusters of 16 (8750 entries a CTA) rather than 2 of 8.
TEST_P(IndexTopk, WavesOfWideClustersForLongRows) {
  IndexCase c;
  std::mt19937_64 rng(95);
  c.counts.push_back(140000);
  for (int n = 1; n < 16; ++n)
    c.counts.push_back(static_cast<int64_t>(rng() % 2000));
  c.top_k = 1024;
  c.seed = 96;
  run_index_case(c, backend());
}

// Rows as long as the contract's largest (262144 entries, the most the CUDA kernel's cluster
// keeps in shared memory), top_k 512, 1024 and 2048.
TEST_P(IndexTopk, LongRows) {
  IndexCase c;
  c.counts = std::vector<int64_t>{262144, 70001};
  c.top_k = 2048;
  c.seed = 70;
  run_index_case(c, backend());
  c.counts = std::vector<int64_t>{65536, 131072 + 5};
  c.top_k = 1024;
  c.format = KeyFormat::kNVFP4;
  c.seed = 71;
  run_index_case(c, backend());
  c.counts = std::vector<int64_t>{100000};
  c.top_k = 512;
  c.q_dtype = DType::kFloat32;
  c.seed = 72;
  run_index_case(c, backend());
}

// Beyond what a cluster of 8 CTAs holds: with 9 rows (too many to spread over clusters of 16 on
// an H100) the CUDA kernel scores each chunk again on every pass of the select (slow, still
// exact); with 2 rows it spreads them over clusters of 16 where the device runs those, which
// hold them.
TEST_P(IndexTopk, RowsBeyondTheClusterCapacity) {
  IndexCase c;
  c.counts = std::vector<int64_t>{300007, 12, 0, 1, 5, 64, 100, 7, 3};
  c.top_k = 1024;
  c.block_size = 128;
  c.seed = 80;
  run_index_case(c, backend());
  c.counts = std::vector<int64_t>{300007, 12};
  c.seed = 81;
  run_index_case(c, backend());
}

TEST_P(IndexTopk, ExactTiesGoToTheLowerEntry) {
  for (int64_t distinct : {1, 3, 9}) {
    IndexCase c;
    c.counts = std::vector<int64_t>{600, 40, 1025};
    c.distinct_keys = distinct;
    c.seed = 30 + distinct;
    run_index_case(c, backend());
  }
  IndexCase c;  // ties across the CTAs of a cluster and past the leader's candidate buffer
  c.counts = std::vector<int64_t>{70000};
  c.distinct_keys = 5;
  c.top_k = 2048;
  c.seed = 36;
  run_index_case(c, backend());
}

TEST_P(IndexTopk, NonFiniteQueriesAndWeightsAreCountedRowsOfPadding) {
  IndexCase c;
  c.counts = std::vector<int64_t>{100, 100, 100, 100};
  c.top_k = 16;
  c.q_dtype = DType::kFloat32;
  IndexInputs in = make_index_inputs(c);
  const int64_t D = dsv4::kIndexerKeyDim;
  in.q[0 * c.heads * D + 5] = kNaN;    // row 0: a NaN query value
  in.weights[1 * c.heads + 7] = kInf;  // row 1: an infinite weight
  in.q[2 * c.heads * D + 77] = -kInf;  // row 2: an infinite query value
  in.q_bytes = encode_rows(in.q, c.q_dtype);
  std::vector<uint8_t> ref_counter = counter_bytes(DType::kInt32, 3);
  dsv4::IndexerParams ref_params = in.params(c);
  ref_params.invalid_count = TensorView::contiguous(ref_counter.data(), DType::kInt32, {1});
  const dsv4::IndexerReference ref = dsv4::index_topk_reference(ref_params);
  ASSERT_EQ(ref.invalid_rows, 3);
  run_index_topk(c, in, backend());
  EXPECT_EQ(read_counter(in.counter, DType::kInt32), 6);
  check_index_outputs(c, in, ref, index_tolerance(backend(), c.q_dtype));  // rows 0-2 padding
  EXPECT_NE(in.indices[3 * c.top_k], -1);
}

TEST_P(IndexTopk, KeyStoredWithNaNMarkersRanksLast) {
  for (KeyFormat format : {KeyFormat::kMXFP4, KeyFormat::kNVFP4}) {
    IndexCase c;
    c.counts = std::vector<int64_t>{10};
    c.top_k = 12;
    c.block_size = 4;
    c.format = format;
    IndexInputs in = make_index_inputs(c);
    // Overwrite entry 3 with a key holding a NaN: stored as NaN markers, it scores NaN.
    std::vector<float> key(dsv4::kIndexerKeyDim, 1.0f);
    key[40] = kNaN;
    const int64_t slot = in.block_table[0] * c.block_size + 3;
    std::vector<uint8_t> slot_bytes = index_bytes({slot}, DType::kInt64);
    dsv4::StoreIndexerKeysParams store;
    store.keys = TensorView::contiguous(key.data(), DType::kFloat32, {1, dsv4::kIndexerKeyDim});
    store.slots = TensorView::contiguous(slot_bytes.data(), DType::kInt64, {1});
    store.cache = TensorView::contiguous(in.cache.data(), DType::kUInt8,
                                         {in.num_blocks, c.block_size * dsv4::key_bytes(c.format)});
    store.block_size = c.block_size;
    store.format = c.format;
    dsv4::store_indexer_keys(store);
    run_index_topk(c, in, backend());
    EXPECT_EQ(read_counter(in.counter, DType::kInt32), 3);  // not a row error
    EXPECT_EQ(in.indices[9], 3);
    EXPECT_TRUE(std::isnan(in.scores[9]));
    EXPECT_EQ(in.indices[10], -1);
    EXPECT_EQ(in.scores[10], -kInf);
    for (int64_t j = 0; j < 9; ++j)
      EXPECT_TRUE(std::isfinite(in.scores[j]) && in.indices[j] != 3) << j;
  }
}

// The CPU checks entry counts and block ids on the host and throws before writing; the CUDA
// kernel checks them on the device (a host check would synchronize) and gives such a row only
// padding, counting it.
TEST_P(IndexTopk, EntryCountsAndBlocksOutOfRange) {
  IndexCase c;
  c.counts = std::vector<int64_t>{20, 5, 9};
  c.top_k = 4;
  c.block_size = 8;
  const bool cpu = backend() == IndexBackend::kCPU;
  // Rows 0 and 2 keep their inputs; the reference sees row 1 as it was (its outputs are not
  // compared).
  auto check_others = [&](const IndexInputs& in) {
    IndexInputs fresh = make_index_inputs(c);
    std::vector<uint8_t> ref_counter = counter_bytes(DType::kInt32, 3);
    dsv4::IndexerParams ref_params = fresh.params(c);
    ref_params.invalid_count = TensorView::contiguous(ref_counter.data(), DType::kInt32, {1});
    const dsv4::IndexerReference ref = dsv4::index_topk_reference(ref_params);
    for (int64_t n : {0, 2}) {
      for (int64_t j = 0; j < c.top_k; ++j)
        EXPECT_EQ(in.indices[n * c.top_k + j], ref.indices[n * c.top_k + j]) << n << " " << j;
    }
    for (int64_t j = 0; j < c.top_k; ++j) {
      EXPECT_EQ(in.indices[1 * c.top_k + j], -1);
      EXPECT_EQ(in.scores[1 * c.top_k + j], -kInf);
      EXPECT_EQ(in.slots[1 * c.top_k + j], -1);
    }
    EXPECT_EQ(read_counter(in.counter, DType::kInt32), 4);
  };
  {
    IndexInputs in = make_index_inputs(c);
    const int64_t capacity = in.max_blocks * c.block_size;
    put_index(in.counts, c.count_dtype, 1, capacity + 1);
    if (cpu) {
      expect_error([&] { dsv4::index_topk(in.params(c)); },
                   "num_entries[1] = " + std::to_string(capacity + 1) + " is outside 0.." +
                       std::to_string(capacity));
      EXPECT_EQ(in.indices[0], 0x5a5a5a5a);
    } else {
      run_index_topk(c, in, backend());
      check_others(in);
    }
  }
  {
    IndexInputs in = make_index_inputs(c);
    put_index(in.counts, c.count_dtype, 1, -1);
    if (cpu) {
      expect_error([&] { dsv4::index_topk(in.params(c)); }, "num_entries[1] = -1");
    } else {
      run_index_topk(c, in, backend());
      check_others(in);
    }
  }
  {
    IndexInputs in = make_index_inputs(c);
    in.block_table[1 * in.max_blocks] = static_cast<int32_t>(in.num_blocks);
    if (cpu) {
      expect_error([&] { dsv4::index_topk(in.params(c)); }, "block_table[1, 0] = ");
      EXPECT_EQ(in.indices[0], 0x5a5a5a5a);
      EXPECT_EQ(read_counter(in.counter, DType::kInt32), 3);
    } else {
      run_index_topk(c, in, backend());
      check_others(in);
    }
  }
}

std::string index_param_name(const ::testing::TestParamInfo<IndexBackend>& param) {
  return index_backend_name(param.param);
}

INSTANTIATE_TEST_SUITE_P(Backends, IndexTopk,
                         ::testing::Values(IndexBackend::kCPU, IndexBackend::kCudaTensorCore,
                                           IndexBackend::kCudaWarpMma, IndexBackend::kCudaCore),
                         index_param_name);

// Packed MXFP4 q scores as its dequantized values (E2M1 x 2^(scale - 127), exact in fp32) do as
// an fp32 q: the outputs of the packed form meet the exact form's reference.
TEST_P(IndexTopk, PackedMxfp4QueryScoresAsItsDequantizedValues) {
  IndexCase c;
  c.q_form = IndexQuery::kMXFP4;
  c.format = KeyFormat::kMXFP4;
  c.seed = 300;
  c.counts = std::vector<int64_t>{1500, 64, 3};
  c.top_k = 100;
  IndexInputs in = make_index_inputs(c);
  IndexCase exact = c;
  exact.q_form = IndexQuery::kExact;
  exact.q_dtype = DType::kFloat32;
  IndexInputs dequantized = in;
  const int64_t vectors = in.N * c.heads;
  dequantized.q.resize(static_cast<size_t>(vectors * dsv4::kIndexerKeyDim));
  const float e2m1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  for (int64_t v = 0; v < vectors; ++v) {
    for (int64_t d = 0; d < dsv4::kIndexerKeyDim; ++d) {
      const uint8_t nibble = (in.q_bytes[v * 64 + d / 2] >> (d % 2 ? 4 : 0)) & 0xf;
      const float value = std::ldexp(e2m1[nibble & 7], in.q_scales[v * 4 + d / 32] - 127);
      dequantized.q[v * dsv4::kIndexerKeyDim + d] = nibble & 8 ? -value : value;
    }
  }
  dequantized.q_bytes = encode_rows(dequantized.q, DType::kFloat32);
  dequantized.q_scales.clear();
  std::vector<uint8_t> ref_counter = counter_bytes(DType::kInt32, 3);
  dsv4::IndexerParams ref_params = dequantized.params(exact);
  ref_params.invalid_count = TensorView::contiguous(ref_counter.data(), DType::kInt32, {1});
  const dsv4::IndexerReference ref = dsv4::index_topk_reference(ref_params);
  run_index_topk(c, in, backend());
  EXPECT_EQ(read_counter(in.counter, DType::kInt32), 3);
  check_index_outputs(exact, in, ref, index_tolerance(backend(), exact));
}

// ---- The quantized q forms: E4M3 codes over fp8 keys, packed MXFP4 over mxfp4 keys -----------
// Keys written as random bytes (every E4M3 code but NaN, random E2M1 nibbles and UE8M0 scales;
// fp8 scales powers of two and, every third key, with a random mantissa), q random codes of its
// form, against the float64 reference on every backend.

class IndexTopkQuantizedQuery
    : public ::testing::TestWithParam<std::tuple<IndexBackend, IndexQuery>> {
 protected:
  void SetUp() override {
    const std::string reason = backend_unavailable_reason(memory_of(backend()));
    if (!reason.empty()) {
      GTEST_SKIP() << index_backend_name(backend()) << " backend skipped: " << reason;
    }
  }
  IndexBackend backend() const { return std::get<0>(GetParam()); }
  IndexQuery form() const { return std::get<1>(GetParam()); }
  // A case of this form with its key format, seeded apart from the other form's.
  IndexCase make_case(uint64_t seed) const {
    IndexCase c;
    c.q_form = form();
    c.format = form() == IndexQuery::kE4M3 ? KeyFormat::kFP8 : KeyFormat::kMXFP4;
    c.seed = seed * 2 + (form() == IndexQuery::kE4M3 ? 0 : 1);
    return c;
  }
  // Runs `c` with `change` applied to its inputs, checks that `invalid_rows` rows were counted
  // and the rest against the reference, and returns the outputs.
  IndexInputs run_changed(const IndexCase& c, const std::function<void(IndexInputs&)>& change,
                          int64_t invalid_rows) const {
    IndexInputs in = make_index_inputs(c);
    change(in);
    std::vector<uint8_t> ref_counter = counter_bytes(DType::kInt32, 3);
    dsv4::IndexerParams ref_params = in.params(c);
    ref_params.invalid_count = TensorView::contiguous(ref_counter.data(), DType::kInt32, {1});
    const dsv4::IndexerReference ref = dsv4::index_topk_reference(ref_params);
    EXPECT_EQ(ref.invalid_rows, invalid_rows);
    run_index_topk(c, in, backend());
    EXPECT_EQ(read_counter(in.counter, DType::kInt32), 3 + invalid_rows);
    check_index_outputs(c, in, ref, index_tolerance(backend(), c));
    return in;
  }
};

TEST_P(IndexTopkQuantizedQuery, FlashShapeRaggedRows) {
  IndexCase c = make_case(200);
  c.counts = std::vector<int64_t>{0, 1, 300, 700, 1100};
  run_index_case(c, backend());
}

// Heads that are not a multiple of the kernels' tiles, one head, and more than 64.
TEST_P(IndexTopkQuantizedQuery, OddHeadCounts) {
  uint64_t seed = 210;
  for (int64_t H : {1, 7, 65, 128}) {
    IndexCase c = make_case(seed++);
    c.heads = H;
    c.counts = std::vector<int64_t>{900, 2500};
    run_index_case(c, backend());
  }
}

// top_k beyond the entries, blocks of 1 and 3, optional outputs left out.
TEST_P(IndexTopkQuantizedQuery, SmallShapes) {
  uint64_t seed = 220;
  for (int64_t H : {1, 3, 64}) {
    for (int64_t bs : {1, 3, 16}) {
      for (int64_t k : {1, 5, 40}) {
        IndexCase c = make_case(seed);
        c.heads = H;
        c.block_size = bs;
        c.top_k = k;
        c.counts = std::vector<int64_t>{static_cast<int64_t>(seed % 7), 0, 50, k, k + 1};
        c.count_dtype = seed % 2 ? DType::kInt32 : DType::kInt64;
        c.scores = seed % 4 != 0;
        c.slots = seed % 5 != 0;
        ++seed;
        run_index_case(c, backend());
      }
    }
  }
}

TEST_P(IndexTopkQuantizedQuery, ExactTiesGoToTheLowerEntry) {
  for (int64_t distinct : {1, 3, 9}) {
    IndexCase c = make_case(230 + static_cast<uint64_t>(distinct));
    c.counts = std::vector<int64_t>{600, 40, 1025};
    c.distinct_keys = distinct;
    run_index_case(c, backend());
  }
  IndexCase c = make_case(240);  // ties across the CTAs of a cluster
  c.counts = std::vector<int64_t>{70000};
  c.distinct_keys = 5;
  c.top_k = 2048;
  run_index_case(c, backend());
}

// fp8 key scales from 2^-30 to 2^30; MXFP4 key and q group scales from 2^-40 to 2^40, drawn per
// group (the groups of one dot product far apart).
TEST_P(IndexTopkQuantizedQuery, ScalesFarApart) {
  IndexCase c = make_case(250);
  c.counts = std::vector<int64_t>{3000, 641};
  c.spread_key_scales = true;
  run_index_case(c, backend());
}

// fp8 key scales of either sign and zero in every other tile: relu(q . code x scale) with the
// scale's sign on every path (a scale moved past the relu would fail here). Keys of the other form
// keep their scales.
TEST_P(IndexTopkQuantizedQuery, KeyScalesOfEitherSign) {
  IndexCase c = make_case(255);
  c.counts = std::vector<int64_t>{3000, 641, 130};
  c.signed_key_scales = true;
  run_index_case(c, backend());
}

// q one byte past a 16-byte boundary (q_scales too): no vector loads of either.
TEST_P(IndexTopkQuantizedQuery, QueriesOffTheSixteenByteGrid) {
  uint64_t seed = 260;
  for (int64_t H : {64, 24}) {
    IndexCase c = make_case(seed++);
    c.heads = H;
    c.counts = std::vector<int64_t>{700, 3000, 64};
    c.misaligned_q = true;
    run_index_case(c, backend());
  }
}

TEST_P(IndexTopkQuantizedQuery, LongRows) {
  IndexCase c = make_case(270);
  c.counts = std::vector<int64_t>{65536, 3001};
  c.top_k = 2048;
  run_index_case(c, backend());
  c = make_case(271);
  c.counts = std::vector<int64_t>{65536};
  c.top_k = 512;
  c.block_size = 128;
  run_index_case(c, backend());
}

// Keys stored by the write side (store_indexer_keys from normal values: fp8 with a power-of-two
// scale per key, mxfp4), some of them with NaN markers (a key holding a NaN or infinity).
TEST_P(IndexTopkQuantizedQuery, KeysStoredByTheWriteSide) {
  IndexCase c = make_case(275);
  c.counts = std::vector<int64_t>{2000, 513, 0, 77};
  c.stored_keys = true;
  run_index_case(c, backend());
  c.counts = std::vector<int64_t>{10, 3};
  c.top_k = 12;
  c.block_size = 4;
  run_changed(
      c,
      [&](IndexInputs& in) {
        std::vector<float> keys(2 * dsv4::kIndexerKeyDim, 0.5f);
        keys[40] = kNaN;
        keys[dsv4::kIndexerKeyDim + 7] = -kInf;
        const int64_t bs = c.block_size;
        std::vector<uint8_t> slot_bytes = index_bytes(
            {in.block_table[0] * bs + 3, in.block_table[in.max_blocks] * bs + 1}, DType::kInt64);
        dsv4::StoreIndexerKeysParams store;
        store.keys =
            TensorView::contiguous(keys.data(), DType::kFloat32, {2, dsv4::kIndexerKeyDim});
        store.slots = TensorView::contiguous(slot_bytes.data(), DType::kInt64, {2});
        store.cache = TensorView::contiguous(in.cache.data(), DType::kUInt8,
                                             {in.num_blocks, bs * dsv4::key_bytes(c.format)});
        store.block_size = bs;
        store.format = c.format;
        dsv4::store_indexer_keys(store);
      },
      0);
}

// E4M3 q: a NaN code (0x7F or 0xFF) makes its row invalid; packed MXFP4 q: a NaN scale byte
// (0xFF) in any head does; non-finite weights do for both. Such rows are counted and padded.
TEST_P(IndexTopkQuantizedQuery, NonFiniteQueriesAndWeightsAreCountedRowsOfPadding) {
  IndexCase c = make_case(280);
  c.counts = std::vector<int64_t>{100, 100, 100, 100, 100};
  c.top_k = 16;
  const IndexInputs out = run_changed(
      c,
      [&](IndexInputs& in) {
        const int64_t H = c.heads, width = c.q_width();
        if (form() == IndexQuery::kE4M3) {
          in.q_bytes[0 * H * width + 5] = 0x7f;                     // row 0, head 0
          in.q_bytes[2 * H * width + (H - 1) * width + 77] = 0xff;  // row 2, last head
        } else {
          in.q_scales[0 * H * 4 + 0] = 0xff;                // row 0, head 0, group 0
          in.q_scales[2 * H * 4 + (H - 1) * 4 + 3] = 0xff;  // row 2, last head, group 3
        }
        in.weights[1 * H + 7] = kInf;   // row 1
        in.weights[3 * H + 0] = -kNaN;  // row 3
      },
      4);
  EXPECT_NE(out.indices[4 * c.top_k], -1);
}

// Keys that decode to a NaN score NaN and rank below every number, in entry order among
// themselves; they are not a row error. fp8: the write side's NaN markers (every code 0x7F and a
// NaN scale), one NaN code, a NaN scale alone; MXFP4: a NaN scale byte in one group, all four.
TEST_P(IndexTopkQuantizedQuery, KeysDecodingToNaNRankLast) {
  IndexCase c = make_case(290);
  c.counts = std::vector<int64_t>{10};
  c.top_k = 12;
  c.block_size = 4;
  const IndexInputs out = run_changed(
      c,
      [&](IndexInputs& in) {
        const int64_t bytes = dsv4::key_bytes(c.format);
        auto slot_of = [&](int64_t s) {
          return in.block_table[s / c.block_size] * c.block_size + s % c.block_size;
        };
        const float nan = kNaN;
        for (int64_t s : {2, 5, 6}) {
          std::vector<uint8_t> image(static_cast<size_t>(bytes), 0x38);  // E4M3 1.0 / E2M1 pairs
          if (c.format == KeyFormat::kFP8) {
            const float one = 1.0f;
            std::memcpy(&image[128], &one, 4);
            if (s == 2) std::fill(image.begin(), image.begin() + 128, uint8_t{0x7f});
            if (s == 2 || s == 6) std::memcpy(&image[128], &nan, 4);
            if (s == 5) image[100] = 0xff;
          } else {
            std::fill(image.begin() + 64, image.end(), uint8_t{127});
            if (s == 2) std::fill(image.begin() + 64, image.end(), uint8_t{0xff});
            if (s == 5) image[64 + 1] = 0xff;
            if (s == 6) image[64 + 3] = 0xff;
          }
          place_key_bytes(c, in, slot_of(s), image.data());
        }
      },
      0);
  for (int64_t j = 0; j < 7; ++j) {
    EXPECT_TRUE(std::isfinite(out.scores[j])) << j;
    EXPECT_TRUE(out.indices[j] != 2 && out.indices[j] != 5 && out.indices[j] != 6) << j;
  }
  const int32_t nan_entries[] = {2, 5, 6};
  for (int64_t j = 7; j < 10; ++j) {
    EXPECT_EQ(out.indices[j], nan_entries[j - 7]) << j;
    EXPECT_TRUE(std::isnan(out.scores[j])) << j;
  }
  EXPECT_EQ(out.indices[10], -1);
  EXPECT_EQ(out.scores[10], -kInf);
}

std::string quantized_param_name(
    const ::testing::TestParamInfo<std::tuple<IndexBackend, IndexQuery>>& param) {
  return std::string(index_backend_name(std::get<0>(param.param))) + "_" +
         (std::get<1>(param.param) == IndexQuery::kE4M3 ? "e4m3" : "mxfp4");
}

INSTANTIATE_TEST_SUITE_P(
    Backends, IndexTopkQuantizedQuery,
    ::testing::Combine(::testing::Values(IndexBackend::kCPU, IndexBackend::kCudaTensorCore,
                                         IndexBackend::kCudaWarpMma, IndexBackend::kCudaCore),
                       ::testing::Values(IndexQuery::kE4M3, IndexQuery::kMXFP4)),
    quantized_param_name);

TEST(IndexTopkValidation, NamesTheArgument) {
  IndexCase c;
  c.counts = std::vector<int64_t>{20, 5};
  c.top_k = 4;
  c.block_size = 8;
  IndexInputs in = make_index_inputs(c);
  const int64_t N = in.N;
  std::vector<float> spare(4096);
  struct Bad {
    std::function<void(dsv4::IndexerParams&)> change;
    std::string needle;
  };
  const std::vector<Bad> cases = {
      {[](dsv4::IndexerParams& p) { p.q = TensorView(); }, "argument 'q' is required"},
      {[&](dsv4::IndexerParams& p) {
         p.q = TensorView::contiguous(in.q_bytes.data(), DType::kBFloat16, {N, 64, 64});
       },
       "argument 'q'"},
      {[&](dsv4::IndexerParams& p) {
         p.q = TensorView::contiguous(in.q_bytes.data(), DType::kFloat16, {N, 64, 128});
       },
       "argument 'q'"},
      {[&](dsv4::IndexerParams& p) {
         p.weights = TensorView::contiguous(in.weights.data(), DType::kFloat32, {N, 32});
       },
       "argument 'weights'"},
      {[](dsv4::IndexerParams& p) { p.block_size = 0; }, "option 'block_size'"},
      {[](dsv4::IndexerParams& p) { p.format = KeyFormat::kNVFP4; }, "argument 'key_cache'"},
      {[&](dsv4::IndexerParams& p) {
         p.block_table = TensorView::contiguous(in.q.data(), DType::kFloat32, {N, 2});
       },
       "argument 'block_table'"},
      {[&](dsv4::IndexerParams& p) {
         p.num_entries = TensorView::contiguous(in.counts.data(), DType::kInt32, {N + 1});
       },
       "argument 'num_entries'"},
      {[](dsv4::IndexerParams& p) { p.top_k = 0; }, "option 'top_k'"},
      {[](dsv4::IndexerParams& p) { p.top_k = kMaxTopK + 1; }, "option 'top_k'"},
      {[&](dsv4::IndexerParams& p) {
         p.topk_indices = TensorView::contiguous(spare.data(), DType::kInt32, {N, 5});
       },
       "argument 'topk_indices'"},
      {[&](dsv4::IndexerParams& p) {
         p.topk_scores = TensorView::contiguous(spare.data(), DType::kBFloat16, {N, 4});
       },
       "argument 'topk_scores'"},
      {[&](dsv4::IndexerParams& p) {
         p.invalid_count = TensorView::contiguous(spare.data(), DType::kFloat32, {1});
       },
       "argument 'invalid_count'"},
      {[&](dsv4::IndexerParams& p) {
         p.topk_scores = TensorView::contiguous(in.weights.data(), DType::kFloat32, {N, 4});
       },
       "'topk_scores'"},  // overlaps weights
      {[&](dsv4::IndexerParams& p) {
         p.topk_slots = TensorView::contiguous(spare.data(), DType::kInt64, {N, 4});
       },
       "argument 'topk_slots'"},
      {[&](dsv4::IndexerParams& p) {
         p.topk_slots = TensorView::contiguous(spare.data(), DType::kInt32, {N, 5});
       },
       "argument 'topk_slots'"},
      {[&](dsv4::IndexerParams& p) {
         p.topk_slots = TensorView::contiguous(in.indices.data(), DType::kInt32, {N, 4});
       },
       "'topk_slots'"},  // overlaps topk_indices
      {[](dsv4::IndexerParams& p) { p.weights.device = Device::cuda(0); }, "argument 'weights'"},
      {[](dsv4::IndexerParams& p) { p.q.device = Device::cuda(0); },
       "argument 'q' is on cuda:0 but weights, key_cache, block_table, num_entries, topk_indices"},
      {[](dsv4::IndexerParams& p) { p.topk_indices.strides[0] = 0; },
       "argument 'topk_indices' has stride 0 in dim 0"},  // every row's selection in one place
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    dsv4::IndexerParams p = in.params(c);
    cases[i].change(p);
    expect_error([&] { dsv4::index_topk(p); }, cases[i].needle);
  }
}

// The quantized q forms: which q goes with which key format, q_scales, the fp8 pages' alignment.
// Each error comes before anything is written.
TEST(IndexTopkValidation, QueryFormsAndTheirKeyFormats) {
  IndexCase fp8;
  fp8.counts = std::vector<int64_t>{20, 5};
  fp8.top_k = 4;
  fp8.block_size = 8;
  fp8.q_form = IndexQuery::kE4M3;
  fp8.format = KeyFormat::kFP8;
  IndexCase packed = fp8;
  packed.q_form = IndexQuery::kMXFP4;
  packed.format = KeyFormat::kMXFP4;
  IndexInputs fp8_in = make_index_inputs(fp8);
  IndexInputs packed_in = make_index_inputs(packed);
  const int64_t N = fp8_in.N, H = fp8.heads;
  std::vector<uint8_t> bytes(static_cast<size_t>(N * H * 256 + 64));
  std::vector<uint8_t> scales(static_cast<size_t>(N * H * 8));
  std::vector<float> values(static_cast<size_t>(N * H * 128));
  std::vector<uint8_t> shifted_cache(fp8_in.cache.size() + 16);
  const int64_t page = fp8.block_size * dsv4::kFp8KeyBytes;
  struct Bad {
    bool on_packed;  // change the packed-MXFP4 call (else the E4M3 one)
    std::function<void(dsv4::IndexerParams&)> change;
    std::string needle;
  };
  const std::vector<Bad> cases = {
      {false,
       [&](dsv4::IndexerParams& p) {
         p.q = TensorView::contiguous(values.data(), DType::kBFloat16, {N, H, 128});
       },
       "format fp8 takes argument 'q' as uint8 E4M3 codes [N, H, 128] (DeepGEMM's "
       "fp8_paged_mqa_logits form: q's own scale goes into weights), got bfloat16 q [2, 64, 128]"},
      {false,
       [&](dsv4::IndexerParams& p) {
         p.q = TensorView::contiguous(values.data(), DType::kFloat32, {N, H, 128});
       },
       "format fp8 takes argument 'q' as uint8 E4M3 codes [N, H, 128]"},
      {false,
       [&](dsv4::IndexerParams& p) {
         p.q = TensorView::contiguous(bytes.data(), DType::kUInt8, {N, H, 64});
       },
       "argument 'q' must have shape [N, H, 128] (E4M3 codes) = [2, 64, 128], got [2, 64, 64]"},
      {false,
       [&](dsv4::IndexerParams& p) {
         p.q_scales = TensorView::contiguous(scales.data(), DType::kUInt8, {N, H, 4});
       },
       "argument 'q_scales' is given only with packed E2M1 q (uint8 [N, H, 64]) and format "
       "mxfp4, got uint8 q [2, 64, 128] and format fp8"},
      {false, [](dsv4::IndexerParams& p) { p.format = KeyFormat::kMXFP4; },
       "format mxfp4 takes argument 'q' as bfloat16 or float32 [N, H, 128], or as uint8 packed "
       "E2M1 [N, H, 64] with argument 'q_scales' [N, H, 4]; got uint8 q [2, 64, 128] without "
       "q_scales (uint8 E4M3 codes [N, H, 128] go with format fp8)"},
      {false, [](dsv4::IndexerParams& p) { p.format = KeyFormat::kNVFP4; },
       "format nvfp4 takes argument 'q' as bfloat16 or float32 [N, H, 128], got uint8 q "
       "[2, 64, 128] (uint8 E4M3 q goes with format fp8, packed E2M1 q with format mxfp4)"},
      {false, [](dsv4::IndexerParams& p) { p.format = static_cast<KeyFormat>(7); },
       "option 'format' must be KeyFormat::kMXFP4, kNVFP4 or kFP8, got 7"},
      {false,
       [&](dsv4::IndexerParams& p) {
         p.key_cache = TensorView::contiguous(shifted_cache.data() + 1, DType::kUInt8,
                                              {fp8_in.num_blocks, page});
       },
       "argument 'key_cache' of fp8 keys (fp32 scales) must be 4-byte aligned with a page stride "
       "that is a multiple of 4 bytes, got an address 1 bytes past the boundary"},
      {false,
       [&](dsv4::IndexerParams& p) {
         p.key_cache =
             TensorView::strided(shifted_cache.data(), DType::kUInt8, {2, page}, {page + 2, 1});
       },
       "and " + std::to_string(page + 2) + " bytes between pages"},
      {false,
       [&](dsv4::IndexerParams& p) {
         p.q = TensorView::contiguous(values.data(), DType::kFloat16, {N, H, 128});
       },
       "argument 'q' must have dtype bfloat16 or float32 or uint8, got float16"},
      {true, [](dsv4::IndexerParams& p) { p.q_scales = TensorView(); },
       "format mxfp4 takes argument 'q' as bfloat16 or float32 [N, H, 128], or as uint8 packed "
       "E2M1 [N, H, 64] with argument 'q_scales' [N, H, 4]; got uint8 q [2, 64, 64] without "
       "q_scales"},
      {true,
       [&](dsv4::IndexerParams& p) {
         p.q = TensorView::contiguous(values.data(), DType::kBFloat16, {N, H, 128});
       },
       "argument 'q_scales' is given only with packed E2M1 q (uint8 [N, H, 64]) and format "
       "mxfp4, got bfloat16 q [2, 64, 128] and format mxfp4"},
      {true, [](dsv4::IndexerParams& p) { p.format = KeyFormat::kNVFP4; },
       "argument 'q_scales' is given only with packed E2M1 q (uint8 [N, H, 64]) and format "
       "mxfp4, got uint8 q [2, 64, 64] and format nvfp4"},
      {true,
       [&](dsv4::IndexerParams& p) {
         p.q = TensorView::contiguous(bytes.data(), DType::kUInt8, {N, H, 128});
       },
       "argument 'q' must have shape [N, H, 64] (packed E2M1, with q_scales) = [2, 64, 64], got "
       "[2, 64, 128]"},
      {true,
       [&](dsv4::IndexerParams& p) {
         p.q_scales = TensorView::contiguous(scales.data(), DType::kUInt8, {N, H, 8});
       },
       "argument 'q_scales' must have shape [N, H, 4] (UE8M0, one per 32 dims) = [2, 64, 4], got "
       "[2, 64, 8]"},
      {true,
       [&](dsv4::IndexerParams& p) {
         p.q_scales = TensorView::contiguous(scales.data(), DType::kUInt8, {N, 32, 4});
       },
       "argument 'q_scales' must have shape [N, H, 4]"},
      {true,
       [&](dsv4::IndexerParams& p) {
         p.q_scales = TensorView::contiguous(values.data(), DType::kInt32, {N, H, 4});
       },
       "argument 'q_scales' must have dtype uint8, got int32"},
      {true,
       [&](dsv4::IndexerParams& p) {
         p.q_scales = TensorView::strided(scales.data(), DType::kUInt8, {N, H, 4}, {H * 8, 8, 2});
       },
       "argument 'q_scales' must be contiguous in its last dimension (stride 1)"},
      {true, [](dsv4::IndexerParams& p) { p.q_scales.device = Device::cuda(0); },
       "argument 'q_scales' is on cuda:0"},
      {true,
       [&](dsv4::IndexerParams& p) {
         p.topk_scores =
             TensorView::contiguous(packed_in.q_scales.data(), DType::kFloat32, {N, packed.top_k});
       },
       "'topk_scores'"},  // overlaps q_scales
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE("case " + std::to_string(i));
    IndexInputs& in = cases[i].on_packed ? packed_in : fp8_in;
    dsv4::IndexerParams p = in.params(cases[i].on_packed ? packed : fp8);
    cases[i].change(p);
    expect_error([&] { dsv4::index_topk(p); }, cases[i].needle);
    EXPECT_EQ(in.indices[0], 0x5a5a5a5a);  // nothing written
    EXPECT_EQ(read_counter(in.counter, DType::kInt32), 3);
  }
  // The unchanged calls are valid.
  dsv4::index_topk(fp8_in.params(fp8));
  dsv4::index_topk(packed_in.params(packed));
  EXPECT_EQ(fp8_in.indices[0] >= 0 && packed_in.indices[0] >= 0, true);
}

// A build without CUDA says so for CUDA tensors, after the same validation as the CPU's.
TEST(IndexTopkValidation, CudaTensorsWithoutACudaBuild) {
#ifdef HDK_WITH_CUDA
  GTEST_SKIP() << "this build has the CUDA backend";
#else
  IndexCase ic;
  ic.counts = std::vector<int64_t>{3};
  ic.top_k = 2;
  IndexInputs ii = make_index_inputs(ic);
  dsv4::IndexerParams ip = ii.params(ic);
  for (TensorView* view : {&ip.q, &ip.weights, &ip.key_cache, &ip.block_table, &ip.num_entries,
                           &ip.topk_indices, &ip.topk_scores, &ip.topk_slots, &ip.invalid_count})
    view->device = Device::cuda(0);
  expect_error([&] { dsv4::index_topk(ip); }, "has no CUDA backend");
#endif
}

}  // namespace
}  // namespace testing
}  // namespace hdk
