// A whole DeepSeek-V4 CSA-layer decode step captured in one CUDA graph and replayed over a
// sequence: store_and_compress (the SWA rings' entries, the main compressor's entries, d = 512,
// and the indexer compressor's MXFP4 keys, d = 128, in one launch), index_topk over the keys, and
// sparse_decode over the selected compressed entries (index_topk's topk_slots, passed on with no
// glue) plus the SWA ring (the extra list). New inputs are copied into the captured buffers before
// every replay. After every replay the outputs are checked against the float64 reference run on the
// bytes the graph left in the caches, and the caches must equal, byte for byte, those of the same
// calls run eagerly. Request 3 is padding in every step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/float_convert.h"
#include "dsv4/attention/reference/attention_reference.h"
#include "hdk/dsv4/attention.h"
#include "hdk/dsv4/kv_cache.h"
#include "support/device_memory.h"
#include "support/kv_cache_case.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>

#include "core/cuda_helpers.h"
#endif

namespace hdk {
namespace testing {
namespace {

#ifdef HDK_WITH_CUDA
void check(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

std::vector<uint8_t> download(const DeviceBuffer& buffer) {
  std::vector<uint8_t> bytes(buffer.size());
  buffer.download(bytes.data(), bytes.size());
  return bytes;
}

// Sizes of the step: 3 live requests and one padding row, one token each; ratio-4 compressed
// entries in pages of 4 (4 pages per request), SWA rings of 128, 64 indexer heads, 8 query heads.
struct Step {
  static constexpr int64_t kRows = 4, kLive = 3, kRatio = 4, kBlockSize = 4, kMaxBlocks = 4;
  static constexpr int64_t kBlocks = kRows * kMaxBlocks;
  static constexpr int64_t kMaxPosition = 64, kIndexHeads = 64, kQueryHeads = 8, kTopK = 8;
  static constexpr int64_t kWindow = 128;
};

// One compressor's buffers (d = 512 main entries or d = 128 indexer keys).
struct CompressorBuffers {
  int64_t dim, width, entry_bytes;
  DeviceBuffer kv, score, ape, norm, state, cache;

  CompressorBuffers(int64_t d, int64_t bytes_per_entry)
      : dim(d),
        width(2 * d),
        entry_bytes(bytes_per_entry),
        kv(Backend::kCUDA, Step::kRows * 2 * d * 4),
        score(Backend::kCUDA, Step::kRows * 2 * d * 4),
        ape(Backend::kCUDA, Step::kRatio * 2 * d * 4),
        norm(Backend::kCUDA, d * 4),
        state(Backend::kCUDA, Step::kRows * 3 * 3 * d * 4),
        cache(Backend::kCUDA, Step::kBlocks * Step::kBlockSize * bytes_per_entry) {}
};

// Every buffer the step reads or writes; `eager` and `graph` instances run the same sequence.
struct StepBuffers {
  using S = Step;
  DeviceBuffer values{Backend::kCUDA, S::kRows * 512 * 4}, swa_slots{Backend::kCUDA, S::kRows * 8},
      positions{Backend::kCUDA, S::kRows * 8}, state_slots{Backend::kCUDA, S::kRows * 8},
      table{Backend::kCUDA, S::kRows*S::kMaxBlocks * 4},
      cos_table{Backend::kCUDA, S::kMaxPosition * 32 * 4},
      sin_table{Backend::kCUDA, S::kMaxPosition * 32 * 4},
      swa{Backend::kCUDA, S::kRows*S::kWindow * 584},
      index_q{Backend::kCUDA, S::kRows*S::kIndexHeads * 128 * 4},
      index_weights{Backend::kCUDA, S::kRows*S::kIndexHeads * 4},
      num_entries{Backend::kCUDA, S::kRows * 4},
      topk_indices{Backend::kCUDA, S::kRows*S::kTopK * 4},
      topk_scores{Backend::kCUDA, S::kRows*S::kTopK * 4},
      q{Backend::kCUDA, S::kRows*S::kQueryHeads * 512 * 2},
      topk_slots{Backend::kCUDA, S::kRows*S::kTopK * 4},
      swa_indices{Backend::kCUDA, S::kRows*S::kWindow * 4},
      sink{Backend::kCUDA, S::kQueryHeads * 4},
      out{Backend::kCUDA, S::kRows*S::kQueryHeads * 512 * 2},
      lse{Backend::kCUDA, S::kRows*S::kQueryHeads * 4}, counter{Backend::kCUDA, 8};
  CompressorBuffers main{512, dsv4::kEntryBytes};
  CompressorBuffers indexer{128, dsv4::key_bytes(dsv4::KeyFormat::kMXFP4)};

  dsv4::CompressorParams compressor(CompressorBuffers& b) {
    const Device cuda = Device::cuda(0);
    dsv4::CompressorParams p;
    p.kv = TensorView::contiguous(b.kv.data(), DType::kFloat32, {S::kRows, 1, b.width}, cuda);
    p.score = TensorView::contiguous(b.score.data(), DType::kFloat32, {S::kRows, 1, b.width}, cuda);
    p.ape = TensorView::contiguous(b.ape.data(), DType::kFloat32, {S::kRatio, b.width}, cuda);
    p.positions = TensorView::contiguous(positions.data(), DType::kInt64, {S::kRows}, cuda);
    p.state_slots = TensorView::contiguous(state_slots.data(), DType::kInt64, {S::kRows}, cuda);
    p.state =
        TensorView::contiguous(b.state.data(), DType::kFloat32, {S::kRows, 3, 3, b.dim}, cuda);
    p.norm_weight = TensorView::contiguous(b.norm.data(), DType::kFloat32, {b.dim}, cuda);
    p.rope_cos =
        TensorView::contiguous(cos_table.data(), DType::kFloat32, {S::kMaxPosition, 32}, cuda);
    p.rope_sin =
        TensorView::contiguous(sin_table.data(), DType::kFloat32, {S::kMaxPosition, 32}, cuda);
    p.block_table =
        TensorView::contiguous(table.data(), DType::kInt32, {S::kRows, S::kMaxBlocks}, cuda);
    p.cache = TensorView::contiguous(b.cache.data(), DType::kUInt8,
                                     {S::kBlocks, S::kBlockSize * b.entry_bytes}, cuda);
    p.block_size = S::kBlockSize;
    p.ratio = S::kRatio;
    p.invalid_count = TensorView::contiguous(counter.data(), DType::kInt64, {1}, cuda);
    return p;
  }

  dsv4::IndexerParams indexer_params(const Device& where, void* key_cache, void* q_data,
                                     void* weights, void* block_table, void* counts,
                                     void* out_indices, void* out_scores, void* out_slots) const {
    dsv4::IndexerParams p;
    p.q = TensorView::contiguous(q_data, DType::kFloat32, {S::kRows, S::kIndexHeads, 128}, where);
    p.weights = TensorView::contiguous(weights, DType::kFloat32, {S::kRows, S::kIndexHeads}, where);
    p.key_cache = TensorView::contiguous(key_cache, DType::kUInt8,
                                         {S::kBlocks, S::kBlockSize * indexer.entry_bytes}, where);
    p.block_size = S::kBlockSize;
    p.block_table =
        TensorView::contiguous(block_table, DType::kInt32, {S::kRows, S::kMaxBlocks}, where);
    p.num_entries = TensorView::contiguous(counts, DType::kInt32, {S::kRows}, where);
    p.top_k = S::kTopK;
    p.topk_indices =
        TensorView::contiguous(out_indices, DType::kInt32, {S::kRows, S::kTopK}, where);
    p.topk_slots = TensorView::contiguous(out_slots, DType::kInt32, {S::kRows, S::kTopK}, where);
    p.topk_scores =
        TensorView::contiguous(out_scores, DType::kFloat32, {S::kRows, S::kTopK}, where);
    return p;
  }

  dsv4::SparseDecodeParams attention_params(const Device& where, void* pool, void* ring,
                                            void* q_data, void* list, void* ring_list,
                                            void* sink_data, void* out_data, void* lse_data) const {
    dsv4::SparseDecodeParams p;
    p.q = TensorView::contiguous(q_data, DType::kBFloat16, {S::kRows, S::kQueryHeads, 512}, where);
    p.cache = TensorView::contiguous(pool, DType::kUInt8, {S::kBlocks, S::kBlockSize * 584}, where);
    p.block_size = S::kBlockSize;
    p.indices = TensorView::contiguous(list, DType::kInt32, {S::kRows, S::kTopK}, where);
    p.extra_cache =
        TensorView::contiguous(ring, DType::kUInt8, {S::kRows, S::kWindow * 584}, where);
    p.extra_block_size = S::kWindow;
    p.extra_indices =
        TensorView::contiguous(ring_list, DType::kInt32, {S::kRows, S::kWindow}, where);
    p.sink = TensorView::contiguous(sink_data, DType::kFloat32, {S::kQueryHeads}, where);
    p.out =
        TensorView::contiguous(out_data, DType::kBFloat16, {S::kRows, S::kQueryHeads, 512}, where);
    p.lse = TensorView::contiguous(lse_data, DType::kFloat32, {S::kRows, S::kQueryHeads}, where);
    return p;
  }

  void run(cudaStream_t stream) {
    const Device cuda = Device::cuda(0);
    dsv4::StoreEntriesParams store;
    store.values = TensorView::contiguous(values.data(), DType::kFloat32, {S::kRows, 512}, cuda);
    store.slots = TensorView::contiguous(swa_slots.data(), DType::kInt64, {S::kRows}, cuda);
    store.cache =
        TensorView::contiguous(swa.data(), DType::kUInt8, {S::kRows, S::kWindow * 584}, cuda);
    store.block_size = S::kWindow;
    store.invalid_count = TensorView::contiguous(counter.data(), DType::kInt64, {1}, cuda);
    dsv4::store_and_compress(store, compressor(main), compressor(indexer), stream);
    dsv4::index_topk(indexer_params(cuda, indexer.cache.data(), index_q.data(),
                                    index_weights.data(), table.data(), num_entries.data(),
                                    topk_indices.data(), topk_scores.data(), topk_slots.data()),
                     stream);
    dsv4::sparse_decode(
        attention_params(cuda, main.cache.data(), swa.data(), q.data(), topk_slots.data(),
                         swa_indices.data(), sink.data(), out.data(), lse.data()),
        stream);
  }
};

// The host-side inputs of one step.
struct StepInputs {
  std::vector<float> values, main_kv, main_score, index_kv, index_score, index_q, index_weights;
  std::vector<uint16_t> q;
  std::vector<int64_t> positions, state_slots, swa_slots;
  std::vector<int32_t> num_entries, swa_indices;

  void upload(StepBuffers& b) const {
    b.values.upload(values.data(), values.size() * 4);
    b.main.kv.upload(main_kv.data(), main_kv.size() * 4);
    b.main.score.upload(main_score.data(), main_score.size() * 4);
    b.indexer.kv.upload(index_kv.data(), index_kv.size() * 4);
    b.indexer.score.upload(index_score.data(), index_score.size() * 4);
    b.index_q.upload(index_q.data(), index_q.size() * 4);
    b.index_weights.upload(index_weights.data(), index_weights.size() * 4);
    b.q.upload(q.data(), q.size() * 2);
    b.positions.upload(positions.data(), positions.size() * 8);
    b.state_slots.upload(state_slots.data(), state_slots.size() * 8);
    b.swa_slots.upload(swa_slots.data(), swa_slots.size() * 8);
    b.num_entries.upload(num_entries.data(), num_entries.size() * 4);
    b.swa_indices.upload(swa_indices.data(), swa_indices.size() * 4);
  }
};

StepInputs make_step(std::mt19937_64& rng, int64_t step) {
  using S = Step;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto draw = [&](int64_t count, float scale) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v)
      x = scale * normal(rng);
    return v;
  };
  StepInputs in;
  in.values = draw(S::kRows * 512, 1.0f);
  in.main_kv = draw(S::kRows * 1024, 1.0f);
  in.main_score = draw(S::kRows * 1024, 1.0f);
  in.index_kv = draw(S::kRows * 256, 1.0f);
  in.index_score = draw(S::kRows * 256, 1.0f);
  in.index_q = draw(S::kRows * S::kIndexHeads * 128, 1.0f);
  in.index_weights = draw(S::kRows * S::kIndexHeads, 0.1f);
  const std::vector<float> q = draw(S::kRows * S::kQueryHeads * 512, 1.0f);
  in.q.resize(q.size());
  for (size_t i = 0; i < q.size(); ++i)
    in.q[i] = hdk::detail::float_to_bf16(q[i]);
  in.swa_indices.assign(S::kRows * S::kWindow, -1);
  for (int64_t r = 0; r < S::kRows; ++r) {
    const bool live = r < S::kLive;
    in.positions.push_back(step);
    in.state_slots.push_back(live ? r : -1);
    in.swa_slots.push_back(live ? r * S::kWindow + step % S::kWindow : -1);
    // Entries whose window completed at or before this step (this step's own included: the
    // compressor runs before the reads).
    const int64_t entries = live ? (step + 1) / S::kRatio : 0;
    in.num_entries.push_back(static_cast<int32_t>(entries));
    for (int64_t position = std::max<int64_t>(0, step - S::kWindow + 1); live && position <= step;
         ++position) {
      in.swa_indices[r * S::kWindow + position % S::kWindow] =
          static_cast<int32_t>(r * S::kWindow + position % S::kWindow);
    }
  }
  return in;
}

// index_topk's outputs against the float64 reference on the key bytes the graph left: every
// chosen entry's score within the tests' tolerance, nothing better left out, and its slot the
// entry's place through the block table.
void check_index(const StepBuffers& b, const StepInputs& in, int64_t step) {
  using S = Step;
  std::vector<uint8_t> keys = download(b.indexer.cache);
  std::vector<int32_t> table(S::kRows * S::kMaxBlocks), got(S::kRows * S::kTopK);
  std::vector<float> got_scores(got.size());
  std::vector<int32_t> got_slots(got.size());
  b.topk_slots.download(got_slots.data(), got_slots.size() * 4);
  b.table.download(table.data(), table.size() * 4);
  b.topk_indices.download(got.data(), got.size() * 4);
  b.topk_scores.download(got_scores.data(), got_scores.size() * 4);
  std::vector<int32_t> want_indices(got.size()), want_slots(got.size());
  std::vector<float> want_scores(got.size());
  std::vector<float> q = in.index_q, weights = in.index_weights;
  std::vector<int32_t> counts = in.num_entries;
  const dsv4::IndexerReference ref = dsv4::index_topk_reference(
      b.indexer_params(Device::cpu(), keys.data(), q.data(), weights.data(), table.data(),
                       counts.data(), want_indices.data(), want_scores.data(), want_slots.data()));
  for (int64_t n = 0; n < S::kRows; ++n) {
    SCOPED_TRACE("step " + std::to_string(step) + " row " + std::to_string(n));
    const int64_t count = counts[n], kept = std::min<int64_t>(count, S::kTopK);
    std::vector<uint8_t> chosen(static_cast<size_t>(count), 0);
    double lowest = std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < S::kTopK; ++j) {
      const int32_t s = got[n * S::kTopK + j];
      const int32_t slot = got_slots[n * S::kTopK + j];
      if (j >= kept) {
        ASSERT_EQ(s, -1) << "padding at " << j;
        ASSERT_EQ(slot, -1) << "padding at " << j;
        ASSERT_EQ(got_scores[n * S::kTopK + j], -std::numeric_limits<float>::infinity());
        continue;
      }
      ASSERT_TRUE(s >= 0 && s < count) << "index " << s << " at " << j;
      ASSERT_FALSE(chosen[s]) << "index " << s << " twice";
      chosen[s] = 1;
      ASSERT_EQ(slot,
                table[n * S::kMaxBlocks + s / S::kBlockSize] * S::kBlockSize + s % S::kBlockSize)
          << "slot of entry " << s;
      const double tol = 1e-5 * ref.magnitudes[n][s] + 1e-30;
      ASSERT_NEAR(got_scores[n * S::kTopK + j], ref.scores[n][s], tol) << "entry " << s;
      lowest = std::min(lowest, ref.scores[n][s] + tol);
    }
    for (int64_t s = 0; s < count; ++s) {
      if (!chosen[s]) {
        ASSERT_LE(ref.scores[n][s] - 1e-5 * ref.magnitudes[n][s], lowest) << "entry " << s;
      }
    }
  }
}

// sparse_decode's outputs against the float64 reference on the bytes and the list (index_topk's
// slots) the graph left.
void check_attention(const StepBuffers& b, const StepInputs& in, const std::vector<float>& sink,
                     int64_t step) {
  using S = Step;
  std::vector<uint8_t> pool = download(b.main.cache), ring = download(b.swa);
  std::vector<uint16_t> got(S::kRows * S::kQueryHeads * 512), want_out(got.size());
  std::vector<float> got_lse(S::kRows * S::kQueryHeads), want_lse(got_lse.size());
  b.out.download(got.data(), got.size() * 2);
  b.lse.download(got_lse.data(), got_lse.size() * 4);
  std::vector<uint16_t> q = in.q;
  std::vector<int32_t> list(S::kRows * S::kTopK), ring_list = in.swa_indices;
  b.topk_slots.download(list.data(), list.size() * 4);
  std::vector<float> sink_copy = sink;
  const dsv4::SparseDecodeReference ref = dsv4::sparse_decode_reference(
      b.attention_params(Device::cpu(), pool.data(), ring.data(), q.data(), list.data(),
                         ring_list.data(), sink_copy.data(), want_out.data(), want_lse.data()));
  ASSERT_EQ(ref.invalid_rows, 0) << "step " << step;
  for (int64_t n = 0; n < S::kRows; ++n) {
    SCOPED_TRACE("step " + std::to_string(step) + " row " + std::to_string(n));
    const double score_tol = 1e-4 * (1.0 + ref.score_magnitude[n]);
    const double value_tol = score_tol * ref.value_magnitude[n];
    for (int64_t i = 0; i < S::kQueryHeads * 512; ++i) {
      const size_t at = static_cast<size_t>(n * S::kQueryHeads * 512 + i);
      const double value = hdk::detail::bf16_to_float(got[at]);
      ASSERT_LE(std::fabs(value - ref.out[at]),
                std::ldexp(1.0, -8) * std::fabs(ref.out[at]) + value_tol)
          << "value " << i;
    }
    for (int64_t h = 0; h < S::kQueryHeads; ++h) {
      ASSERT_NEAR(got_lse[n * S::kQueryHeads + h], ref.lse[n * S::kQueryHeads + h], score_tol)
          << "lse head " << h;
    }
  }
}
#endif

// The parameter: whether each kernel is launched as a programmatic dependent of the one before
// it (the default), so that the step's calls follow each other with no host synchronization and
// each kernel may start while the previous one finishes; or as plain launches.
class DecodeStepCudaGraph : public ::testing::TestWithParam<bool> {};

TEST_P(DecodeStepCudaGraph, CsaLayerStepReplaysAndMatchesTheReference) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
#ifdef HDK_WITH_CUDA
  struct LaunchModeGuard {
    explicit LaunchModeGuard(bool dependent) { hdk::detail::set_dependent_launch(dependent); }
    ~LaunchModeGuard() { hdk::detail::set_dependent_launch(true); }
  } launch_mode(GetParam());
  using S = Step;
  std::mt19937_64 rng(2026);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  auto draw = [&](int64_t count, float scale) {
    std::vector<float> v(static_cast<size_t>(count));
    for (float& x : v)
      x = scale * normal(rng);
    return v;
  };
  StepBuffers eager, graph;
  const std::vector<float> main_ape = draw(S::kRatio * 1024, 1.0f),
                           index_ape = draw(S::kRatio * 256, 1.0f), main_norm = draw(512, 1.0f),
                           index_norm = draw(128, 1.0f),
                           cos_table = draw(S::kMaxPosition * 32, 1.0f),
                           sin_table = draw(S::kMaxPosition * 32, 1.0f),
                           sink = draw(S::kQueryHeads, 2.0f);
  std::vector<int32_t> table(S::kRows * S::kMaxBlocks);
  for (int64_t i = 0; i < S::kRows * S::kMaxBlocks; ++i)
    table[i] = static_cast<int32_t>(i);  // request r owns pages 4r .. 4r + 3
  for (StepBuffers* b : {&eager, &graph}) {
    b->main.ape.upload(main_ape.data(), main_ape.size() * 4);
    b->indexer.ape.upload(index_ape.data(), index_ape.size() * 4);
    b->main.norm.upload(main_norm.data(), main_norm.size() * 4);
    b->indexer.norm.upload(index_norm.data(), index_norm.size() * 4);
    b->cos_table.upload(cos_table.data(), cos_table.size() * 4);
    b->sin_table.upload(sin_table.data(), sin_table.size() * 4);
    b->sink.upload(sink.data(), sink.size() * 4);
    b->table.upload(table.data(), table.size() * 4);
    b->main.state.fill(0x11);
    b->indexer.state.fill(0x11);
    b->swa.fill(0xee);
    b->main.cache.fill(0xdd);
    b->indexer.cache.fill(0xdd);
    b->counter.fill(0);
    for (DeviceBuffer* output :
         {&b->topk_indices, &b->topk_scores, &b->topk_slots, &b->out, &b->lse})
      output->fill(0xff);
  }
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraphExec_t exec = nullptr;
  const int64_t steps = 40;  // 10 compressed entries per request: top_k 8 pads, then selects
  for (int64_t step = 0; step < steps; ++step) {
    const StepInputs in = make_step(rng, step);
    in.upload(eager);
    in.upload(graph);
    eager.run(stream);
    if (exec == nullptr) {
      check(cudaStreamSynchronize(stream), "sync before capture");
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "begin capture");
      graph.run(stream);
      cudaGraph_t captured = nullptr;
      check(cudaStreamEndCapture(stream, &captured), "end capture");
      check(cudaGraphInstantiate(&exec, captured, 0), "instantiate");
      check(cudaGraphDestroy(captured), "graph destroy");
    }
    check(cudaGraphLaunch(exec, stream), "graph launch");
    check(cudaStreamSynchronize(stream), "sync");
    check_index(graph, in, step);
    check_attention(graph, in, sink, step);
    if (::testing::Test::HasFatalFailure()) break;
  }
  check(cudaGraphExecDestroy(exec), "exec destroy");
  check(cudaStreamDestroy(stream), "stream destroy");
  for (auto pair : {std::make_pair(&eager.swa, &graph.swa),
                    std::make_pair(&eager.main.cache, &graph.main.cache),
                    std::make_pair(&eager.indexer.cache, &graph.indexer.cache),
                    std::make_pair(&eager.main.state, &graph.main.state),
                    std::make_pair(&eager.indexer.state, &graph.indexer.state)}) {
    EXPECT_EQ(download(*pair.first), download(*pair.second)) << "eager and graph caches differ";
  }
  int64_t invalid = 0;
  graph.counter.download(&invalid, 8);
  EXPECT_EQ(invalid, 0);
#endif
}

INSTANTIATE_TEST_SUITE_P(LaunchMode, DecodeStepCudaGraph, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& case_info) {
                           return case_info.param ? "ProgrammaticDependent" : "Plain";
                         });

}  // namespace
}  // namespace testing
}  // namespace hdk
