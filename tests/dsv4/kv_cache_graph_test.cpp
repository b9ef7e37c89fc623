// A decode step's KV writes (store_entries into the SWA ring, compress into a CSA pool) captured
// in a CUDA graph and replayed over a sequence, with new inputs copied into the captured buffers
// before each replay: the graph must leave exactly the bytes (cache and state) the same calls
// leave when run eagerly, and the SWA entries must match the bit-exact reference.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dsv4/kv_cache/reference/kv_cache_reference.h"
#include "hdk/dsv4/kv_cache.h"
#include "support/device_memory.h"
#include "support/kv_cache_case.h"

#ifdef HDK_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace hdk {
namespace testing {
namespace {

#ifdef HDK_WITH_CUDA
void check(cudaError_t status, const char* what) {
  ASSERT_EQ(status, cudaSuccess) << what << ": " << cudaGetErrorString(status);
}

// The buffers one step touches; `eager` and `graph` copies run the same sequence.
struct StepBuffers {
  static constexpr int64_t kRequests = 3, kRatio = 4, kDim = 512, kWidth = 2 * kDim;
  static constexpr int64_t kBlockSize = 4, kBlocks = 12, kMaxBlocks = 4, kMaxPosition = 64;
  DeviceBuffer kv{Backend::kCUDA, kRequests*kWidth * 4},
      score{Backend::kCUDA, kRequests*kWidth * 4}, values{Backend::kCUDA, kRequests * 512 * 4},
      swa_slots{Backend::kCUDA, kRequests * 8}, positions{Backend::kCUDA, kRequests * 8},
      state_slots{Backend::kCUDA, kRequests * 8}, table{Backend::kCUDA, kRequests*kMaxBlocks * 4},
      ape{Backend::kCUDA, kRatio*kWidth * 4}, norm{Backend::kCUDA, kDim * 4},
      cos_table{Backend::kCUDA, kMaxPosition * 32 * 4},
      sin_table{Backend::kCUDA, kMaxPosition * 32 * 4},
      state{Backend::kCUDA, kRequests * 3 * 3 * kDim * 4},
      swa{Backend::kCUDA, kRequests * 128 * 584}, pool{Backend::kCUDA, kBlocks*kBlockSize * 584},
      counter{Backend::kCUDA, 8};

  void run(cudaStream_t stream) {
    const Device cuda = Device::cuda(0);
    dsv4::StoreEntriesParams store;
    store.values = TensorView::contiguous(values.data(), DType::kFloat32, {kRequests, 512}, cuda);
    store.slots = TensorView::contiguous(swa_slots.data(), DType::kInt64, {kRequests}, cuda);
    store.cache = TensorView::contiguous(swa.data(), DType::kUInt8, {kRequests, 128 * 584}, cuda);
    store.block_size = 128;
    store.invalid_count = TensorView::contiguous(counter.data(), DType::kInt64, {1}, cuda);
    dsv4::store_entries(store, stream);
    dsv4::CompressorParams p;
    p.kv = TensorView::contiguous(kv.data(), DType::kFloat32, {kRequests, 1, kWidth}, cuda);
    p.score = TensorView::contiguous(score.data(), DType::kFloat32, {kRequests, 1, kWidth}, cuda);
    p.ape = TensorView::contiguous(ape.data(), DType::kFloat32, {kRatio, kWidth}, cuda);
    p.positions = TensorView::contiguous(positions.data(), DType::kInt64, {kRequests}, cuda);
    p.state_slots = TensorView::contiguous(state_slots.data(), DType::kInt64, {kRequests}, cuda);
    p.state = TensorView::contiguous(state.data(), DType::kFloat32, {kRequests, 3, 3, kDim}, cuda);
    p.norm_weight = TensorView::contiguous(norm.data(), DType::kFloat32, {kDim}, cuda);
    p.rope_cos =
        TensorView::contiguous(cos_table.data(), DType::kFloat32, {kMaxPosition, 32}, cuda);
    p.rope_sin =
        TensorView::contiguous(sin_table.data(), DType::kFloat32, {kMaxPosition, 32}, cuda);
    p.block_table =
        TensorView::contiguous(table.data(), DType::kInt32, {kRequests, kMaxBlocks}, cuda);
    p.cache = TensorView::contiguous(pool.data(), DType::kUInt8, {kBlocks, kBlockSize * 584}, cuda);
    p.block_size = kBlockSize;
    p.ratio = kRatio;
    p.invalid_count = store.invalid_count;
    dsv4::compress(p, stream);
  }
};
#endif

TEST(KvCudaGraph, CapturedStepReplaysLikeEagerCalls) {
  const std::string reason = backend_unavailable_reason(Backend::kCUDA);
  if (!reason.empty()) GTEST_SKIP() << "cuda backend skipped: " << reason;
#ifdef HDK_WITH_CUDA
  using B = StepBuffers;
  std::mt19937_64 rng(12);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  StepBuffers eager, graph;
  std::vector<float> ape(B::kRatio * B::kWidth), norm(B::kDim), cos_table(B::kMaxPosition * 32),
      sin_table(cos_table.size());
  for (auto* v : {&ape, &norm, &cos_table, &sin_table})
    for (auto& x : *v)
      x = normal(rng);
  // Request r uses pages 4r .. 4r+3; padding in the middle row of every other step.
  std::vector<int32_t> table(B::kRequests * B::kMaxBlocks);
  for (int64_t i = 0; i < B::kRequests * B::kMaxBlocks; ++i)
    table[i] = static_cast<int32_t>(i);
  for (StepBuffers* b : {&eager, &graph}) {
    b->ape.upload(ape.data(), ape.size() * 4);
    b->norm.upload(norm.data(), norm.size() * 4);
    b->cos_table.upload(cos_table.data(), cos_table.size() * 4);
    b->sin_table.upload(sin_table.data(), sin_table.size() * 4);
    b->table.upload(table.data(), table.size() * 4);
    b->state.fill(0x11);
    b->swa.fill(0xee);
    b->pool.fill(0xdd);
    b->counter.fill(0);
  }
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaGraphExec_t exec = nullptr;
  std::vector<float> last_values;
  std::vector<int64_t> last_slots;
  const int steps = 40;
  for (int step = 0; step < steps; ++step) {
    std::vector<float> kv(B::kRequests * B::kWidth), score(kv.size()), values(B::kRequests * 512);
    for (auto* v : {&kv, &score, &values})
      for (auto& x : *v)
        x = normal(rng);
    std::vector<int64_t> positions(B::kRequests, step), state_slots = {0, 1, 2}, swa_slots(3);
    if (step % 2) state_slots[1] = -1;
    for (int64_t r = 0; r < B::kRequests; ++r)
      swa_slots[r] = state_slots[r] < 0 ? -1 : r * 128 + step % 128;
    for (StepBuffers* b : {&eager, &graph}) {
      b->kv.upload(kv.data(), kv.size() * 4);
      b->score.upload(score.data(), score.size() * 4);
      b->values.upload(values.data(), values.size() * 4);
      b->positions.upload(positions.data(), positions.size() * 8);
      b->state_slots.upload(state_slots.data(), state_slots.size() * 8);
      b->swa_slots.upload(swa_slots.data(), swa_slots.size() * 8);
    }
    // The odd steps' padded request stays behind: give it the even steps' positions only.
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
    last_values = values;
    last_slots = swa_slots;
  }
  check(cudaGraphExecDestroy(exec), "exec destroy");
  check(cudaStreamDestroy(stream), "stream destroy");

  auto download = [](DeviceBuffer& buffer) {
    std::vector<uint8_t> bytes(buffer.size());
    buffer.download(bytes.data(), bytes.size());
    return bytes;
  };
  EXPECT_EQ(download(eager.pool), download(graph.pool)) << "compressed pool differs";
  EXPECT_EQ(download(eager.state), download(graph.state)) << "compressor state differs";
  const std::vector<uint8_t> swa = download(graph.swa);
  EXPECT_EQ(download(eager.swa), swa) << "SWA ring differs";
  // The graph's last SWA entries against the reference.
  std::vector<uint8_t> want = swa;
  std::vector<uint8_t> slot_bytes = index_bytes(last_slots, DType::kInt64);
  dsv4::StoreEntriesParams host;
  host.values = TensorView::contiguous(last_values.data(), DType::kFloat32, {B::kRequests, 512});
  host.slots = TensorView::contiguous(slot_bytes.data(), DType::kInt64, {B::kRequests});
  host.cache = TensorView::contiguous(want.data(), DType::kUInt8, {B::kRequests, 128 * 584});
  host.block_size = 128;
  dsv4::store_entries_reference(host);
  EXPECT_EQ(want, swa);
  // Entries were written: the pool no longer holds only its fill byte.
  const std::vector<uint8_t> pool = download(graph.pool);
  EXPECT_NE(std::count(pool.begin(), pool.end(), 0xdd), static_cast<long>(pool.size()));
#endif
}

}  // namespace
}  // namespace testing
}  // namespace hdk
