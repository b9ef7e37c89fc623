// index_topk (the CPU backend and the CUDA kernel with each of its two scoring paths, tensor
// cores and CUDA cores; CUDA cases skip only without a GPU) against the float64 reference, on
// random keys written by the write side's store_indexer_keys into shuffled pages, with poisoned
// outputs and counters that start at 3.
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
