// index_topk on CUDA with the caller's workspace, where few rows are scored over every SM into the
// workspace and a cluster per row selects from there: on random cases (1 to 8 rows of up to 70000
// entries, top_k up to 2048, bf16 and fp32 queries, MXFP4 and NVFP4 keys, exact ties, keys stored
// with NaN markers, invalid rows of every kind), on a block id out of range in any scoring CTA's
// share, and on cases of the quantized q forms (E4M3 q over fp8 keys, packed MXFP4 q over mxfp4
// keys), and of the exact q over mxfp4 keys streamed through the scoring kernel's key ring, its
// outputs equal the one-launch path's bit for bit (indices, scores, slots,
// invalid_count), whatever bytes the workspace held before, and match the float64 reference
// (index_topk_test.cpp's tolerances); a workspace too small is an error naming it before anything
// is written; a CUDA graph replays it to the same bytes. Every case skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"
#include "hdk/error.h"
#include "support/device_memory.h"
#include "support/index_topk_case.h"
#include "support/kv_cache_case.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>

#include "dsv4/attention/attention_validation.h"
#include "dsv4/index_topk/cuda/index_topk_cuda.h"
#endif

namespace hdk {
namespace testing {
namespace {

using dsv4::KeyFormat;

class IndexTopkWorkspace : public ::testing::TestWithParam<IndexBackend> {
 protected:
  void SetUp() override {
    const std::string reason = backend_unavailable_reason(Backend::kCUDA);
    if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
  }
  IndexBackend backend() const { return GetParam(); }
};

#ifdef HDK_WITH_CUDA

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The outputs of one run, as bytes.
struct Outputs {
  std::vector<int32_t> indices, slots;
  std::vector<float> scores;
  std::vector<uint8_t> counter;
};

Outputs outputs_of(const IndexInputs& in) {
  return Outputs{in.indices, in.slots, in.scores, in.counter};
}

void expect_same_bytes(const Outputs& got, const Outputs& want, const std::string& what) {
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  EXPECT_TRUE(same(got.indices, want.indices)) << what << ": topk_indices differ";
  EXPECT_TRUE(same(got.scores, want.scores)) << what << ": topk_scores differ";
  EXPECT_TRUE(same(got.slots, want.slots)) << what << ": topk_slots differ";
  EXPECT_TRUE(same(got.counter, want.counter)) << what << ": invalid_count differs";
}

std::vector<uint8_t> random_bytes(uint64_t seed, size_t count) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(count);
  for (uint8_t& b : bytes)
    b = static_cast<uint8_t>(rng());
  return bytes;
}

// Checks `outputs`, of a run on `in`, against the float64 reference of `reference_case` over
// `reference_inputs` (what a deliberate breakage of `in` should give); returns the rows the
// reference counts invalid.
int64_t check_against_reference(const IndexCase& reference_case, IndexInputs& reference_inputs,
                                const IndexInputs& in, const Outputs& outputs, double tolerance) {
  std::vector<uint8_t> ref_counter = counter_bytes(DType::kInt32, 3);
  dsv4::IndexerParams ref_params = reference_inputs.params(reference_case);
  ref_params.invalid_count = TensorView::contiguous(ref_counter.data(), DType::kInt32, {1});
  const dsv4::IndexerReference ref = dsv4::index_topk_reference(ref_params);
  IndexInputs got = in;
  got.indices = outputs.indices;
  got.scores = outputs.scores;
  got.slots = outputs.slots;
  got.counter = outputs.counter;
  check_index_outputs(reference_case, got, ref, tolerance);
  return ref.invalid_rows;
}

// A workspace of `bytes` holding zeros or the random bytes of `poison`.
struct Workspace {
  int64_t bytes = 0;
  uint64_t poison = 0;  // 0: zeroed
};

int64_t workspace_bytes_for(const IndexInputs& in, const IndexCase& c) {
  return dsv4::index_topk_workspace_bytes(in.N, in.max_blocks * c.block_size,
                                          backend_device(Backend::kCUDA));
}

// index_topk of `in` on `backend`, without a workspace (`workspace` null) or with one filled as
// it says; returns the outputs. `workspace_used` receives whether the plan scored through it,
// `report` what it launched.
Outputs run_on_cuda(const IndexCase& c, const IndexInputs& in, IndexBackend backend,
                    const Workspace* workspace, bool* workspace_used = nullptr,
                    dsv4::detail::IndexLaunchReport* report = nullptr) {
  ScorePathScope scope(backend);
  IndexDeviceCall call(c, in, Backend::kCUDA);
  const int64_t bytes = workspace != nullptr ? std::max<int64_t>(workspace->bytes, 16) : 16;
  DeviceBuffer space(Backend::kCUDA, static_cast<size_t>(bytes));
  if (workspace != nullptr) {
    if (workspace->poison == 0) {
      space.fill(0);
    } else {
      const std::vector<uint8_t> poison = random_bytes(workspace->poison, space.size());
      space.upload(poison.data(), poison.size());
    }
    call.params.workspace = TensorView::contiguous(space.data(), DType::kUInt8, {workspace->bytes},
                                                   backend_device(Backend::kCUDA));
  }
  const dsv4::detail::IndexLaunchReport launched = dsv4::detail::index_topk_launch_report(
      dsv4::detail::validate_index_topk(call.params), backend_device(Backend::kCUDA).index);
  if (workspace_used != nullptr) *workspace_used = launched.segments > 0;
  if (report != nullptr) *report = launched;
  dsv4::index_topk(call.params);
  IndexInputs out = in;
  call.download(out);
  return outputs_of(out);
}

// What a random case breaks in one row (the kernels check these on the device).
enum class Breakage {
  kNone,
  kNaNQuery,
  kInfiniteWeight,
  kCountAboveCapacity,
  kNegativeCount,
  kBlockBeyondTheCache
};

struct RandomCase {
  IndexCase c;
  Breakage breakage = Breakage::kNone;
  int64_t broken_row = 0;
  int64_t nan_key_row = -1;  // a row with an entry whose key is stored with NaN markers
};

RandomCase draw_case(std::mt19937_64& rng, uint64_t seed) {
  RandomCase r;
  IndexCase& c = r.c;
  auto pick = [&](auto&& values) { return values[rng() % values.size()]; };
  // Mostly rows few enough to spread over the SMs (up to 4: clusters of 16 leave half idle).
  const int64_t rows = pick(std::vector<int64_t>{1, 1, 2, 2, 3, 4, 4, 6, 8});
  // The float64 reference scores every entry: about 100000 entries a case keep it to seconds.
  const int64_t longest = rows <= 1 ? 70000 : 100000 / rows;
  c.counts.resize(static_cast<size_t>(rows));
  for (int64_t& count : c.counts) {
    const uint64_t kind = rng() % 4;
    count = kind == 0   ? longest
            : kind == 1 ? static_cast<int64_t>(rng() % 2000)
                        : static_cast<int64_t>(rng() % static_cast<uint64_t>(longest + 1));
  }
  c.heads = pick(std::vector<int64_t>{64, 64, 24, 128});
  c.top_k = pick(std::vector<int64_t>{1, 7, 512, 1024, 2048});
  c.block_size = pick(std::vector<int64_t>{64, 64, 32, 16});
  c.format = rng() % 2 ? KeyFormat::kMXFP4 : KeyFormat::kNVFP4;
  c.q_dtype = rng() % 2 ? DType::kBFloat16 : DType::kFloat32;
  c.count_dtype = rng() % 2 ? DType::kInt32 : DType::kInt64;
  // Exact ties among few distinct keys (the reference's order must come back exactly: with many
  // distinct keys two could be closer than the tolerance and swap).
  c.distinct_keys = rng() % 4 == 0 ? pick(std::vector<int64_t>{1, 3, 5}) : 0;
  c.spread_key_scales = c.distinct_keys == 0 && rng() % 5 == 0;
  c.scores = rng() % 6 != 0;
  c.slots = rng() % 6 != 0;
  c.seed = seed;
  if (rng() % 3 == 0) {
    r.breakage = static_cast<Breakage>(1 + rng() % 5);
    r.broken_row = static_cast<int64_t>(rng() % static_cast<uint64_t>(rows));
  }
  if (rng() % 3 == 0) r.nan_key_row = static_cast<int64_t>(rng() % static_cast<uint64_t>(rows));
  return r;
}

// Stores a key holding a NaN over entry `entry` of row `row` (it then scores NaN, ranking last).
void store_nan_key(const IndexCase& c, IndexInputs& in, int64_t row, int64_t entry) {
  std::vector<float> key(dsv4::kIndexerKeyDim, 1.0f);
  key[40] = kNaN;
  const int64_t slot = in.block_table[row * in.max_blocks + entry / c.block_size] * c.block_size +
                       entry % c.block_size;
  std::vector<uint8_t> slot_bytes = index_bytes({slot}, DType::kInt64);
  dsv4::StoreIndexerKeysParams store;
  store.keys = TensorView::contiguous(key.data(), DType::kFloat32, {1, dsv4::kIndexerKeyDim});
  store.slots = TensorView::contiguous(slot_bytes.data(), DType::kInt64, {1});
  store.cache = TensorView::contiguous(in.cache.data(), DType::kUInt8,
                                       {in.num_blocks, c.block_size * dsv4::key_bytes(c.format)});
  store.block_size = c.block_size;
  store.format = c.format;
  dsv4::store_indexer_keys(store);
}

// Breaks the row as `breakage` says. The reference sees the inputs as broken where it counts
// the row itself (non-finite queries or weights); where it would refuse them (counts and block
// ids out of range) it sees the row as empty, and `extra_invalid` is the row it does not count.
void apply_breakage(const RandomCase& r, IndexInputs& in, IndexCase& reference_case,
                    IndexInputs& reference_inputs, int64_t& extra_invalid) {
  const IndexCase& c = r.c;
  const int64_t n = r.broken_row, D = dsv4::kIndexerKeyDim;
  const int64_t capacity = in.max_blocks * c.block_size;
  bool refused = true;
  switch (r.breakage) {
    case Breakage::kNone:
      return;
    case Breakage::kNaNQuery:
      in.q[n * c.heads * D + 77] = kNaN;
      in.q_bytes = encode_rows(in.q, c.q_dtype);
      refused = false;
      break;
    case Breakage::kInfiniteWeight:
      in.weights[n * c.heads + c.heads - 1] = -kInf;
      refused = false;
      break;
    case Breakage::kCountAboveCapacity:
      put_index(in.counts, c.count_dtype, static_cast<size_t>(n), capacity + 1);
      break;
    case Breakage::kNegativeCount:
      put_index(in.counts, c.count_dtype, static_cast<size_t>(n), -1);
      break;
    case Breakage::kBlockBeyondTheCache:
      if (c.counts[n] == 0) return;  // no used page to break
      in.block_table[n * in.max_blocks] = static_cast<int32_t>(in.num_blocks);
      break;
  }
  reference_inputs = in;
  if (refused) {
    reference_case.counts[n] = 0;
    put_index(reference_inputs.counts, c.count_dtype, static_cast<size_t>(n), 0);
    extra_invalid = 1;
  }
}

void random_cases_equal_the_one_launch_path_and_the_reference(IndexBackend backend) {
  std::mt19937_64 rng(4040);
  const int kCases = 10;
  int through_workspace = 0;
  for (int i = 0; i < kCases; ++i) {
    const RandomCase r = draw_case(rng, 900 + static_cast<uint64_t>(i));
    const IndexCase& c = r.c;
    SCOPED_TRACE("case " + std::to_string(i) + ": " + c.describe() + " breakage " +
                 std::to_string(static_cast<int>(r.breakage)) + " row " +
                 std::to_string(r.broken_row) + " nan key row " + std::to_string(r.nan_key_row) +
                 " on " + index_backend_name(backend));
    IndexInputs in = make_index_inputs(c);
    if (r.nan_key_row >= 0 && c.counts[r.nan_key_row] > 0)
      store_nan_key(c, in, r.nan_key_row, c.counts[r.nan_key_row] / 2);
    IndexCase reference_case = c;
    IndexInputs reference_inputs = in;
    int64_t extra_invalid = 0;
    apply_breakage(r, in, reference_case, reference_inputs, extra_invalid);

    const Outputs one_launch = run_on_cuda(c, in, backend, nullptr);
    const int64_t bytes = workspace_bytes_for(in, c);
    bool used = false;
    const Workspace clean{bytes, 0};
    const Outputs zeroed = run_on_cuda(c, in, backend, &clean, &used);
    const Workspace poisoned{bytes, 77 + static_cast<uint64_t>(i)};
    const Outputs garbage = run_on_cuda(c, in, backend, &poisoned);
    through_workspace += used ? 1 : 0;
    expect_same_bytes(zeroed, one_launch, "zeroed workspace against no workspace");
    expect_same_bytes(garbage, zeroed, "poisoned workspace against a zeroed one");

    const int64_t invalid_rows = check_against_reference(
        reference_case, reference_inputs, in, zeroed, index_tolerance(backend, c.q_dtype));
    EXPECT_EQ(read_counter(zeroed.counter, DType::kInt32), 3 + invalid_rows + extra_invalid);
  }
  // The draws are mostly few rows: the plan must have scored most of them over every SM.
  EXPECT_GE(through_workspace, kCases / 2);
}

// A workspace below index_topk_workspace_bytes for the call's sizes: an error naming it, with the
// bytes needed and given, and nothing written, whether or not the call's plan would use it (so a
// short allocation fails on the first call, not on a later one of other sizes). One of the
// documented size that the plan does not use (64 rows of NVFP4 keys fill the SMs) changes
// nothing.
void too_small_is_an_error_before_any_write(IndexBackend backend) {
  auto expect_refused = [&](const IndexCase& c, const IndexInputs& in, int64_t given,
                            int64_t needed) {
    ScorePathScope scope(backend);
    IndexDeviceCall call(c, in, Backend::kCUDA);
    DeviceBuffer space(Backend::kCUDA, static_cast<size_t>(needed));
    call.params.workspace = TensorView::contiguous(space.data(), DType::kUInt8, {given},
                                                   backend_device(Backend::kCUDA));
    try {
      dsv4::index_topk(call.params);
      ADD_FAILURE() << "no error for a workspace of " << given << " bytes";
    } catch (const Error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("argument 'workspace'"), std::string::npos) << message;
      EXPECT_NE(message.find(std::to_string(needed)), std::string::npos) << message;
      EXPECT_NE(message.find(std::to_string(given)), std::string::npos) << message;
    }
    // Nothing written: the outputs and the counter keep their poison.
    IndexInputs out = in;
    call.download(out);
    expect_same_bytes(outputs_of(out), outputs_of(in), "after the error");
  };

  IndexCase c;
  c.counts = std::vector<int64_t>{16384};
  IndexInputs in = make_index_inputs(c);
  const int64_t needed = workspace_bytes_for(in, c);
  ASSERT_GT(needed, 0);
  bool used = false;
  const Workspace enough{needed, 5};
  run_on_cuda(c, in, backend, &enough, &used);
  ASSERT_TRUE(used) << "one row of 16384 entries is meant to spread over the SMs";
  expect_refused(c, in, needed - 256, needed);

  // NVFP4 keys: the exact q over MXFP4 keys streams every row through the workspace.
  IndexCase many;
  many.counts = std::vector<int64_t>(64, 2048);
  many.top_k = 64;
  many.format = KeyFormat::kNVFP4;
  IndexInputs many_in = make_index_inputs(many);
  const int64_t many_needed = workspace_bytes_for(many_in, many);
  ASSERT_GT(many_needed, 16);
  const Workspace documented{many_needed, 9};
  bool many_used = true;
  const Outputs with = run_on_cuda(many, many_in, backend, &documented, &many_used);
  EXPECT_FALSE(many_used);
  expect_same_bytes(with, run_on_cuda(many, many_in, backend, nullptr), "64 rows");
  expect_refused(many, many_in, 16, many_needed);
}

// Captured in a CUDA graph, the two launches replay to the one-launch path's bytes, also after
// the workspace and the outputs were poisoned again between replays.
void graph_replay_gives_the_same_bytes(IndexBackend backend) {
  IndexCase c;
  c.counts = std::vector<int64_t>{40000, 3, 9000};
  c.top_k = 512;
  c.q_dtype = DType::kFloat32;
  c.format = KeyFormat::kNVFP4;
  IndexInputs in = make_index_inputs(c);
  const Outputs one_launch = run_on_cuda(c, in, backend, nullptr);
  const int64_t bytes = workspace_bytes_for(in, c);

  ScorePathScope scope(backend);
  IndexDeviceCall call(c, in, Backend::kCUDA);
  DeviceBuffer space(Backend::kCUDA, static_cast<size_t>(bytes));
  call.params.workspace =
      TensorView::contiguous(space.data(), DType::kUInt8, {bytes}, backend_device(Backend::kCUDA));
  ASSERT_GT(dsv4::detail::index_topk_launch_report(dsv4::detail::validate_index_topk(call.params),
                                                   backend_device(Backend::kCUDA).index)
                .segments,
            0);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  dsv4::index_topk(call.params, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (uint64_t replay = 1; replay <= 2; ++replay) {
    const std::vector<uint8_t> poison = random_bytes(replay, static_cast<size_t>(bytes));
    space.upload(poison.data(), poison.size());
    call.reset_outputs(in);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    IndexInputs out = in;
    call.download(out);
    expect_same_bytes(outputs_of(out), one_launch, "replay " + std::to_string(replay));
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

// The quantized q forms (E4M3 codes over fp8 keys, packed MXFP4 over mxfp4 keys) through the
// workspace: the one-launch path's bytes and the reference, rows of up to 70000 entries, pages of
// 64 entries (E4M3 tiles copied as whole pages), of 128 (two tiles a page), and, for tiles that
// span pages and pools off the 16-byte grid (the key ring's 4-byte copies), of 16 and 3.
void quantized_queries_equal_the_one_launch_path_and_the_reference(IndexBackend backend) {
  uint64_t seed = 950;
  auto run = [&](IndexQuery form, const std::vector<int64_t>& counts, int64_t block_size) {
    IndexCase c;
    c.q_form = form;
    c.format = form == IndexQuery::kE4M3 ? KeyFormat::kFP8 : KeyFormat::kMXFP4;
    c.counts = counts;
    c.top_k = counts.size() == 1 ? 2048 : 512;
    c.block_size = block_size;
    c.seed = seed++;
    c.signed_key_scales = c.seed % 2 == 0;  // fp8 scales of either sign and zero
    SCOPED_TRACE(c.describe() + " on " + index_backend_name(backend));
    IndexInputs in = make_index_inputs(c);
    // A NaN key (MXFP4: its group's scale byte 0xFF) in the longest row: the tile that holds it
    // takes the ring's full scale decode, the others its short form (mxfp4_normal_group_scale).
    if (form == IndexQuery::kMXFP4) {
      const auto longest = std::max_element(counts.begin(), counts.end());
      store_nan_key(c, in, longest - counts.begin(), *longest / 2);
    }
    const Outputs one_launch = run_on_cuda(c, in, backend, nullptr);
    bool used = false;
    const Workspace poisoned{workspace_bytes_for(in, c), seed};
    const Outputs through = run_on_cuda(c, in, backend, &poisoned, &used);
    // On tensor cores every case here takes the workspace (long rows of the FP8 forms stream, few
    // rows spread over the SMs); on CUDA cores only the cases of 1 and 4 rows spread, and 8 or 70
    // rows keep a cluster each.
    const bool spreads = backend != IndexBackend::kCudaCore || counts.size() <= 4;
    EXPECT_EQ(used, spreads)
        << "few long rows spread over the SMs, and long rows of the FP8 forms stream";
    expect_same_bytes(through, one_launch, "poisoned workspace against no workspace");
    EXPECT_EQ(check_against_reference(c, in, in, through, index_tolerance(backend, c)), 0);
    EXPECT_EQ(read_counter(through.counter, DType::kInt32), 3);
  };
  // 70 rows, one of them long: both FP8 forms on tensor cores stream through the workspace 64
  // rows a launch (two pairs of launches); on CUDA cores they take the one launch. With the long
  // row at 20000 entries the packed MXFP4 q still streams every row (index_ring_rows) where the
  // E4M3 rule by sizes would keep the one launch.
  std::vector<int64_t> many_rows(70);
  for (size_t i = 0; i < many_rows.size(); ++i)
    many_rows[i] = static_cast<int64_t>((i * 977) % 3001);
  many_rows[66] = 66000;
  std::vector<int64_t> many_shorter_rows = many_rows;
  many_shorter_rows[66] = 20000;
  for (IndexQuery form : {IndexQuery::kE4M3, IndexQuery::kMXFP4}) {
    for (const std::vector<int64_t>& counts :
         {std::vector<int64_t>{70000}, std::vector<int64_t>{30000, 17, 0, 45000}, many_rows,
          many_shorter_rows}) {
      run(form, counts, 64);
    }
    // 8 rows, one of 17000 entries: both forms take the key ring (index_rows_stream,
    // index_mxfp4_ring_pays).
    for (int64_t block_size : {128, 16, 3})
      run(form, std::vector<int64_t>{17000, 3, 0, 2100, 700, 64, 65, 1500}, block_size);
  }
}

// Turns the MXFP4 key ring off (set_index_key_ring_override) until the scope ends, whatever
// throws in between, so that no later test runs without it.
class KeyRingOffScope {
 public:
  KeyRingOffScope() {
    dsv4::detail::set_index_key_ring_override(dsv4::detail::IndexKeyRingChoice::kNever);
  }
  ~KeyRingOffScope() {
    dsv4::detail::set_index_key_ring_override(dsv4::detail::IndexKeyRingChoice::kAuto);
  }
  KeyRingOffScope(const KeyRingOffScope&) = delete;
  KeyRingOffScope& operator=(const KeyRingOffScope&) = delete;
};

// The exact q (bf16 and fp32) over MXFP4 keys streamed through the key ring (every row on the
// warpgroup kernel, index_ring_rows): the one-launch path's bytes (the same products from
// registers) and the reference, with a poisoned workspace. Key scales on both sides of the
// two-step decode (spread_key_scales), a key stored with NaN markers, pages of 64 and 128
// entries (16-byte copies) and of 16 and 3 (tiles across pages, 4-byte copies), and 130 rows
// (two pairs of launches, 128 rows and 2). On tensor cores the ring runs (and the override that
// turns it off gives the same bytes); on the warp and CUDA cores it does not exist.
void exact_queries_stream_mxfp4_keys_through_the_ring(IndexBackend backend) {
  uint64_t seed = 970;
  std::vector<int64_t> many_rows(130);
  for (size_t i = 0; i < many_rows.size(); ++i)
    many_rows[i] = static_cast<int64_t>((i * 577) % 1201);
  many_rows[129] = 20000;
  for (DType q_dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (int64_t block_size : {64, 128, 16, 3, 0}) {
      IndexCase c;
      c.format = KeyFormat::kMXFP4;
      c.q_dtype = q_dtype;
      c.counts =
          block_size == 0 ? many_rows : std::vector<int64_t>{17000, 3, 0, 2100, 700, 64, 65, 16400};
      if (block_size == 0) block_size = 64;
      c.top_k = block_size == 3 ? 2048 : 512;
      c.block_size = block_size;
      c.spread_key_scales = block_size % 2 == 0;
      c.seed = seed++;
      SCOPED_TRACE(c.describe() + " on " + index_backend_name(backend));
      IndexInputs in = make_index_inputs(c);
      store_nan_key(c, in, c.counts.size() == 8 ? 0 : 129, 9000);  // in each case's longest row
      const Outputs one_launch = run_on_cuda(c, in, backend, nullptr);
      const Workspace poisoned{workspace_bytes_for(in, c), seed};
      dsv4::detail::IndexLaunchReport report;
      const Outputs through = run_on_cuda(c, in, backend, &poisoned, nullptr, &report);
      const bool warpgroup = backend == IndexBackend::kCudaTensorCore;
      EXPECT_EQ(report.key_ring, warpgroup) << "the warpgroup kernel streams every row";
      if (warpgroup) {
        EXPECT_GT(report.segments, 0);
      }
      expect_same_bytes(through, one_launch, "the key ring against no workspace");
      dsv4::detail::IndexLaunchReport registers;
      Outputs from_registers;
      {
        const KeyRingOffScope off;
        from_registers = run_on_cuda(c, in, backend, &poisoned, nullptr, &registers);
      }
      EXPECT_FALSE(registers.key_ring);
      expect_same_bytes(from_registers, through, "the register-fed scoring against the ring");
      EXPECT_EQ(check_against_reference(c, in, in, through, index_tolerance(backend, c)), 0);
      EXPECT_EQ(read_counter(through.counter, DType::kInt32), 3);
    }
  }
}

// A block id beyond the cache in any used page invalidates its row, whichever scoring CTA's share
// holds the page: each CTA checks the row's first kIndexEarlyPages pages and its own, and the
// select reads a short row's first flag or ORs a long row's. Pages at the start, middle and end
// of a long row (first, middle and last of its CTAs; the first among every CTA's early pages) and
// the last page of a short one, for the exact q over MXFP4 keys and E4M3 q over FP8 keys (both
// through the key ring): the one-launch path's bytes (it checks the whole row in every CTA of the
// row's cluster), the row
// all padding and counted once, the other row untouched. The pages past a row's entries are -1
// in every case and change nothing.
void a_bad_block_in_any_share_invalidates_its_row(IndexBackend backend) {
  uint64_t seed = 990;
  for (IndexQuery form : {IndexQuery::kExact, IndexQuery::kE4M3}) {
    IndexCase c;
    c.q_form = form;
    c.format = form == IndexQuery::kE4M3 ? KeyFormat::kFP8 : KeyFormat::kMXFP4;
    c.counts = std::vector<int64_t>{65000, 3000};
    c.seed = seed++;
    const IndexInputs clean = make_index_inputs(c);
    const Outputs unbroken = run_on_cuda(c, clean, backend, nullptr);
    const int64_t long_pages = (c.counts[0] + c.block_size - 1) / c.block_size;
    const int64_t short_pages = (c.counts[1] + c.block_size - 1) / c.block_size;
    const std::pair<int64_t, int64_t> breaks[] = {
        {0, 0}, {0, long_pages / 2}, {0, long_pages - 1}, {1, short_pages - 1}};
    for (const auto& [row, page] : breaks) {
      SCOPED_TRACE(c.describe() + " row " + std::to_string(row) + " page " + std::to_string(page) +
                   " on " + index_backend_name(backend));
      IndexInputs in = clean;
      in.block_table[row * in.max_blocks + page] = static_cast<int32_t>(in.num_blocks);
      const Outputs one_launch = run_on_cuda(c, in, backend, nullptr);
      bool used = false;
      const Workspace poisoned{workspace_bytes_for(in, c), seed + static_cast<uint64_t>(page)};
      const Outputs through = run_on_cuda(c, in, backend, &poisoned, &used);
      EXPECT_TRUE(used) << "two rows of these lengths spread over the SMs";
      expect_same_bytes(through, one_launch, "poisoned workspace against no workspace");
      const int64_t k = c.top_k, other = 1 - row;
      for (int64_t j = 0; j < k; ++j) {
        ASSERT_EQ(through.indices[row * k + j], -1) << j;
        ASSERT_EQ(through.scores[row * k + j], -kInf) << j;
        ASSERT_EQ(through.slots[row * k + j], -1) << j;
        ASSERT_EQ(through.indices[other * k + j], unbroken.indices[other * k + j]) << j;
      }
      EXPECT_EQ(read_counter(through.counter, DType::kInt32), 4);
    }
  }
}

// Rows of up to kIndexCtaSelectMaxEntries entries through the workspace are selected by one CTA
// each (cta_select): rows where the first levels decide, rows whose keys all tie (the levels
// reach the columns' bits), NaN scores, rows of exactly top_k entries and shorter (the whole row
// wanted) and empty ones, top_k from 1 to 2048; MXFP4 keys with the exact q, and E4M3 keys with
// the E4M3 q, whose rows of more than 8192 keys stream through the key ring. The one launch's
// bytes, whatever the workspace held, and the float64 reference.
void one_cta_select_equals_the_one_launch_path_and_the_reference(IndexBackend backend) {
  struct Shape {
    std::vector<int64_t> counts;
    int64_t top_k;
    int64_t distinct_keys;
    bool nan_key;
  };
  // Capacities (pages of 64, one spare page a row) up to kIndexCtaSelectMaxEntries.
  const Shape shapes[] = {
      {{16000}, 512, 0, false},
      {{16300}, 2048, 0, true},
      {{12000}, 1024, 1, false},
      {{10000, 5}, 512, 3, false},
      {{3000, 0, 700, 512}, 512, 0, true},
      {{9000}, 1, 5, false},
      {{2048, 2048}, 7, 0, false},
      {{16300, 12000, 1}, 1024, 0, true},
  };
  uint64_t seed = 970;
  for (const bool e4m3 : {false, true}) {
    for (const Shape& shape : shapes) {
      IndexCase c;
      if (e4m3) {
        c.q_form = IndexQuery::kE4M3;
        c.format = KeyFormat::kFP8;
      }
      c.counts = shape.counts;
      c.top_k = shape.top_k;
      c.distinct_keys = shape.distinct_keys;
      c.seed = seed++;
      SCOPED_TRACE(c.describe() + " on " + index_backend_name(backend));
      IndexInputs in = make_index_inputs(c);
      if (shape.nan_key) store_nan_key(c, in, 0, c.counts[0] / 2);
      const Outputs one_launch = run_on_cuda(c, in, backend, nullptr);
      dsv4::detail::IndexLaunchReport report;
      const Workspace poisoned{workspace_bytes_for(in, c), seed};
      const Outputs through = run_on_cuda(c, in, backend, &poisoned, nullptr, &report);
      ASSERT_GT(report.segments, 0) << "few rows of these lengths spread over the SMs";
      EXPECT_TRUE(report.select_in_one_cta);
      EXPECT_EQ(report.cluster_size, 1);
      expect_same_bytes(through, one_launch, "one-CTA select against no workspace");
      EXPECT_EQ(check_against_reference(c, in, in, through, index_tolerance(backend, c)), 0);
      EXPECT_EQ(read_counter(through.counter, DType::kInt32), 3);
    }
  }
}

#endif  // HDK_WITH_CUDA

TEST_P(IndexTopkWorkspace, OneCtaSelectEqualsTheOneLaunchPathAndTheReference) {
#ifdef HDK_WITH_CUDA
  one_cta_select_equals_the_one_launch_path_and_the_reference(backend());
#endif
}

TEST_P(IndexTopkWorkspace, QuantizedQueriesEqualTheOneLaunchPathAndTheReference) {
#ifdef HDK_WITH_CUDA
  quantized_queries_equal_the_one_launch_path_and_the_reference(backend());
#endif
}

TEST_P(IndexTopkWorkspace, ExactQueriesStreamMxfp4KeysThroughTheRing) {
#ifdef HDK_WITH_CUDA
  exact_queries_stream_mxfp4_keys_through_the_ring(backend());
#endif
}

TEST_P(IndexTopkWorkspace, RandomCasesEqualTheOneLaunchPathAndTheReference) {
#ifdef HDK_WITH_CUDA
  random_cases_equal_the_one_launch_path_and_the_reference(backend());
#endif
}

TEST_P(IndexTopkWorkspace, ABadBlockInAnyShareInvalidatesItsRow) {
#ifdef HDK_WITH_CUDA
  a_bad_block_in_any_share_invalidates_its_row(backend());
#endif
}

TEST_P(IndexTopkWorkspace, TooSmallIsAnErrorBeforeAnyWrite) {
#ifdef HDK_WITH_CUDA
  too_small_is_an_error_before_any_write(backend());
#endif
}

TEST_P(IndexTopkWorkspace, GraphReplayGivesTheSameBytes) {
#ifdef HDK_WITH_CUDA
  graph_replay_gives_the_same_bytes(backend());
#endif
}

std::string backend_param_name(const ::testing::TestParamInfo<IndexBackend>& param) {
  return index_backend_name(param.param);
}

INSTANTIATE_TEST_SUITE_P(Backends, IndexTopkWorkspace,
                         ::testing::Values(IndexBackend::kCudaTensorCore,
                                           IndexBackend::kCudaWarpMma, IndexBackend::kCudaCore),
                         backend_param_name);

}  // namespace
}  // namespace testing
}  // namespace hdk
