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

#include "dsv4/reference/attention_reference.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "support/device_memory.h"
#include "support/expect_error.h"
#include "support/kv_cache_case.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>

#include "dsv4/cuda/index_topk_cuda.h"
#endif

namespace hdk {
namespace testing {
namespace {

using dsv4::KeyFormat;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

struct IndexCase {
  std::vector<int64_t> counts;  // num_entries per row
  int64_t heads = dsv4::kIndexerHeads;
  int64_t top_k = 512;
  int64_t block_size = 64;
  KeyFormat format = KeyFormat::kMXFP4;
  DType q_dtype = DType::kBFloat16;
  DType count_dtype = DType::kInt32;
  int64_t distinct_keys = 0;  // > 0: every key is one of this many (exact ties)
  // Keys of entry e scaled by 2^(e % 17 - 8): stored scales from about 2^-10 to 2^6, both sides
  // of the 2 where the warpgroup kernel's MXFP4 decode takes a second multiply.
  bool spread_key_scales = false;
  bool scores = true;         // pass topk_scores
  bool slots = true;          // pass topk_slots
  bool misaligned_q = false;  // q one element past a 16-byte boundary (no vector loads)
  uint64_t seed = 1;

  int64_t q_pad_bytes() const { return misaligned_q ? dtype_size(q_dtype) : 0; }

  std::string describe() const {
    std::string counts_text;
    for (int64_t c : counts)
      counts_text += std::to_string(c) + ",";
    return "counts=" + counts_text + " H=" + std::to_string(heads) +
           " top_k=" + std::to_string(top_k) + " bs=" + std::to_string(block_size) +
           (format == KeyFormat::kMXFP4 ? " mxfp4 " : " nvfp4 ") + dtype_name(q_dtype) +
           " distinct=" + std::to_string(distinct_keys) + (misaligned_q ? " misaligned" : "") +
           " seed=" + std::to_string(seed);
  }
};

struct IndexInputs {
  int64_t N = 0, max_blocks = 0, num_blocks = 0;
  std::vector<float> q, weights;
  std::vector<uint8_t> q_bytes, cache, counts;
  std::vector<int32_t> block_table;
  std::vector<int32_t> indices;  // poisoned output
  std::vector<float> scores;     // poisoned output
  std::vector<int32_t> slots;    // poisoned output
  std::vector<uint8_t> counter = counter_bytes(DType::kInt32, 3);

  dsv4::IndexerParams params(const IndexCase& c) {
    dsv4::IndexerParams p;
    p.q = TensorView::contiguous(q_bytes.data() + c.q_pad_bytes(), c.q_dtype,
                                 {N, c.heads, dsv4::kIndexerKeyDim});
    p.weights = TensorView::contiguous(weights.data(), DType::kFloat32, {N, c.heads});
    p.key_cache = TensorView::contiguous(cache.data(), DType::kUInt8,
                                         {num_blocks, c.block_size * dsv4::key_bytes(c.format)});
    p.block_size = c.block_size;
    p.format = c.format;
    p.block_table = TensorView::contiguous(block_table.data(), DType::kInt32, {N, max_blocks});
    p.num_entries = TensorView::contiguous(counts.data(), c.count_dtype, {N});
    p.top_k = c.top_k;
    p.topk_indices = TensorView::contiguous(indices.data(), DType::kInt32, {N, c.top_k});
    if (c.scores)
      p.topk_scores = TensorView::contiguous(scores.data(), DType::kFloat32, {N, c.top_k});
    if (c.slots) p.topk_slots = TensorView::contiguous(slots.data(), DType::kInt32, {N, c.top_k});
    p.invalid_count = TensorView::contiguous(counter.data(), DType::kInt32, {1});
    return p;
  }
};

// Keys of every row's entries stored by store_indexer_keys into shuffled pages; unused block
// table columns hold -1 (never read).
IndexInputs make_index_inputs(const IndexCase& c) {
  std::mt19937_64 rng(c.seed);
  IndexInputs in;
  in.N = static_cast<int64_t>(c.counts.size());
  const int64_t bs = c.block_size;
  int64_t pages = 0;
  for (int64_t count : c.counts) {
    in.max_blocks = std::max(in.max_blocks, (count + bs - 1) / bs + 1);
    pages += (count + bs - 1) / bs;
  }
  in.num_blocks = pages + 2;
  std::vector<int32_t> blocks(static_cast<size_t>(in.num_blocks));
  std::iota(blocks.begin(), blocks.end(), 0);
  std::shuffle(blocks.begin(), blocks.end(), rng);
  in.block_table.assign(static_cast<size_t>(in.N * in.max_blocks), -1);
  std::vector<int64_t> slots;
  int64_t next = 0;
  for (int64_t n = 0; n < in.N; ++n) {
    for (int64_t page = 0; page * bs < c.counts[n]; ++page)
      in.block_table[n * in.max_blocks + page] = blocks[next++];
    for (int64_t s = 0; s < c.counts[n]; ++s)
      slots.push_back(in.block_table[n * in.max_blocks + s / bs] * bs + s % bs);
  }
  const int64_t entries = static_cast<int64_t>(slots.size());
  std::vector<float> keys = normal_values(rng, entries * dsv4::kIndexerKeyDim, 1.0f);
  if (c.distinct_keys > 0) {
    for (int64_t e = 0; e < entries; ++e) {
      const int64_t source = (e * 7) % c.distinct_keys;
      for (int64_t i = 0; i < dsv4::kIndexerKeyDim; ++i)
        keys[e * dsv4::kIndexerKeyDim + i] = keys[source * dsv4::kIndexerKeyDim + i];
    }
  }
  if (c.spread_key_scales) {
    for (int64_t e = 0; e < entries; ++e) {
      for (int64_t i = 0; i < dsv4::kIndexerKeyDim; ++i)
        keys[e * dsv4::kIndexerKeyDim + i] *= std::ldexp(1.0f, static_cast<int>(e % 17) - 8);
    }
  }
  in.cache.resize(static_cast<size_t>(in.num_blocks * bs * dsv4::key_bytes(c.format)));
  for (auto& byte : in.cache)
    byte = static_cast<uint8_t>(rng());
  if (entries > 0) {
    std::vector<uint8_t> slot_bytes = index_bytes(slots, DType::kInt64);
    dsv4::StoreIndexerKeysParams store;
    store.keys =
        TensorView::contiguous(keys.data(), DType::kFloat32, {entries, dsv4::kIndexerKeyDim});
    store.slots = TensorView::contiguous(slot_bytes.data(), DType::kInt64, {entries});
    store.cache = TensorView::contiguous(in.cache.data(), DType::kUInt8,
                                         {in.num_blocks, bs * dsv4::key_bytes(c.format)});
    store.block_size = bs;
    store.format = c.format;
    dsv4::store_indexer_keys(store);
  }
  in.q = normal_values(rng, in.N * c.heads * dsv4::kIndexerKeyDim, 1.0f);
  in.weights = normal_values(rng, in.N * c.heads, 0.1f);
  in.q_bytes = encode_rows(in.q, c.q_dtype);
  in.q_bytes.insert(in.q_bytes.begin(), static_cast<size_t>(c.q_pad_bytes()), uint8_t{0x7f});
  in.counts = index_bytes(c.counts, c.count_dtype);
  in.indices.assign(static_cast<size_t>(in.N * c.top_k), 0x5a5a5a5a);
  in.scores.assign(static_cast<size_t>(in.N * c.top_k), kNaN);
  in.slots.assign(static_cast<size_t>(in.N * c.top_k), 0x5a5a5a5a);
  return in;
}

// Checks the outputs against the reference within the tolerances of the file comment.
void check_index_outputs(const IndexCase& c, const IndexInputs& in,
                         const dsv4::IndexerReference& ref, double relative_tolerance = 1e-5) {
  const int64_t K = c.top_k;
  for (int64_t n = 0; n < in.N; ++n) {
    SCOPED_TRACE("row " + std::to_string(n));
    const int32_t* got = &in.indices[n * K];
    const float* got_scores = &in.scores[n * K];
    const int64_t count = ref.invalid[n] ? 0 : c.counts[n];
    const int64_t kept = std::min(K, count);
    for (int64_t j = 0; j < K && c.slots; ++j) {
      const int32_t s = got[j];
      const int64_t want =
          s < 0 ? -1
                : in.block_table[n * in.max_blocks + s / c.block_size] * c.block_size +
                      s % c.block_size;
      ASSERT_EQ(in.slots[n * K + j], want) << "slot of position " << j << " (entry " << s << ")";
    }
    for (int64_t j = kept; j < K; ++j) {
      ASSERT_EQ(got[j], -1) << "padding at " << j;
      if (c.scores) {
        ASSERT_EQ(got_scores[j], -kInf) << "padding at " << j;
      }
    }
    if (kept == 0) continue;
    const std::vector<double>& score = ref.scores[n];
    std::vector<double> tol(static_cast<size_t>(count));
    for (int64_t s = 0; s < count; ++s)
      tol[s] = relative_tolerance * ref.magnitudes[n][s] + 1e-30;
    if (c.distinct_keys > 0) {
      for (int64_t j = 0; j < kept; ++j)
        ASSERT_EQ(got[j], ref.indices[n * K + j]) << "exact ties: position " << j;
    }
    std::vector<uint8_t> chosen(static_cast<size_t>(count), 0);
    double lowest_chosen = std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < kept; ++j) {
      const int32_t s = got[j];
      ASSERT_TRUE(s >= 0 && s < count) << "index " << s << " at " << j;
      ASSERT_FALSE(chosen[s]) << "index " << s << " twice";
      chosen[s] = 1;
      lowest_chosen = std::min(lowest_chosen, score[s] + tol[s]);
      if (j > 0) {  // best first: a later entry may beat an earlier one only within tolerance
        const int32_t before = got[j - 1];
        ASSERT_LE(score[s], score[before] + tol[s] + tol[before]) << "order at " << j;
      }
      if (c.scores) {
        ASSERT_NEAR(got_scores[j], score[s], tol[s]) << "score of entry " << s;
        if (j > 0) {
          ASSERT_GE(got_scores[j - 1], got_scores[j]) << "not best first at " << j;
          if (got_scores[j - 1] == got_scores[j]) {
            ASSERT_LT(got[j - 1], got[j]) << "tie order";
          }
        }
      }
    }
    for (int64_t s = 0; s < count; ++s) {
      if (!chosen[s]) {
        ASSERT_LE(score[s] - tol[s], lowest_chosen) << "entry " << s << " should have been chosen";
      }
    }
  }
}

// Where index_topk runs: the CPU backend, or the CUDA kernel scoring on tensor cores (its
// default: warpgroups up to 64 heads, warps above), on the warp kernel at any head count, or on
// CUDA cores (its plain cross-check path).
enum class IndexBackend { kCPU, kCudaTensorCore, kCudaWarpMma, kCudaCore };

const char* index_backend_name(IndexBackend backend) {
  switch (backend) {
    case IndexBackend::kCPU:
      return "cpu";
    case IndexBackend::kCudaTensorCore:
      return "cuda_tensor_core";
    case IndexBackend::kCudaWarpMma:
      return "cuda_warp_mma";
    case IndexBackend::kCudaCore:
      return "cuda_core";
  }
  return "?";
}

Backend memory_of(IndexBackend backend) {
  return backend == IndexBackend::kCPU ? Backend::kCPU : Backend::kCUDA;
}

// The relative score tolerance of the file comment for a backend and query dtype.
double index_tolerance(IndexBackend backend, DType q_dtype) {
  const bool split_queries =
      backend == IndexBackend::kCudaTensorCore || backend == IndexBackend::kCudaWarpMma;
  return split_queries && q_dtype == DType::kFloat32 ? 2.6e-5 : 1e-5;
}

// Forces the CUDA kernel's scoring path for one scope and puts the default back, so a failing
// test cannot leave later tests on the cross-check path.
class ScorePathScope {
 public:
  explicit ScorePathScope(IndexBackend backend) {
#ifdef HDK_WITH_CUDA
    dsv4::detail::set_index_score_path(
        backend == IndexBackend::kCudaCore      ? dsv4::detail::IndexScorePath::kCudaCore
        : backend == IndexBackend::kCudaWarpMma ? dsv4::detail::IndexScorePath::kWarpMma
                                                : dsv4::detail::IndexScorePath::kTensorCore);
#else
    (void)backend;
#endif
  }
  ~ScorePathScope() {
#ifdef HDK_WITH_CUDA
    dsv4::detail::set_index_score_path(dsv4::detail::IndexScorePath::kTensorCore);
#endif
  }
  ScorePathScope(const ScorePathScope&) = delete;
  ScorePathScope& operator=(const ScorePathScope&) = delete;
};

// index_topk of `in` on `backend`; in.indices, in.scores and in.counter receive the outputs (on
// CUDA: copies of the host arrays, poison included, go to the device and come back).
void run_index_topk(const IndexCase& c, IndexInputs& in, IndexBackend backend) {
  if (backend == IndexBackend::kCPU) {
    dsv4::index_topk(in.params(c));
    return;
  }
  const Backend memory = memory_of(backend);
  const Device device = backend_device(memory);
  ScorePathScope scope(backend);
  auto buffer = [&](const void* host, size_t bytes) {
    DeviceBuffer b(memory, std::max<size_t>(bytes, 16));
    if (bytes > 0) b.upload(host, bytes);
    return b;
  };
  DeviceBuffer q = buffer(in.q_bytes.data(), in.q_bytes.size());
  DeviceBuffer weights = buffer(in.weights.data(), in.weights.size() * 4);
  DeviceBuffer cache = buffer(in.cache.data(), in.cache.size());
  DeviceBuffer table = buffer(in.block_table.data(), in.block_table.size() * 4);
  DeviceBuffer counts = buffer(in.counts.data(), in.counts.size());
  DeviceBuffer indices = buffer(in.indices.data(), in.indices.size() * 4);
  DeviceBuffer scores = buffer(in.scores.data(), in.scores.size() * 4);
  DeviceBuffer slots = buffer(in.slots.data(), in.slots.size() * 4);
  DeviceBuffer counter = buffer(in.counter.data(), in.counter.size());
  dsv4::IndexerParams p = in.params(c);
  auto to_device = [&](TensorView& view, const DeviceBuffer& b) {
    view.data = b.data();
    view.device = device;
  };
  to_device(p.q, q);
  p.q.data = static_cast<uint8_t*>(q.data()) + c.q_pad_bytes();
  to_device(p.weights, weights);
  to_device(p.key_cache, cache);
  to_device(p.block_table, table);
  to_device(p.num_entries, counts);
  to_device(p.topk_indices, indices);
  if (p.topk_scores.defined()) to_device(p.topk_scores, scores);
  if (p.topk_slots.defined()) to_device(p.topk_slots, slots);
  to_device(p.invalid_count, counter);
  dsv4::index_topk(p);
  synchronize(memory);
  indices.download(in.indices.data(), in.indices.size() * 4);
  scores.download(in.scores.data(), in.scores.size() * 4);
  slots.download(in.slots.data(), in.slots.size() * 4);
  counter.download(in.counter.data(), in.counter.size());
}

void run_index_case(const IndexCase& c, IndexBackend backend) {
  SCOPED_TRACE(c.describe() + " on " + index_backend_name(backend));
  IndexInputs in = make_index_inputs(c);
  std::vector<uint8_t> ref_counter = counter_bytes(DType::kInt32, 3);
  dsv4::IndexerParams ref_params = in.params(c);
  ref_params.invalid_count = TensorView::contiguous(ref_counter.data(), DType::kInt32, {1});
  const dsv4::IndexerReference ref = dsv4::index_topk_reference(ref_params);
  run_index_topk(c, in, backend);
  EXPECT_EQ(read_counter(in.counter, DType::kInt32), 3 + ref.invalid_rows);
  EXPECT_EQ(read_counter(ref_counter, DType::kInt32), 3 + ref.invalid_rows);
  check_index_outputs(c, in, ref, index_tolerance(backend, c.q_dtype));
}

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
